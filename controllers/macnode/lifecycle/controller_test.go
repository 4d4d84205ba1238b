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
	"context"
	"fmt"
	"strings"
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

// heartbeatingNode registers a node and its Lease, renewed now, and lets the controller see it
// (and turn it Ready).
func heartbeatingNode() *v1.MacNode {
	GinkgoHelper()
	n := leasedNode(clk.Now())
	reconcileNode(n)
	return n
}

// leasedNode registers a node and its Lease, last renewed at renewed (by the agent's clock),
// unseen by the controller yet: the node has no Ready condition until the controller writes it.
func leasedNode(renewed time.Time) *v1.MacNode {
	GinkgoHelper()
	seq++
	n := &v1.MacNode{ObjectMeta: objectMeta(fmt.Sprintf("mac-%d", seq))}
	Expect(kube.Create(ctx, n)).To(Succeed())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: lifecycle.LeaseNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(renewed))}}
	Expect(kube.Create(ctx, lease)).To(Succeed())
	return n
}

func renew(n *v1.MacNode) { renewAt(n, clk.Now()) }

// renewAt renews the node's Lease with renewTime at, as an agent whose clock says at does.
func renewAt(n *v1.MacNode, at time.Time) {
	GinkgoHelper()
	lease := &coordinationv1.Lease{}
	Expect(kube.Get(ctx, client.ObjectKey{Namespace: lifecycle.LeaseNamespace, Name: n.Name}, lease)).To(Succeed())
	lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(at))
	Expect(kube.Update(ctx, lease)).To(Succeed())
}

func reconcileNode(n *v1.MacNode) (reconcile.Result, *v1.MacNode) {
	GinkgoHelper()
	return reconcileWith(controller, n)
}

func reconcileWith(c *lifecycle.Controller, n *v1.MacNode) (reconcile.Result, *v1.MacNode) {
	GinkgoHelper()
	res, err := c.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)})
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
			alive := []*v1.MacNode{heartbeatingNode(), heartbeatingNode()} // the rest of the fleet heartbeats
			clk.Step(41 * time.Second)
			reconcileNode(n)
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})).To(Succeed(), "placements stay until the eviction timeout")
			clk.Step(5 * time.Minute)
			for _, a := range alive {
				renew(a)
			}
			reconcileNode(n)
			err := kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the lost node's placement is still there: %v", err)
		})
	})

	Context("when a lost node comes back", func() {
		It("should be the same node, Ready again by its renewed Lease, and left alone", func() {
			n := heartbeatingNode()
			clk.Step(41 * time.Second)
			_, got := reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionUnknown))
			Expect(recorder.Events).To(Receive(ContainSubstring(v1.NodeReasonLeaseExpired)))
			renew(n)
			_, got = reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionTrue))
			Expect(meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady).Reason).To(Equal(v1.NodeReasonLeaseRenewed))
			Expect(recorder.Events).To(Receive(ContainSubstring(v1.NodeReasonLeaseRenewed)))
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

	Context("when the agent's clock is skewed", func() {
		It("should time the heartbeat by its own clock: renewals keep the node Ready, a stopped one expires", func() {
			behind := leasedNode(clk.Now().Add(-time.Hour)) // the agent's clock is an hour slow
			reconcileNode(behind)
			for range 3 {
				clk.Step(20 * time.Second)
				renewAt(behind, clk.Now().Add(-time.Hour))
				_, got := reconcileNode(behind)
				Expect(ready(got)).To(Equal(metav1.ConditionTrue), "a node renewing its Lease on time is alive")
			}
			ahead := leasedNode(clk.Now().Add(time.Hour)) // an hour fast, and then silent
			reconcileNode(ahead)
			clk.Step(41 * time.Second)
			_, got := reconcileNode(ahead)
			Expect(ready(got)).To(Equal(metav1.ConditionUnknown), "a Lease stamped in the future does not keep a silent node alive")
		})
	})

	Context("when the controller restarts", func() {
		It("should give every node a full grace period before judging it", func() {
			n := leasedNode(clk.Now().Add(-10 * time.Minute)) // renewed long ago, by the time the new controller starts
			p := placementOn(n)
			res, got := reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionTrue))
			Expect(res.RequeueAfter).To(Equal(40 * time.Second))
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})).To(Succeed())
			clk.Step(41 * time.Second)
			_, got = reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionUnknown), "a node that is really silent is still found out")
		})
	})

	Context("when the API server was unreachable", func() {
		It("should judge no heartbeat until the agents have had a grace period to renew", func() {
			n := heartbeatingNode()
			p := placementOn(n)
			down := true
			flaky := lifecycle.NewController(clk, flakyClient{Client: kube, down: &down}, recorder)
			reconcileWith(flaky, n)   // the flaky controller sees the renewal now
			clk.Step(6 * time.Minute) // an outage: the agent could not renew
			_, err := flaky.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)})
			Expect(err).To(HaveOccurred())
			down = false
			clk.Step(10 * time.Second)
			res, got := reconcileWith(flaky, n)
			Expect(ready(got)).To(Equal(metav1.ConditionTrue), "judged right after the outage")
			Expect(res.RequeueAfter).To(Equal(30 * time.Second))
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})).To(Succeed(), "evicted right after the outage")
			renew(n) // the agent is back
			_, got = reconcileWith(flaky, n)
			Expect(ready(got)).To(Equal(metav1.ConditionTrue))
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})).To(Succeed())
		})
	})

	Context("when one node's write is refused", func() {
		It("should judge every other node all the same", func() {
			refused, lost := heartbeatingNode(), heartbeatingNode()
			refusing := lifecycle.NewController(clk, refusingClient{Client: kube, name: refused.Name}, recorder)
			reconcileWith(refusing, refused)
			reconcileWith(refusing, lost)
			clk.Step(41 * time.Second) // both Leases lapse
			_, err := refusing.Reconcile(ctx, requestFor(refused))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "the refused node's write fails: %v", err)
			_, got := reconcileWith(refusing, lost)
			Expect(ready(got)).To(Equal(metav1.ConditionUnknown), "another node's refused write says nothing of the API server's reach")
		})
	})
})

