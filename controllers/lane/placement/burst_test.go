/*
Copyright 2026 The Synapse Fleet Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package placement_test

import (
	"context"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
)

// The defect this pins, as a new user met it under make dev: eight single-replica lanes applied
// at once all went to the first node by name, about 200 layer executables wanted of its 100,
// because each placement counted only what the agents had reported.
var _ = Describe("Placement under the manager", func() {
	Context("when a burst of lanes is applied at once, before any agent reports", func() {
		It("should spread them over the nodes and charge no node past its budget", func() {
			mgrCtx, stop := context.WithCancel(ctx)
			mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"},
				Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
			Expect(err).NotTo(HaveOccurred())
			Expect(placement.NewController(clock.RealClock{}, mgr.GetClient(), mgr.GetEventRecorder("test")).Register(mgrCtx, mgr)).To(Succeed())
			done := make(chan struct{})
			go func() {
				defer GinkgoRecover()
				defer close(done)
				Expect(mgr.Start(mgrCtx)).To(Succeed())
			}()
			DeferCleanup(func() { stop(); <-done })

			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: unique("burst")}}
			Expect(kube.Create(ctx, ns)).To(Succeed())
			id := newIdentity() // 22 layers: four shapes fit a budget of 100
			a, b := newNode(), newNode()
			var lanes []*v1.CatalogLane
			for range 8 {
				l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: unique("lane"), Namespace: ns.Name},
					Spec: v1.CatalogLaneSpec{Model: "gte-modernbert-base", Task: v1.TaskEmbed, Device: v1.DeviceANE,
						IdentityRef: v1.LocalObjectReference{Name: id.Name}, Rungs: []v1.Rung{128, 256, 512}, Replicas: 1,
						AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
				Expect(kube.Create(ctx, l)).To(Succeed())
				lanes = append(lanes, l)
			}
			count := map[string]int{}
			Eventually(func(g Gomega) {
				clear(count)
				for _, l := range lanes {
					got := &v1.CatalogLane{}
					g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), got)).To(Succeed())
					g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.LaneConditionPlaced)).To(BeTrue())
					g.Expect(got.Status.Nodes).To(HaveLen(1))
					count[got.Status.Nodes[0]]++
				}
			}).WithTimeout(30 * time.Second).Should(Succeed())
			Expect(count).To(Equal(map[string]int{a.Name: 4, b.Name: 4}), "4 shapes of 22 layers on each, 88 of 100")

			// A ninth finds no room, and says so.
			ninth := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: unique("lane"), Namespace: ns.Name}, Spec: lanes[0].Spec}
			Expect(kube.Create(ctx, ninth)).To(Succeed())
			Eventually(func(g Gomega) {
				got := &v1.CatalogLane{}
				g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(ninth), got)).To(Succeed())
				g.Expect(placedReason(got)).To(Equal(v1.LaneReasonBudgetFull))
			}).WithTimeout(30 * time.Second).Should(Succeed())

			// One lane scales to zero; once its agent has retired the placement, the freed budget
			// takes the ninth, with no other event.
			first := &v1.CatalogLane{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(lanes[0]), first)).To(Succeed())
			first.Spec.Replicas = 0
			Expect(kube.Update(ctx, first)).To(Succeed())
			Eventually(func(g Gomega) {
				var ps v1.LanePlacementList
				g.Expect(kube.List(ctx, &ps, client.InNamespace(ns.Name), client.MatchingLabels{v1.LabelLane: first.Name})).To(Succeed())
				g.Expect(ps.Items).To(HaveLen(1))
				g.Expect(ps.Items[0].DeletionTimestamp).NotTo(BeNil())
				ps.Items[0].Finalizers = nil // as its agent does once the worker has exited
				g.Expect(kube.Update(ctx, &ps.Items[0])).To(Succeed())
			}).WithTimeout(30 * time.Second).Should(Succeed())
			Eventually(func(g Gomega) {
				got := &v1.CatalogLane{}
				g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(ninth), got)).To(Succeed())
				g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.LaneConditionPlaced)).To(BeTrue())
			}).WithTimeout(30 * time.Second).Should(Succeed())
		})
	})
})
