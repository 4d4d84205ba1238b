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
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// sibling creates another identity of the same worker and model (a new revision), in the
// given vector space.
func sibling(of *v1.CertifiedIdentity, space string) *v1.CertifiedIdentity {
	GinkgoHelper()
	id := of.DeepCopy()
	id.ObjectMeta = metav1.ObjectMeta{Name: unique("gte")}
	id.Status = v1.CertifiedIdentityStatus{}
	id.Spec.Model.Revision = "f00d"
	id.Spec.VectorSpaceID = space
	Expect(kube.Create(ctx, id)).To(Succeed())
	observe(id)
	return id
}

// switchToV2 places a one-replica lane of id, moves it to a sibling identity in vector space
// gte-v2, has the new placement report Ready and reconciles once more: the lane switches, and
// the endpoints controller has not followed yet.
func switchToV2(id *v1.CertifiedIdentity) (*v1.CatalogLane, *v1.CertifiedIdentity) {
	GinkgoHelper()
	lane := reconcileLane(newLane(id, 1))
	reportAll(lane, v1.PhaseReady)
	lane = settle(lane)
	next := sibling(id, "gte-v2")
	lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = next.Name })
	lane = reconcileLane(lane)
	reportIdentity(lane, next, v1.PhaseReady)
	lane = reconcileLane(lane)
	Expect(lane.Status.VectorSpaceID).To(Equal("gte-v2"))
	return lane, next
}

// switchedToV2 is switchToV2, then the endpoints controller follows and the lane is reconciled
// again: the old placement drains.
func switchedToV2(id *v1.CertifiedIdentity) (*v1.CatalogLane, *v1.CertifiedIdentity) {
	GinkgoHelper()
	lane, next := switchToV2(id)
	endpointsFollow(lane)
	return reconcileLane(lane), next
}

// nodeLost marks the placement NodeReady=False, as the lifecycle controller does when its
// node's Lease lapses; its phase still reads what its agent last said.
func nodeLost(p v1.LanePlacement) {
	GinkgoHelper()
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(&p), &p)).To(Succeed())
	meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionNodeReady, Status: metav1.ConditionFalse,
		Reason: "NodeLost", Message: "the node's Lease lapsed"})
	Expect(kube.Status().Update(ctx, &p)).To(Succeed())
	observe(&p)
}

// reportIdentity has the agents of the lane's placements of identity id report a phase.
func reportIdentity(l *v1.CatalogLane, id *v1.CertifiedIdentity, phase v1.PlacementPhase) {
	GinkgoHelper()
	for _, p := range placements(l) {
		if p.Spec.Identity == id.Name {
			report(p, phase)
		}
	}
}

// endpointsFollow has the endpoints controller say what it says once the lane's EndpointSlices
// are written for the lane's vector space.
func endpointsFollow(l *v1.CatalogLane) {
	GinkgoHelper()
	got := &v1.CatalogLane{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), got)).To(Succeed())
	Expect(statusapply.ApplyLaneEndpointsSpace(ctx, kube, client.ObjectKeyFromObject(l), got.Status.VectorSpaceID, got.Status.VectorSpaceGeneration)).To(Succeed())
}

// report has the placement's agent report a phase for the placement's latest generation.
func report(p v1.LanePlacement, phase v1.PlacementPhase) {
	GinkgoHelper()
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(&p), &p)).To(Succeed())
	p.Status.Phase, p.Status.ObservedGeneration = phase, p.Generation
	Expect(kube.Status().Update(ctx, &p)).To(Succeed())
	observe(&p)
}

func reportAll(l *v1.CatalogLane, phase v1.PlacementPhase) {
	GinkgoHelper()
	for _, p := range placements(l) {
		report(p, phase)
	}
}

// edit changes the lane's spec and stores it.
func edit(l *v1.CatalogLane, change func(*v1.CatalogLaneSpec)) *v1.CatalogLane {
	GinkgoHelper()
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), l)).To(Succeed())
	change(&l.Spec)
	Expect(kube.Update(ctx, l)).To(Succeed())
	return l
}

// settle reconciles past the status coalescing (progress waits longest).
func settle(l *v1.CatalogLane) *v1.CatalogLane {
	GinkgoHelper()
	clk.Step(placement.ProgressInterval)
	return reconcileLane(l)
}

