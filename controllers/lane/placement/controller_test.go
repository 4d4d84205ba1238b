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
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

const build = v1.MacOSBuild("25B78")

var (
	seq int
	// workerDigest is each spec's own worker binary, so that specs sharing one API server
	// never match each other's nodes.
	workerDigest v1.Sha256Digest
)

var _ = BeforeEach(func() {
	seq++
	workerDigest = v1.Sha256Digest(fmt.Sprintf("sha256:%064x", seq))
})

// unique makes names unique across specs that share one API server.
func unique(prefix string) string {
	seq++
	return fmt.Sprintf("%s-%d", prefix, seq)
}

func newIdentity() *v1.CertifiedIdentity {
	GinkgoHelper()
	id := &v1.CertifiedIdentity{
		ObjectMeta: metav1.ObjectMeta{Name: unique("gte")},
		Spec: v1.CertifiedIdentitySpec{
			Worker: v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: workerDigest, ProtocolVersion: 3, Backend: v1.BackendSim},
			Model: v1.ModelIdentity{Name: "gte-modernbert-base", Revision: "e7f32e3", Layers: 22, HiddenSize: 768, EmbeddingDimensions: 768,
				CheckpointDigest: "sha256:0d3b4c1f8e2a7b6c5d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"},
			ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: "sha256:9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"},
			MacOSBuild:       build,
			VectorSpaceID:    "gte",
		},
	}
	Expect(kube.Create(ctx, id)).To(Succeed())
	observe(id)
	return id
}

// observe1 hands a copy of one object to the controller, as its informers would (it keeps what
// it is given, which the test goes on to change), and returns the lanes it enqueues.
func observe1(o client.Object) []reconcile.Request {
	return controller.Observe(o.DeepCopyObject().(client.Object))
}

// observe hands copies of objects to the controller.
func observe(objs ...client.Object) {
	for _, o := range objs {
		observe1(o)
	}
}

// newNode registers a Ready MacNode the way an agent does; mutate adjusts it first.
func newNode(mutate ...func(*v1.MacNode)) *v1.MacNode {
	GinkgoHelper()
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: unique("mac"), Labels: map[string]string{"pool": "search"}}}
	n.Status = v1.MacNodeStatus{
		Platform: v1.Platform{Chip: "M4", MacOSBuild: build},
		Worker:   v1.NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: workerDigest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Capacity: v1.ExecutableBudget{LayerExecutables: 100, ShapeSlots: 16},
		Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed,
			LastTransitionTime: metav1.NewTime(clk.Now())}},
	}
	for _, m := range mutate {
		m(n)
	}
	status := n.Status
	Expect(kube.Create(ctx, n)).To(Succeed()) // the status subresource ignores status here
	n.Status = status
	Expect(kube.Status().Update(ctx, n)).To(Succeed())
	observe(n)
	return n
}

func newLane(identity *v1.CertifiedIdentity, replicas int32) *v1.CatalogLane {
	GinkgoHelper()
	return newLaneNamed(unique("lane"), identity, replicas)
}

func newLaneNamed(name string, identity *v1.CertifiedIdentity, replicas int32) *v1.CatalogLane {
	GinkgoHelper()
	l := &v1.CatalogLane{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.CatalogLaneSpec{Model: "gte-modernbert-base", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			IdentityRef: v1.LocalObjectReference{Name: identity.Name}, Rungs: []v1.Rung{128, 256, 512}, Replicas: replicas,
			NodeSelector: map[string]string{"pool": "search"}, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30},
	}
	Expect(kube.Create(ctx, l)).To(Succeed())
	return l
}

// reconcileLane runs the controller once, synchronously, and returns the lane as stored.
func reconcileLane(l *v1.CatalogLane) *v1.CatalogLane {
	GinkgoHelper()
	_, err := controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(l)})
	Expect(err).NotTo(HaveOccurred())
	out := &v1.CatalogLane{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), out)).To(Succeed())
	return out
}

// reportPhase writes a placement's phase as its agent does, hands it to the controller as its
// informer would, and lets StatusInterval pass.
func reportPhase(p *v1.LanePlacement, phase v1.PlacementPhase) {
	GinkgoHelper()
	p.Status.Phase, p.Status.ObservedGeneration = phase, p.Generation
	Expect(kube.Status().Update(ctx, p)).To(Succeed())
	observe(p)
	clk.Step(placement.StatusInterval)
}