// refusingClient refuses the status writes of one node as the API server refuses an invalid
// write (a JSON patch whose test fails answers 422 as well).
type refusingClient struct {
	client.Client
	name string
}

func (r refusingClient) Status() client.SubResourceWriter {
	return refusingStatus{SubResourceWriter: r.Client.Status(), name: r.name}
}

type refusingStatus struct {
	client.SubResourceWriter
	name string
}

func (r refusingStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if obj.GetName() == r.name {
		return apierrors.NewInvalid(v1.GroupVersion.WithKind("MacNode").GroupKind(), r.name, nil)
	}
	return r.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

// flakyClient fails status writes while *down, as an unreachable API server does.
type flakyClient struct {
	client.Client
	down *bool
}

func (f flakyClient) Status() client.SubResourceWriter {
	return flakyStatus{SubResourceWriter: f.Client.Status(), down: f.down}
}

type flakyStatus struct {
	client.SubResourceWriter
	down *bool
}

func (f flakyStatus) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	if *f.down {
		return apierrors.NewServiceUnavailable("the API server is away")
	}
	return f.SubResourceWriter.Patch(ctx, obj, patch, opts...)
}

func requestFor(n *v1.MacNode) reconcile.Request {
	return reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)}
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

var _ = Describe("Placements of a lost node", func() {
	nodeReady := func(p *v1.LanePlacement) *metav1.Condition {
		GinkgoHelper()
		got := &v1.LanePlacement{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
		return meta.FindStatusCondition(got.Status.Conditions, v1.PlacementConditionNodeReady)
	}

	It("should be marked not ready the moment the node goes Unknown, kept, and marked ready again when it is back", func() {
		n := heartbeatingNode()
		p := placementOn(n)
		p.Status.Phase = v1.PhaseReady
		Expect(kube.Status().Update(ctx, p)).To(Succeed())
		reconcileNode(n)
		Expect(nodeReady(p)).To(BeNil(), "a healthy node's placements are not written")

		clk.Step(41 * time.Second)
		_, got := reconcileNode(n)
		Expect(ready(got)).To(Equal(metav1.ConditionUnknown))
		c := nodeReady(p)
		Expect(c).NotTo(BeNil())
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(v1.PlacementReasonNodeUnknown))
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
		Expect(p.DeletionTimestamp).To(BeNil(), "not evicted before the eviction timeout")
		Expect(p.Status.Phase).To(Equal(v1.PhaseReady), "the agent's own report is left as it is")

		renew(n)
		reconcileNode(n)
		Expect(nodeReady(p).Status).To(Equal(metav1.ConditionTrue))
	})
})

var _ = Describe("A restarted lifecycle controller", func() {
	It("should leave a node it finds Unknown as it is, writing nothing and never turning it Ready, until its Lease is renewed", func() {
		n := heartbeatingNode()
		clk.Step(41 * time.Second)
		_, got := reconcileNode(n)
		Expect(ready(got)).To(Equal(metav1.ConditionUnknown))
		before := got.ResourceVersion

		// A new controller (a restart, a new leader) has not seen this node's Lease renewed.
		restarted := lifecycle.NewController(clk, kube, recorder)
		res, got := reconcileWith(restarted, n)
		Expect(ready(got)).To(Equal(metav1.ConditionUnknown), "a dead Mac must not turn Ready on a controller restart")
		Expect(got.ResourceVersion).To(Equal(before), "nothing to change, nothing written")
		Expect(res.RequeueAfter).To(BeNumerically(">", 0), "its eviction is still to come")
		clk.Step(41 * time.Second)
		_, got = reconcileWith(restarted, n)
		Expect(got.ResourceVersion).To(Equal(before), "still nothing written once its grace has passed again")

		renew(n)
		_, got = reconcileWith(restarted, n)
		Expect(ready(got)).To(Equal(metav1.ConditionTrue), "a renewal it saw makes it Ready")
	})
})