func condition(l *v1.CatalogLane, typ string) metav1.Condition {
	GinkgoHelper()
	c := meta.FindStatusCondition(l.Status.Conditions, typ)
	Expect(c).NotTo(BeNil(), "condition %s", typ)
	return *c
}

// retired lets the agent finish retiring the lane's deleted placements: their finalizers go.
func retired(l *v1.CatalogLane) {
	GinkgoHelper()
	var list v1.LanePlacementList
	Expect(kube.List(ctx, &list, client.InNamespace(l.Namespace), client.MatchingLabels{v1.LabelLane: l.Name})).To(Succeed())
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp.IsZero() {
			continue
		}
		p.Finalizers = nil
		Expect(kube.Update(ctx, p)).To(Succeed())
		controller.Gone(p)
	}
}

var _ = Describe("Lane edits", func() {
	Context("when deadlines and bounds change", func() {
		It("should write them onto the placements, the worker's a node at a time, and move observedGeneration only once the agents report them", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 2))
			reportAll(lane, v1.PhaseReady)
			lane = settle(lane)
			Expect(lane.Status.ObservedGeneration).To(Equal(lane.Generation))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonRolloutComplete))

			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.RequestDeadlineSeconds, s.Ceiling = 10, ptr.To[int32](256) })
			lane = reconcileLane(lane)
			got := placements(lane)
			ceilings := map[int32]int{}
			for _, p := range got {
				Expect(p.Spec.RequestDeadlineSeconds).To(BeEquivalentTo(10), "the front door's fields go onto every placement at once")
				ceilings[p.Spec.Ceiling]++
			}
			Expect(ceilings).To(Equal(map[int32]int{256: 1, 512: 1}), "the worker's fields go a node at a time")
			Expect(lane.Status.ObservedGeneration).To(BeNumerically("<", lane.Generation))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonApplyingEdits))

			for _, p := range got {
				if p.Spec.Ceiling == 256 {
					report(p, v1.PhaseReady)
				}
			}
			lane = settle(lane)
			for _, p := range placements(lane) {
				Expect(p.Spec.Ceiling).To(BeEquivalentTo(256))
			}
			Expect(lane.Status.ObservedGeneration).To(BeNumerically("<", lane.Generation), "one agent has not reported the edit yet")

			reportAll(lane, v1.PhaseReady)
			lane = settle(lane)
			Expect(lane.Status.ObservedGeneration).To(Equal(lane.Generation))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonRolloutComplete))
		})
	})

	Context("when a rung the prewarm policy names is added to the ladder", func() {
		It("should roll the new ladder out as new placements and never write the rung onto the old ones", func() {
			id := newIdentity()
			a, b := newNode(), newNode()
			policy := &v1.PrewarmPolicy{ObjectMeta: metav1.ObjectMeta{Name: unique("prewarm"), Namespace: "default"},
				Spec: v1.PrewarmPolicySpec{Rungs: []v1.Rung{512, 1024}, LaneSelector: metav1.LabelSelector{MatchLabels: map[string]string{"prewarm": "none"}}}}
			Expect(kube.Create(ctx, policy)).To(Succeed())
			DeferCleanup(func() { Expect(kube.Delete(ctx, policy)).To(Succeed()) })
			lane := newLane(id, 1)
			lane = edit(lane, func(s *v1.CatalogLaneSpec) {
				s.PrewarmPolicyRef = &v1.LocalObjectReference{Name: policy.Name}
				s.NodeSelector = map[string]string{"pool": "search"}
			})
			lane = reconcileLane(lane)
			old := placements(lane)
			Expect(old).To(HaveLen(1))
			var first string
			for n := range old {
				first = n
			}
			Expect(old[first].Spec.PrewarmRungs).To(Equal([]v1.Rung{512}))
			reportAll(lane, v1.PhaseReady)

			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.Rungs = []v1.Rung{128, 256, 512, 1024} })
			lane = reconcileLane(lane) // no 422: the old placement keeps its own ladder's prewarm
			got := placements(lane)
			Expect(got).To(HaveLen(2), "the new ladder's placement comes up beside the old")
			Expect(got[first].Spec.Rungs).To(Equal([]v1.Rung{128, 256, 512}))
			Expect(got[first].Spec.PrewarmRungs).To(Equal([]v1.Rung{512}))
			second := a.Name
			if first == a.Name {
				second = b.Name
			}
			Expect(got[second].Spec.Rungs).To(Equal([]v1.Rung{128, 256, 512, 1024}))
			Expect(got[second].Spec.PrewarmRungs).To(Equal([]v1.Rung{512, 1024}))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonRollingUpdate))
			Expect(lane.Status.ObservedGeneration).To(BeNumerically("<", lane.Generation))

			report(got[second], v1.PhaseReady)
			lane = settle(lane)
			Expect(placements(lane)).To(HaveLen(1))
			Expect(placements(lane)).To(HaveKey(second), "the old ladder's placement retired once the new one was ready")
			Expect(lane.Status.ObservedGeneration).To(Equal(lane.Generation))
			Expect(lane.Status.UpdatedReplicas).To(BeEquivalentTo(1))
		})
	})

	Context("when the identity changes within one vector space and there is no spare node", func() {
		It("should replace the placements a node at a time within maxUnavailable", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 2))
			reportAll(lane, v1.PhaseReady)
			next := sibling(id, id.Spec.VectorSpaceID)
			lane = edit(lane, func(s *v1.CatalogLaneSpec) {
				s.IdentityRef.Name = next.Name
				s.Rollout = v1.RolloutStrategy{MaxSurge: ptr.To[int32](0), MaxUnavailable: 1}
			})
			lane = reconcileLane(lane)
			Expect(placements(lane)).To(HaveLen(1), "one old placement retires")
			lane = reconcileLane(lane)
			Expect(placements(lane)).To(HaveLen(1), "and no other until it is gone and replaced")

			for step := 0; step < 2; step++ {
				retired(lane)
				lane = reconcileLane(lane)
				got := placements(lane)
				Expect(got).To(HaveLen(2))
				fresh := 0
				for _, p := range got {
					if p.Spec.Identity == next.Name {
						fresh++
						report(p, v1.PhaseReady)
					}
				}
				Expect(fresh).To(Equal(step + 1))
				lane = reconcileLane(lane)
			}
			lane = settle(lane)
			for _, p := range placements(lane) {
				Expect(p.Spec.Identity).To(Equal(next.Name))
			}
			Expect(lane.Status.ObservedGeneration).To(Equal(lane.Generation))
			Expect(lane.Status.VectorSpaceID).To(Equal(id.Spec.VectorSpaceID))
		})
	})

	Context("when the identity changes within one vector space and a node was lost", func() {
		It("should count the lost node's placement as not serving, whatever it last said, and replace it first", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 2))
			reportAll(lane, v1.PhaseReady)
			// Of the two nodes, the last by name (the one a rollout would otherwise come to
			// last) loses its Lease: the lifecycle controller marks its placement
			// NodeReady=False, and its phase still reads Ready.
			var lost, kept v1.LanePlacement
			for _, p := range placements(lane) {
				if lost.Name == "" || p.Spec.Node > lost.Spec.Node {
					lost, kept = p, lost
				} else {
					kept = p
				}
			}
			nodeLost(lost)
			next := sibling(id, id.Spec.VectorSpaceID)
			lane = edit(lane, func(s *v1.CatalogLaneSpec) {
				s.IdentityRef.Name = next.Name
				s.Rollout = v1.RolloutStrategy{MaxSurge: ptr.To[int32](0), MaxUnavailable: 1}
			})
			lane = reconcileLane(lane)
			got := placements(lane)
			Expect(got).To(HaveKey(kept.Spec.Node), "the placement that serves stays")
			Expect(got).NotTo(HaveKey(lost.Spec.Node), "the lost node's placement goes first: %v", got)
		})
	})

	Context("when the identity moves to another vector space", func() {
		It("should bring the new space up beside the old, switch the lane's space once, then retire the old once they drained", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 1))
			reportAll(lane, v1.PhaseReady)
			lane = settle(lane)
			Expect(lane.Status.VectorSpaceID).To(Equal("gte"))
			next := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = next.Name })

			lane = reconcileLane(lane)
			got := placements(lane)
			Expect(got).To(HaveLen(2))
			Expect(lane.Status.VectorSpaceID).To(Equal("gte"), "the old space answers until the new is ready")
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonBlueGreen))
			var fresh v1.LanePlacement
			for _, p := range got {
				if p.Spec.Identity == next.Name {
					fresh = p
				}
			}
			Expect(fresh.Spec.VectorSpaceID).To(Equal("gte-v2"))

			report(fresh, v1.PhaseReady)
			lane = reconcileLane(lane)
			Expect(lane.Status.VectorSpaceID).To(Equal("gte-v2"), "switched in one write")
			Expect(placements(lane)).To(HaveLen(2), "the old retire only once the switch is written")
			// However long the endpoints controller takes to follow, the old stay: the slices
			// may still send clients to them.
			for range 4 {
				clk.Step(placement.SwitchDrain)
				lane = reconcileLane(lane)
			}
			Expect(placements(lane)).To(HaveLen(2), "the old stay while the lane's EndpointSlices may list them")
			Expect(condition(lane, v1.LaneConditionProgressing).Message).To(ContainSubstring("status.endpointsVectorSpaceGeneration"))
			// Once the slices list the new space alone, the old keep answering clients that act
			// on the slice they saw before, for SwitchDrain, on the controller's clock.
			endpointsFollow(lane)
			res, err := controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.RequeueAfter).To(Equal(placement.SwitchDrain), "the lane comes back when the drain ends")
			Expect(placements(lane)).To(HaveLen(2), "the old drain before they retire")
			clk.Step(placement.SwitchDrain - time.Millisecond)
			res, err = controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.RequeueAfter).To(Equal(time.Millisecond), "the lane comes back when the drain ends")
			Expect(placements(lane)).To(HaveLen(2), "the old drain until SwitchDrain has passed")
			clk.Step(time.Millisecond)
			lane = reconcileLane(lane)
			Expect(placements(lane)).To(HaveLen(1))
			Expect(placements(lane)).To(HaveKey(fresh.Spec.Node))
			lane = settle(lane)
			Expect(lane.Status.ObservedGeneration).To(Equal(lane.Generation))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonRolloutComplete))
		})

		It("should never write the old space back from a cache that has not seen the switch yet", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane, _ := switchedToV2(id)
			generation := lane.Status.ObservedGeneration
			// Reads show the lane as it was before the switch: old space, older generation.
			staleLane = func(l *v1.CatalogLane) { l.Status.VectorSpaceID, l.Status.ObservedGeneration = "gte", generation-1 }
			for range 3 {
				clk.Step(placement.ProgressInterval)
				reconcileLane(lane)
			}
			staleLane = nil
			got := &v1.CatalogLane{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
			Expect(got.Status.VectorSpaceID).To(Equal("gte-v2"))
			Expect(got.Status.ObservedGeneration).To(BeNumerically(">=", generation))
		})

		It("should keep the new space's placements, rolled back before the endpoints followed the switch, until the endpoints follow the rollback and they drained", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane, _ := switchToV2(id)
			Expect(lane.Status.VectorSpaceGeneration).To(BeEquivalentTo(1))
			// Rolled back before the endpoints controller followed the switch: the old space's
			// placements are still Ready, so the lane switches straight back.
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = id.Name })
			lane = reconcileLane(lane)
			Expect(lane.Status.VectorSpaceID).To(Equal("gte"))
			Expect(lane.Status.VectorSpaceGeneration).To(BeEquivalentTo(2))
			// The endpoints controller last recorded gte, before either switch, and lags: it may
			// have written slices listing gte-v2 since, so that placement stays, however long
			// it takes (a record of the space alone, gte, would read as followed).
			Expect(statusapply.ApplyLaneEndpointsSpace(ctx, kube, client.ObjectKeyFromObject(lane), "gte", 0)).To(Succeed())
			for range 4 {
				clk.Step(placement.SwitchDrain)
				lane = reconcileLane(lane)
			}
			Expect(placements(lane)).To(HaveLen(2), "the slices may still list the rolled-back space")
			endpointsFollow(lane)
			lane = reconcileLane(lane)
			Expect(placements(lane)).To(HaveLen(2), "it drains first")
			clk.Step(placement.SwitchDrain)
			lane = reconcileLane(lane)
			Expect(placements(lane)).To(HaveLen(1))
			for _, p := range placements(lane) {
				Expect(p.Spec.Identity).To(Equal(id.Name))
			}
		})

		It("should count a switch past any generation the endpoints followed, so that a count read stale never reads as followed", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 1))
			reportAll(lane, v1.PhaseReady)
			lane = settle(lane)
			// The endpoints once followed a switch this lane's status no longer counts (its
			// count was written back from a stale read).
			Expect(statusapply.ApplyLaneEndpointsSpace(ctx, kube, client.ObjectKeyFromObject(lane), "gte-v2", 1)).To(Succeed())
			next := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = next.Name })
			lane = reconcileLane(lane)
			reportIdentity(lane, next, v1.PhaseReady)
			lane = reconcileLane(lane)
			Expect(lane.Status.VectorSpaceID).To(Equal("gte-v2"))
			Expect(lane.Status.VectorSpaceGeneration).To(BeEquivalentTo(2))
			for range 3 {
				clk.Step(placement.SwitchDrain)
				lane = reconcileLane(lane)
			}
			Expect(placements(lane)).To(HaveLen(2), "the endpoints have not followed this switch")
		})

		It("should drain the old space of every switch anew, never go on from an earlier switch's drain", func() {
			id := newIdentity()
			newNode()
			newNode()
			newNode()
			lane, next := switchedToV2(id) // the endpoints followed; gte's drain runs from now
			// The lane moves on to a third space: gte's placement goes once drained, making
			// room; the third's comes up, and the lane switches once it is Ready.
			third := sibling(id, "gte-v3")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = third.Name })
			clk.Step(placement.SwitchDrain)
			lane = reconcileLane(lane)
			retired(lane)
			lane = reconcileLane(lane)
			reportIdentity(lane, third, v1.PhaseReady)
			lane = reconcileLane(lane)
			Expect(lane.Status.VectorSpaceID).To(Equal("gte-v3"))
			Expect(lane.Status.VectorSpaceGeneration).To(BeEquivalentTo(2))
			endpointsFollow(lane)
			// gte-v2's placement drains from when the slices followed this switch, not from the
			// first switch's drain, which is long over.
			lane = reconcileLane(lane)
			clk.Step(placement.SwitchDrain - time.Millisecond)
			lane = reconcileLane(lane)
			identities := func() []string {
				var out []string
				for _, p := range placements(lane) {
					out = append(out, p.Spec.Identity)
				}
				slices.Sort(out)
				return out
			}
			Expect(identities()).To(ConsistOf(next.Name, third.Name), "gte-v2 drains first")
			clk.Step(time.Millisecond)
			lane = reconcileLane(lane)
			Expect(identities()).To(Equal([]string{third.Name}))
		})

		It("should not retire the old space's placements the slices may still list when the lane is edited to a third space before the endpoints followed", func() {
			id := newIdentity()
			newNode()
			newNode()
			newNode()
			lane, _ := switchToV2(id)
			third := sibling(id, "gte-v3")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = third.Name })
			for range 3 {
				clk.Step(placement.SwitchDrain)
				lane = reconcileLane(lane)
			}
			kept := false
			for _, p := range placements(lane) {
				kept = kept || p.Spec.Identity == id.Name
			}
			Expect(kept).To(BeTrue(), "gte's placement goes only once the slices list gte-v2 alone: %v", placements(lane))
			endpointsFollow(lane)
			lane = reconcileLane(lane)
			clk.Step(placement.SwitchDrain)
			lane = reconcileLane(lane)
			for _, p := range placements(lane) {
				Expect(p.Spec.Identity).NotTo(Equal(id.Name))
			}
		})

		It("should not retire the new space's placements when the lane is edited again within that space during the drain", func() {
			id := newIdentity()
			newNode()
			newNode()
			newNode()
			lane, next := switchedToV2(id)

			// Within the drain, another identity of the same new space (a new macOS build's).
			again := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = again.Name })
			lane = reconcileLane(lane)
			clk.Step(placement.SwitchDrain)
			lane = reconcileLane(lane)
			served := false
			for _, p := range placements(lane) {
				if p.Spec.Identity == next.Name {
					served = true
				}
			}
			Expect(served).To(BeTrue(), "the ready placement of the new space is kept until its replacement serves: %v", placements(lane))
		})

		It("should drain the old space anew, never retire it at once, when a restarted controller finds the switch written", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane, _ := switchedToV2(id)
			clk.Step(placement.SwitchDrain) // the old controller's drain would be over

			// A new controller (a restart, a new leader) knows nothing of when the switch was written.
			restarted := placement.NewController(clk, kube, recorder)
			// It learns the fleet as its informers would: every object once.
			var nodes v1.MacNodeList
			var ps v1.LanePlacementList
			var ids v1.CertifiedIdentityList
			Expect(kube.List(ctx, &nodes)).To(Succeed())
			Expect(kube.List(ctx, &ps)).To(Succeed())
			Expect(kube.List(ctx, &ids)).To(Succeed())
			for i := range nodes.Items {
				restarted.Observe(&nodes.Items[i])
			}
			for i := range ps.Items {
				restarted.Observe(&ps.Items[i])
			}
			for i := range ids.Items {
				restarted.Observe(&ids.Items[i])
			}
			key := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)}
			res, err := restarted.Reconcile(ctx, key)
			Expect(err).NotTo(HaveOccurred())
			Expect(placements(lane)).To(HaveLen(2), "the old drain from when the switch is seen")
			Expect(res.RequeueAfter).To(Equal(placement.SwitchDrain))
			clk.Step(placement.SwitchDrain)
			_, err = restarted.Reconcile(ctx, key)
			Expect(err).NotTo(HaveOccurred())
			Expect(placements(lane)).To(HaveLen(1))
		})

		It("should not switch to the new space on a placement whose node was lost, Ready as it last said", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 1))
			reportAll(lane, v1.PhaseReady)
			lane = settle(lane)
			next := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = next.Name })
			lane = reconcileLane(lane)
			for _, p := range placements(lane) {
				if p.Spec.Identity == next.Name {
					report(p, v1.PhaseReady)
					// The lifecycle controller marks it as its node's Lease lapses.
					nodeLost(p)
				}
			}
			lane = reconcileLane(lane)
			Expect(lane.Status.VectorSpaceID).To(Equal("gte"), "a lost node's placement can be no endpoint of the new space")
		})

		It("should neither make nor retire a placement and say what to set when its bounds leave no room to switch", func() {
			id := newIdentity()
			for range 3 {
				newNode()
			}
			lane := reconcileLane(newLane(id, 3))
			reportAll(lane, v1.PhaseReady)
			lane = settle(lane)
			next := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) {
				s.IdentityRef.Name = next.Name
				s.Rollout = v1.RolloutStrategy{MaxSurge: ptr.To[int32](0), MaxUnavailable: 1} // no spare node
			})
			lane = reconcileLane(lane)
			got := placements(lane)
			Expect(got).To(HaveLen(3))
			for _, p := range got {
				Expect(p.Spec.Identity).To(Equal(id.Name), "no old placement retires for a switch that cannot come")
			}
			progressing := condition(lane, v1.LaneConditionProgressing)
			Expect(progressing.Status).To(Equal(metav1.ConditionFalse))
			Expect(progressing.Reason).To(Equal(v1.LaneReasonBoundsTooTight))
			Expect(progressing.Message).To(ContainSubstring("set rollout.maxSurge to at least 1 or rollout.maxUnavailable to at least 2"))
			Expect(lane.Status.VectorSpaceID).To(Equal("gte"))

			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.Rollout.MaxUnavailable = 2 })
			lane = reconcileLane(lane)
			Expect(placements(lane)).To(HaveLen(2), "one old placement makes room, two keep answering")
			retired(lane) // its agent lets go of its node
			lane = reconcileLane(lane)
			got = placements(lane)
			Expect(got).To(HaveLen(3))
			fresh := 0
			for _, p := range got {
				if p.Spec.Identity == next.Name {
					fresh++
				}
			}
			Expect(fresh).To(Equal(1), "the new space comes up in the room made")
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonBlueGreen))
		})

		It("should say the rollout exceeded its progress deadline once it has not moved for it, on the controller's clock, and progress again when it moves", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 1))
			reportAll(lane, v1.PhaseReady)
			lane = settle(lane)
			next := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = next.Name; s.Rollout.ProgressDeadlineSeconds = 120 })
			res, err := controller.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
			Expect(res.RequeueAfter).To(BeNumerically(">", 0))
			Expect(res.RequeueAfter).To(BeNumerically("<=", 120*time.Second), "the lane comes back when its deadline passes")
			lane = reconcileLane(lane)
			Expect(placements(lane)).To(HaveLen(2))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonBlueGreen))
			Expect(lane.Status.LastProgressTime).NotTo(BeNil())

			clk.Step(119 * time.Second)
			lane = reconcileLane(lane)
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonBlueGreen))
			clk.Step(time.Second)
			lane = reconcileLane(lane)
			progressing := condition(lane, v1.LaneConditionProgressing)
			Expect(progressing.Status).To(Equal(metav1.ConditionFalse))
			Expect(progressing.Reason).To(Equal(v1.LaneReasonProgressDeadlineExceeded))
			Expect(progressing.Message).To(ContainSubstring("rollout.progressDeadlineSeconds (120 s)"))
			Expect(placements(lane)).To(HaveLen(2), "the rollout goes on")

			reportIdentity(lane, next, v1.PhaseReady)
			lane = reconcileLane(lane)
			Expect(lane.Status.VectorSpaceID).To(Equal("gte-v2"))
			Expect(condition(lane, v1.LaneConditionProgressing).Status).To(Equal(metav1.ConditionTrue))
		})

		It("should keep the old space answering and say why when the new cannot be placed beside it", func() {
			id := newIdentity()
			n := newNode()
			lane := reconcileLane(newLane(id, 1))
			reportAll(lane, v1.PhaseReady)
			next := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = next.Name })
			lane = settle(lane)
			Expect(placements(lane)).To(HaveKey(n.Name))
			Expect(placements(lane)[n.Name].Spec.Identity).To(Equal(id.Name))
			Expect(lane.Status.VectorSpaceID).To(Equal("gte"))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonNewPlacementsUnplaceable))
			Expect(condition(lane, v1.LaneConditionPlaced).Status).To(Equal(metav1.ConditionTrue))
			Expect(meta.IsStatusConditionTrue(lane.Status.Conditions, v1.ConditionReady)).To(BeTrue())
		})

		It("should keep the old space answering and say why when the new placements fail", func() {
			id := newIdentity()
			newNode()
			newNode()
			lane := reconcileLane(newLane(id, 1))
			reportAll(lane, v1.PhaseReady)
			next := sibling(id, "gte-v2")
			lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = next.Name })
			lane = reconcileLane(lane)
			reportIdentity(lane, next, v1.PhaseFailed)
			lane = settle(lane)
			Expect(placements(lane)).To(HaveLen(2))
			Expect(lane.Status.VectorSpaceID).To(Equal("gte"))
			Expect(condition(lane, v1.LaneConditionProgressing).Reason).To(Equal(v1.LaneReasonNewPlacementsFailed))
		})
	})
})

