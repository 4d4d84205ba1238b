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

package prewarm_test

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/prewarm"
)

var _ = Describe("Prewarm policies", func() {
	It("should count the lanes a policy wins and report the conflict on the one that loses", func() {
		for _, name := range []string{"alpha", "zeta"} {
			Expect(kube.Create(ctx, &v1.PrewarmPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
				Spec: v1.PrewarmPolicySpec{LaneSelector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "search"}}, Rungs: []v1.Rung{128}}})).To(Succeed())
		}
		Expect(kube.Create(ctx, &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "gte", Namespace: "default", Labels: map[string]string{"tier": "search"}},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
				Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}})).To(Succeed())

		ctl := prewarm.NewController(clocktesting.NewFakeClock(time.Now()), kube)
		status := func(name string) v1.PrewarmPolicyStatus {
			GinkgoHelper()
			key := client.ObjectKey{Namespace: "default", Name: name}
			_, err := ctl.Reconcile(ctx, reconcile.Request{NamespacedName: key})
			Expect(err).NotTo(HaveOccurred())
			p := &v1.PrewarmPolicy{}
			Expect(kube.Get(ctx, key, p)).To(Succeed())
			return p.Status
		}
		alpha, zeta := status("alpha"), status("zeta")
		Expect(alpha.SelectedLanes).To(BeEquivalentTo(1))
		Expect(meta.IsStatusConditionFalse(alpha.Conditions, v1.PrewarmConditionConflict)).To(BeTrue())
		Expect(zeta.SelectedLanes).To(BeEquivalentTo(0))
		c := meta.FindStatusCondition(zeta.Conditions, v1.PrewarmConditionConflict)
		Expect(c.Status).To(Equal(metav1.ConditionTrue))
		Expect(c.Message).To(ContainSubstring("alpha:[gte]"))
	})
})