// placements lists the lane's live placements by node.
func placements(l *v1.CatalogLane) map[string]v1.LanePlacement {
	GinkgoHelper()
	var list v1.LanePlacementList
	Expect(kube.List(ctx, &list, client.InNamespace(l.Namespace), client.MatchingLabels{v1.LabelLane: l.Name})).To(Succeed())
	out := map[string]v1.LanePlacement{}
	for _, p := range list.Items {
		if p.DeletionTimestamp.IsZero() {
			out[p.Spec.Node] = p
		}
	}
	return out
}

func placedReason(l *v1.CatalogLane) string {
	c := meta.FindStatusCondition(l.Status.Conditions, v1.LaneConditionPlaced)
	if c == nil {
		return ""
	}
	return c.Reason
}

var _ = Describe("Placement", func() {
	It("should place each replica on its own matching, ready node, bound and labelled for its agent", func() {
		id := newIdentity()
		a, b := newNode(), newNode()
		lane := reconcileLane(newLane(id, 2))
		got := placements(lane)
		Expect(got).To(HaveLen(2))
		Expect(got).To(HaveKey(a.Name))
		Expect(got).To(HaveKey(b.Name))
		p := got[a.Name]
		Expect(p.Labels).To(HaveKeyWithValue(v1.LabelNode, a.Name))
		Expect(p.Finalizers).To(ContainElement(v1.FinalizerRetirement))
		Expect(p.Spec.Identity).To(Equal(id.Name))
		Expect(p.Spec.Ceiling).To(BeEquivalentTo(512))
		Expect(metav1.IsControlledBy(&p, lane)).To(BeTrue())
		Expect(placedReason(lane)).To(Equal(v1.LaneReasonPlaced))
		Expect(lane.Status.Replicas).To(BeEquivalentTo(2))
	})

	It("should count its decisions and expose unplaceable lanes as metrics", func() {
		before := testutil.ToFloat64(metrics.PlacementDecisions.WithLabelValues("placed"))
		id := newIdentity()
		newNode()
		reconcileLane(newLane(id, 1))
		Expect(testutil.ToFloat64(metrics.PlacementDecisions.WithLabelValues("placed"))).To(Equal(before + 1))

		stuck := reconcileLane(newLane(id, 3))
		Expect(testutil.ToFloat64(metrics.UnplaceableLanes.WithLabelValues("default", stuck.Name, placedReason(stuck)))).To(Equal(1.0))
	})

	Context("when a node runs another macOS build", func() {
		It("should not place the lane there and should say why", func() {
			id := newIdentity()
			newNode(func(n *v1.MacNode) { n.Status.Platform.MacOSBuild = "25C56" })
			lane := reconcileLane(newLane(id, 1))
			Expect(placements(lane)).To(BeEmpty())
			Expect(placedReason(lane)).To(Equal(v1.LaneReasonNoMatchingNode))
			Expect(meta.FindStatusCondition(lane.Status.Conditions, v1.LaneConditionPlaced).Message).To(ContainSubstring("macOS 25B78"))
		})
	})

	Context("when no node matches the selector", func() {
		It("should say the selector matches nothing", func() {
			id := newIdentity()
			newNode(func(n *v1.MacNode) { n.Labels = nil })
			lane := reconcileLane(newLane(id, 1))
			Expect(placedReason(lane)).To(Equal(v1.LaneReasonSelectorMatchesNothing))
		})
	})

	Context("when the matching node's budget is full", func() {
		It("should say the budget is full, counting the placements already made there", func() {
			id := newIdentity()
			n := newNode(func(n *v1.MacNode) { n.Status.Capacity.LayerExecutables = 30 })
			Expect(placements(reconcileLane(newLane(id, 1)))).To(HaveKey(n.Name))
			lane := reconcileLane(newLane(id, 1))
			Expect(placements(lane)).To(BeEmpty())
			Expect(placedReason(lane)).To(Equal(v1.LaneReasonBudgetFull))
			Expect(meta.FindStatusCondition(lane.Status.Conditions, v1.LaneConditionPlaced).Message).To(ContainSubstring("22 free layer executables"))
		})

		It("should not count what the agent reports allocated: prewarmed shapes give way to a new lane's first", func() {
			id := newIdentity()
			n := newNode(func(n *v1.MacNode) { n.Status.Allocated.LayerExecutables = 90 })
			Expect(placements(reconcileLane(newLane(id, 1)))).To(HaveKey(n.Name))
		})
	})

	Context("when lanes are placed one after another before any agent reports", func() {
		It("should spread them and never charge a node past its budget", func() {
			id := newIdentity()
			a, b := newNode(), newNode()
			count := map[string]int{}
			for range 8 {
				for node := range placements(reconcileLane(newLane(id, 1))) {
					count[node]++
				}
			}
			Expect(count).To(Equal(map[string]int{a.Name: 4, b.Name: 4}))
			full := reconcileLane(newLane(id, 1))
			Expect(placements(full)).To(BeEmpty(), "4 shapes of 22 layers fill a budget of 100")
			Expect(placedReason(full)).To(Equal(v1.LaneReasonBudgetFull))
		})
	})

	Context("when the identity does not exist", func() {
		It("should say so", func() {
			lane := reconcileLane(newLane(&v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "missing"}}, 1))
			Expect(placedReason(lane)).To(Equal(v1.LaneReasonIdentityNotFound))
		})
	})

	It("should prefer, among the least charged nodes, one whose aned already holds the lane's rungs", func() {
		id := newIdentity()
		newNode()
		warm := newNode(func(n *v1.MacNode) {
			n.Status.Allocated.LayerExecutables = 50 // prewarmed shapes: not a charge
			n.Status.CachedRungs = []v1.CachedRungs{{Identity: id.Name, Rungs: []v1.Rung{128, 256}}}
		})
		lane := reconcileLane(newLane(id, 1))
		Expect(placements(lane)).To(HaveKey(warm.Name))

		// The warm node now holds a lane; the next goes to the cold one, which is less charged.
		Expect(placements(reconcileLane(newLane(id, 1)))).NotTo(HaveKey(warm.Name))
	})

	It("should place two lanes whose names joined with their nodes' read alike (lane ca-b on node m, lane ca on node b-m)", func() {
		id := newIdentity()
		prefix, suffix := unique("ca"), unique("")
		m := newNode(func(n *v1.MacNode) { n.Name, n.Labels = "m"+suffix, map[string]string{"pool": "m"} })
		bm := newNode(func(n *v1.MacNode) { n.Name, n.Labels = "b-m"+suffix, map[string]string{"pool": "b-m"} })
		first := newLaneNamed(prefix+"-b", id, 1)
		first = edit(first, func(s *v1.CatalogLaneSpec) { s.NodeSelector = map[string]string{"pool": "m"} })
		second := newLaneNamed(prefix, id, 1)
		second = edit(second, func(s *v1.CatalogLaneSpec) { s.NodeSelector = map[string]string{"pool": "b-m"} })
		first, second = reconcileLane(first), reconcileLane(second)
		Expect(placements(first)).To(HaveKey(m.Name))
		Expect(placements(second)).To(HaveKey(bm.Name))
		Expect(placedReason(first)).To(Equal(v1.LaneReasonPlaced))
		Expect(placedReason(second)).To(Equal(v1.LaneReasonPlaced))
	})

	It("should count as ready only the placements on Ready nodes, and be woken by a node's Ready turning either way", func() {
		id := newIdentity()
		a := newNode()
		newNode()
		lane := reconcileLane(newLane(id, 2))
		reportAll(lane, v1.PhaseReady)
		lane = settle(lane)
		Expect(lane.Status.ReadyReplicas).To(BeEquivalentTo(2))
		Expect(condition(lane, v1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))

		setNodeReady := func(status metav1.ConditionStatus, reason string) {
			GinkgoHelper()
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(a), a)).To(Succeed())
			meta.SetStatusCondition(&a.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: status, Reason: reason})
			Expect(kube.Status().Update(ctx, a)).To(Succeed())
			Expect(observe1(a)).To(ContainElement(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)}), "the node's lanes are woken")
		}
		setNodeReady(metav1.ConditionUnknown, v1.NodeReasonLeaseExpired) // its Lease lapsed; its placement still says Ready
		lane = settle(lane)
		Expect(lane.Status.ReadyReplicas).To(BeEquivalentTo(1))
		Expect(condition(lane, v1.ConditionReady).Status).To(Equal(metav1.ConditionFalse))

		setNodeReady(metav1.ConditionTrue, v1.NodeReasonLeaseRenewed)
		lane = settle(lane)
		Expect(lane.Status.ReadyReplicas).To(BeEquivalentTo(2))
		Expect(condition(lane, v1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
	})

	It("should keep a cordoned node's placement and put no new one there", func() {
		id := newIdentity()
		n := newNode()
		lane := newLane(id, 1)
		reconcileLane(lane)
		n.Spec.Unschedulable = true
		Expect(kube.Update(ctx, n)).To(Succeed())
		observe(n)
		Expect(placements(reconcileLane(lane))).To(HaveKey(n.Name))

		lane = reconcileLane(lane)
		lane.Spec.Replicas = 2
		Expect(kube.Update(ctx, lane)).To(Succeed())
		lane = reconcileLane(lane)
		Expect(placements(lane)).To(HaveLen(1))
		Expect(placedReason(lane)).To(Equal(v1.LaneReasonNotEnoughNodes))
	})

	It("should scale down by deleting placements, which the retirement finalizer keeps until the agent lets go", func() {
		id := newIdentity()
		newNode()
		newNode()
		lane := reconcileLane(newLane(id, 2))
		lane.Spec.Replicas = 1
		Expect(kube.Update(ctx, lane)).To(Succeed())
		lane = reconcileLane(lane)
		Expect(placements(lane)).To(HaveLen(1))
		Expect(lane.Status.Replicas).To(BeEquivalentTo(1))
		var all v1.LanePlacementList
		Expect(kube.List(ctx, &all, client.MatchingLabels{v1.LabelLane: lane.Name})).To(Succeed())
		Expect(all.Items).To(HaveLen(2), "the deleted placement waits for its finalizer")
	})

	It("should keep a retiring placement's budget charged until it is gone, then place a waiting lane there", func() {
		id := newIdentity()
		n := newNode(func(n *v1.MacNode) { n.Status.Capacity.LayerExecutables = 30 })
		first := reconcileLane(newLane(id, 1))
		retiring := placements(first)[n.Name]
		first.Spec.Replicas = 0
		Expect(kube.Update(ctx, first)).To(Succeed())
		Expect(placements(reconcileLane(first))).To(BeEmpty())

		waiting := reconcileLane(newLane(id, 1))
		Expect(placedReason(waiting)).To(Equal(v1.LaneReasonBudgetFull), "the retiring lane's worker still holds its shape")

		// The agent has retired it: the finalizer goes, and so does the placement.
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(&retiring), &retiring)).To(Succeed())
		retiring.Finalizers = nil
		Expect(kube.Update(ctx, &retiring)).To(Succeed())
		Expect(controller.Gone(&retiring)).To(ContainElement(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(waiting)}),
			"the freed budget enqueues the lane waiting for it")
		Expect(placements(reconcileLane(waiting))).To(HaveKey(n.Name))
	})

	It("should retire the placement of a node whose macOS build changed and place the lane elsewhere", func() {
		id := newIdentity()
		first := newNode()
		lane := reconcileLane(newLane(id, 1))
		Expect(placements(lane)).To(HaveKey(first.Name))
		first.Status.Platform.MacOSBuild = "25C56"
		Expect(kube.Status().Update(ctx, first)).To(Succeed())
		Expect(observe1(first)).To(ContainElement(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)}),
			"a node that stops matching enqueues the lanes placed on it")
		second := newNode()
		lane = reconcileLane(lane)
		Expect(placements(lane)).To(HaveKey(second.Name))
		Expect(placements(lane)).NotTo(HaveKey(first.Name))
	})

	It("should carry the resolved prewarm rungs, and follow a policy that changes", func() {
		id := newIdentity()
		n := newNode()
		lane := reconcileLane(newLane(id, 1))
		Expect(placements(lane)[n.Name].Spec.PrewarmRungs).To(Equal([]v1.Rung{128, 256, 512}), "the default")
		policy := &v1.PrewarmPolicy{ObjectMeta: metav1.ObjectMeta{Name: unique("prewarm"), Namespace: "default"},
			Spec: v1.PrewarmPolicySpec{Rungs: []v1.Rung{256, 1024}}}
		lane.Spec.PrewarmPolicyRef = &v1.LocalObjectReference{Name: policy.Name}
		Expect(kube.Create(ctx, policy)).To(Succeed())
		DeferCleanup(func() { Expect(kube.Delete(ctx, policy)).To(Succeed()) }) // it selects every lane of the namespace
		Expect(kube.Update(ctx, lane)).To(Succeed())
		lane = reconcileLane(lane)
		Expect(placements(lane)[n.Name].Spec.PrewarmRungs).To(Equal([]v1.Rung{256}), "only rungs of the ladder")
	})

	It("should write its replicas' quick succession of phases as one status write, and what it decided at once", func() {
		id := newIdentity()
		n := newNode()
		lane := reconcileLane(newLane(id, 1))
		Expect(lane.Status.Nodes).To(Equal([]string{n.Name}), "the placement is written at once")

		// The agent reports Compiling, then Ready, within a second: progress waits longer than
		// a turn of the Ready condition, and both become one write.
		p := placements(lane)[n.Name]
		for _, step := range []struct {
			phase v1.PlacementPhase
			wait  time.Duration
		}{{v1.PhaseCompiling, placement.ProgressInterval}, {v1.PhaseReady, placement.StatusInterval}} {
			p.Status.Phase, p.Status.ObservedGeneration = step.phase, p.Generation
			Expect(kube.Status().Update(ctx, &p)).To(Succeed())
			observe(&p)
			before := writes.Load()
			res, err := controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.RequeueAfter).To(Equal(step.wait), "%s is coalesced with what comes next", step.phase)
			Expect(writes.Load()).To(Equal(before))
		}
		clk.Step(placement.StatusInterval)
		before := writes.Load()
		lane = reconcileLane(lane)
		Expect(writes.Load()).To(Equal(before+1), "one write for both phases")
		Expect(lane.Status.ReadyReplicas).To(BeEquivalentTo(1))
		Expect(lane.Status.CompilingReplicas).To(BeZero())
		Expect(meta.IsStatusConditionTrue(lane.Status.Conditions, v1.ConditionReady)).To(BeTrue())
	})

	It("should write a replica's progress that does not turn Ready once ProgressInterval has passed", func() {
		id := newIdentity()
		n := newNode()
		lane := reconcileLane(newLane(id, 1))
		p := placements(lane)[n.Name]
		p.Status.Phase, p.Status.ObservedGeneration = v1.PhaseCompiling, p.Generation
		Expect(kube.Status().Update(ctx, &p)).To(Succeed())
		observe(&p)
		clk.Step(placement.ProgressInterval - time.Millisecond)
		before := writes.Load()
		res, err := controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
		Expect(err).NotTo(HaveOccurred())
		Expect(res.RequeueAfter).To(Equal(time.Millisecond))
		Expect(writes.Load()).To(Equal(before), "not yet")
		clk.Step(time.Millisecond)
		lane = reconcileLane(lane)
		Expect(writes.Load()).To(Equal(before + 1))
		Expect(lane.Status.CompilingReplicas).To(BeEquivalentTo(1))
		Expect(meta.FindStatusCondition(lane.Status.Conditions, v1.ConditionReady).Reason).To(Equal("Compiling"))
	})

	It("should write the lane's status without erasing the endpoints controller's ServiceReady, even from a cache that does not show it yet", func() {
		id := newIdentity()
		n := newNode()
		lane := reconcileLane(newLane(id, 1))
		serviceReady := metav1.Condition{Type: v1.LaneConditionServiceReady, Status: metav1.ConditionTrue, Reason: v1.LaneReasonServiceReady,
			Message: "the Service is the controller's", LastTransitionTime: metav1.NewTime(clk.Now())}
		_, err := statusapply.ApplyLaneCondition(ctx, kube, client.ObjectKeyFromObject(lane),
			statusapply.Manager(statusapply.LaneEndpointsManager, v1.LaneConditionServiceReady), serviceReady)
		Expect(err).NotTo(HaveOccurred())

		// A placement controller whose reads miss that write, as an informer a moment behind.
		stale := placement.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				if err := c.Get(ctx, key, obj, opts...); err != nil {
					return err
				}
				if l, ok := obj.(*v1.CatalogLane); ok {
					meta.RemoveStatusCondition(&l.Status.Conditions, v1.LaneConditionServiceReady)
				}
				return nil
			},
		}), recorder)
		p := placements(lane)[n.Name]
		p.Status.Phase, p.Status.ObservedGeneration = v1.PhaseReady, p.Generation
		Expect(kube.Status().Update(ctx, &p)).To(Succeed())
		for _, o := range []client.Object{n, id, &p} {
			stale.Observe(o.DeepCopyObject().(client.Object))
		}
		clk.Step(placement.ProgressInterval)
		before := writes.Load()
		_, err = stale.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
		Expect(err).NotTo(HaveOccurred())
		Expect(writes.Load()).To(Equal(before+1), "the Ready replica is written")
		got := &v1.CatalogLane{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
		Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady)).To(BeTrue())
		Expect(meta.FindStatusCondition(got.Status.Conditions, v1.LaneConditionServiceReady)).NotTo(BeNil(), "the endpoints controller's condition stays")
	})

	It("should replace a lane's status written by merge patch under another manager, as before an upgrade, nothing of it kept", func() {
		id := newIdentity()
		n := newNode()
		lane := newLane(id, 1)
		// The status as an older controller wrote it, by merge patch: two nodes, one of them gone.
		stored := lane.DeepCopy()
		lane.Status.Nodes, lane.Status.Replicas, lane.Status.ReadyReplicas = []string{"mac-gone", n.Name}, 2, 2
		Expect(kube.Status().Patch(ctx, lane, client.MergeFrom(stored), client.FieldOwner("synapse-controller"))).To(Succeed())
		lane = reconcileLane(lane)
		Expect(lane.Status.Nodes).To(Equal([]string{n.Name}))
		Expect(lane.Status.Replicas).To(BeEquivalentTo(1))
		Expect(lane.Status.ReadyReplicas).To(BeZero())
		before := writes.Load()
		reconcileLane(lane)
		Expect(writes.Load()).To(Equal(before), "a resync with nothing to change writes nothing")
	})

	It("should write the lane's status from a cache behind its last write, when the placements return to what that cache shows", func() {
		id := newIdentity()
		n := newNode()
		lane := reconcileLane(newLane(id, 1))
		p := placements(lane)[n.Name]
		report := func(phase v1.PlacementPhase) { reportPhase(&p, phase) }
		report(v1.PhaseReady)
		lane = reconcileLane(lane)
		Expect(lane.Status.ReadyReplicas).To(BeEquivalentTo(1))
		ready := lane.DeepCopy()
		// The node's agent stops (its placement is Pending) and is back a moment later
		// (Ready): the pass for Ready runs right after the write for Pending, before the cache
		// shows that write, so the cache still shows the lane Ready. The lane's own status
		// events do not bring it back (LaneChanges): a write skipped now is never made.
		report(v1.PhasePending)
		lane = reconcileLane(lane)
		Expect(lane.Status.ReadyReplicas).To(BeZero())
		report(v1.PhaseReady)
		staleLane = func(l *v1.CatalogLane) { ready.DeepCopyInto(l) }
		reconcileLane(lane)
		staleLane = nil
		got := &v1.CatalogLane{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
		Expect(got.Status.ReadyReplicas).To(BeEquivalentTo(1))
		Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady)).To(BeTrue())

		// A cache that has caught up, showing what was written, writes nothing more.
		before := writes.Load()
		reconcileLane(lane)
		Expect(writes.Load()).To(Equal(before))
	})

	It("should write the lane's status again after a write that failed, whatever the cache shows", func() {
		id := newIdentity()
		n := newNode()
		lane := reconcileLane(newLane(id, 1))
		p := placements(lane)[n.Name]
		report := func(phase v1.PlacementPhase) { reportPhase(&p, phase) }
		report(v1.PhaseReady)
		lane = reconcileLane(lane)
		ready := lane.DeepCopy()
		// The write of the Pending count lands, but its answer is lost: the controller cannot
		// tell, from the error or from a cache that shows the lane as it was, what the lane holds.
		report(v1.PhasePending)
		lostAnswers.Store(1)
		_, err := controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
		Expect(err).To(HaveOccurred())
		got := &v1.CatalogLane{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
		Expect(got.Status.ReadyReplicas).To(BeZero(), "the write landed")
		// Ready again, read from a cache that still shows the lane Ready, as it was last written
		// with an answer: the pass writes.
		report(v1.PhaseReady)
		staleLane = func(l *v1.CatalogLane) { ready.DeepCopyInto(l) }
		reconcileLane(lane)
		staleLane = nil
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
		Expect(got.Status.ReadyReplicas).To(BeEquivalentTo(1))

		before := writes.Load()
		reconcileLane(lane)
		Expect(writes.Load()).To(Equal(before), "a write answered settles it")
	})

	It("should write nothing on a resync with nothing to change", func() {
		id := newIdentity()
		newNode()
		lane := reconcileLane(newLane(id, 1))
		reconcileLane(lane)
		before := writes.Load()
		reconcileLane(lane)
		Expect(writes.Load()).To(Equal(before))
	})
})