var _ = Describe("Expectations", func() {
	It("should delete exactly the intended replica when a stale status update arrives before the deletion event", func() {
		id := newIdentity()
		newNode()
		newNode()
		newNode()
		lane := reconcileLane(newLane(id, 3))
		before := placements(lane)
		lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.Replicas = 2 })
		lane = reconcileLane(lane)
		after := placements(lane)
		Expect(after).To(HaveLen(2))
		for node, p := range before {
			if _, kept := after[node]; !kept {
				stale := p.DeepCopy() // as the informer had it: no deletion timestamp
				stale.Status.Phase = v1.PhaseReady
				observe(stale)
			}
		}
		lane = reconcileLane(lane)
		Expect(placements(lane)).To(Equal(after))
	})

	It("should remove the placement on an unhealthy node first when scaling down", func() {
		id := newIdentity()
		a, b := newNode(), newNode()
		lane := reconcileLane(newLane(id, 2))
		reportAll(lane, v1.PhaseReady) // the placements last said Ready, both
		a.Status.Conditions[0].Status = metav1.ConditionUnknown
		a.Status.Conditions[0].Reason = v1.NodeReasonLeaseExpired
		Expect(kube.Status().Update(ctx, a)).To(Succeed())
		observe(a)
		lane = edit(lane, func(s *v1.CatalogLaneSpec) { s.Replicas = 1 })
		Expect(placements(reconcileLane(lane))).To(HaveKey(b.Name))
	})

	It("should not count a placement of the same name that is being deleted as placed", func() {
		id := newIdentity()
		n := newNode()
		lane := newLane(id, 1)
		// A placement of the name this lane would use, being deleted, that the controller's
		// cache has not shown it.
		p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: placement.PlacementName(lane.Name, n.Name), Namespace: lane.Namespace,
			Labels: map[string]string{v1.LabelLane: lane.Name, v1.LabelNode: n.Name}, Finalizers: []string{v1.FinalizerRetirement}},
			Spec: v1.LanePlacementSpec{Lane: lane.Name, Node: n.Name, Identity: id.Name, Task: v1.TaskEmbed, Device: v1.DeviceANE,
				Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, p)).To(Succeed())
		Expect(kube.Delete(ctx, p)).To(Succeed())
		lane = reconcileLane(lane)
		Expect(lane.Status.Replicas).To(BeZero())
		Expect(condition(lane, v1.LaneConditionPlaced).Status).To(Equal(metav1.ConditionFalse))
	})
})
