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

package lifecycle_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
)

var seq int

func objectMeta(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

// heartbeatingNode registers a Ready node and its Lease, renewed now.
func heartbeatingNode() *v1.MacNode {
	GinkgoHelper()
	seq++
	n := &v1.MacNode{ObjectMeta: objectMeta(fmt.Sprintf("mac-%d", seq))}
	Expect(kube.Create(ctx, n)).To(Succeed())
	n.Status.Conditions = []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAgentReady,
		LastTransitionTime: metav1.NewTime(clk.Now())}}
	Expect(kube.Status().Update(ctx, n)).To(Succeed())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: lifecycle.LeaseNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(clk.Now()))}}
	Expect(kube.Create(ctx, lease)).To(Succeed())
	return n
}

func renew(n *v1.MacNode) {
	GinkgoHelper()
	lease := &coordinationv1.Lease{}
	Expect(kube.Get(ctx, client.ObjectKey{Namespace: lifecycle.LeaseNamespace, Name: n.Name}, lease)).To(Succeed())
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(clk.Now()))
	Expect(kube.Update(ctx, lease)).To(Succeed())
}

func reconcileNode(n *v1.MacNode) (reconcile.Result, *v1.MacNode) {
	GinkgoHelper()
	res, err := controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)})
	Expect(err).NotTo(HaveOccurred())
	out := &v1.MacNode{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(n), out)).To(Succeed())
	return res, out
}

func ready(n *v1.MacNode) metav1.ConditionStatus {
	return meta.FindStatusCondition(n.Status.Conditions, v1.ConditionReady).Status
}

func placementOn(n *v1.MacNode) *v1.LanePlacement {
	GinkgoHelper()
	p := &v1.LanePlacement{
		ObjectMeta: metav1.ObjectMeta{Name: "lane-" + n.Name, Namespace: "default", Labels: map[string]string{v1.LabelNode: n.Name, v1.LabelLane: "lane"},
			Finalizers: []string{v1.FinalizerRetirement}},
		Spec: v1.LanePlacementSpec{Lane: "lane", Node: n.Name, Identity: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30},
	}
	Expect(kube.Create(ctx, p)).To(Succeed())
	return p
}

var _ = Describe("Node lifecycle", func() {
	It("should keep a heartbeating node Ready and look again when its Lease would expire", func() {
		n := heartbeatingNode()
		clk.Step(10 * time.Second)
		res, got := reconcileNode(n)
		Expect(ready(got)).To(Equal(metav1.ConditionTrue))
		Expect(res.RequeueAfter).To(Equal(30 * time.Second))
	})

	Context("when the Lease is older than the 40 s grace period", func() {
		It("should turn the node Unknown and say why", func() {
			n := heartbeatingNode()
			clk.Step(41 * time.Second)
			res, got := reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionUnknown))
			Expect(meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady).Reason).To(Equal(v1.NodeReasonLeaseExpired))
			Expect(res.RequeueAfter).To(Equal(5*time.Minute - time.Second))
			Expect(recorder.Events).To(Receive(ContainSubstring(v1.NodeReasonLeaseExpired)))
		})
	})

	Context("when the node stays lost past the 5 min eviction timeout", func() {
		It("should force its placements away and say so", func() {
			n := heartbeatingNode()
			p := placementOn(n)
			clk.Step(41 * time.Second)
			reconcileNode(n)
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})).To(Succeed(), "placements stay until the eviction timeout")
			clk.Step(5 * time.Minute)
			reconcileNode(n)
			err := kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the lost node's placement is still there: %v", err)
		})
	})

	Context("when a lost node comes back", func() {
		It("should be the same node, Ready again by its agent, and left alone", func() {
			n := heartbeatingNode()
			clk.Step(41 * time.Second)
			_, got := reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionUnknown))
			renew(n)
			meta.SetStatusCondition(&got.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue,
				Reason: v1.NodeReasonAgentReady, LastTransitionTime: metav1.NewTime(clk.Now())})
			Expect(kube.Status().Update(ctx, got)).To(Succeed())
			_, got = reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionTrue))
			var nodes v1.MacNodeList
			Expect(kube.List(ctx, &nodes)).To(Succeed())
			count := 0
			for _, m := range nodes.Items {
				if m.Name == n.Name {
					count++
				}
			}
			Expect(count).To(Equal(1))
		})
	})
})
