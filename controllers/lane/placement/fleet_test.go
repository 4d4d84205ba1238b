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

package placement

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

const digest = v1.Sha256Digest("sha256:00000000000000000000000000000000000000000000000000000000000000aa")

func testIdentity(name string, layers int32) *v1.CertifiedIdentity {
	return &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.CertifiedIdentitySpec{
		Worker:     v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Model:      v1.ModelIdentity{Name: name, Layers: layers},
		MacOSBuild: "25B78"}}
}

func testNode(name string, mutate ...func(*v1.MacNode)) *v1.MacNode {
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "a"}},
		Status: v1.MacNodeStatus{
			Platform:   v1.Platform{MacOSBuild: "25B78"},
			Worker:     v1.NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
			Capacity:   v1.ExecutableBudget{LayerExecutables: 100},
			Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed}}}}
	for _, m := range mutate {
		m(n)
	}
	return n
}

func testLane(name string, id *v1.CertifiedIdentity, selector map[string]string) *v1.CatalogLane {
	return &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec: v1.CatalogLaneSpec{IdentityRef: v1.LocalObjectReference{Name: id.Name}, Rungs: []v1.Rung{128}, Replicas: 1, NodeSelector: selector}}
}

func testPlacement(lane, node string, id *v1.CertifiedIdentity) *v1.LanePlacement {
	return &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: placementName(lane, node), Namespace: "ns", Generation: 1},
		Spec: v1.LanePlacementSpec{Lane: lane, Node: node, Identity: id.Name}}
}

func lanes(reqs []reconcile.Request) []string {
	var out []string
	for _, r := range reqs {
		out = append(out, r.Name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func reserveOne(f *fleet, lane *v1.CatalogLane, id *v1.CertifiedIdentity) outcome {
	key := types.NamespacedName{Namespace: lane.Namespace, Name: lane.Name}
	_, on := f.lanePlacements(key)
	return f.reserve(request{lane: key, id: id, selector: lane.Spec.NodeSelector, rungs: lane.Spec.Rungs, want: 1, taken: on},
		func(node string) *v1.LanePlacement { return testPlacement(lane.Name, node, id) })
}

// A node event enqueues the lanes placed on it when what identities match on changes or its
// Ready condition turns (their ready counts and rollouts read it), and the waiting lanes that
// can now fit on it; nothing for the agents' frequent reports.
func TestNodeEventsEnqueueOnlyTheLanesTheyCanAffect(t *testing.T) {
	id := testIdentity("gte", 22)
	other := testIdentity("other", 22)
	other.Spec.MacOSBuild = "25C56"
	for name, tc := range map[string]struct {
		change func(*v1.MacNode)
		want   []string
	}{
		"nothing":           {func(*v1.MacNode) {}, nil},
		"compile queue":     {func(n *v1.MacNode) { n.Status.CompileQueue.Length = 3 }, nil},
		"addresses":         {func(n *v1.MacNode) { n.Status.Addresses = []v1.NodeAddress{{Address: "10.0.0.2"}} }, nil},
		"allocated":         {func(n *v1.MacNode) { n.Status.Allocated.LayerExecutables = 88 }, nil},
		"cached rungs":      {func(n *v1.MacNode) { n.Status.CachedRungs = []v1.CachedRungs{{Identity: "gte", Rungs: []v1.Rung{128}}} }, nil},
		"ready message":     {func(n *v1.MacNode) { n.Status.Conditions[0].Message = "still fine" }, nil},
		"ready lost":        {func(n *v1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionUnknown }, []string{"filler", "placed"}},
		"cordoned":          {func(n *v1.MacNode) { n.Spec.Unschedulable = true }, nil},
		"label out of pool": {func(n *v1.MacNode) { n.Labels["pool"] = "b" }, nil},
		"label added":       {func(n *v1.MacNode) { n.Labels["zone"] = "1" }, []string{"waiting"}},
		"capacity grown":    {func(n *v1.MacNode) { n.Status.Capacity.LayerExecutables = 100 }, []string{"waiting"}},
		"macOS build":       {func(n *v1.MacNode) { n.Status.Platform.MacOSBuild = "25C56" }, []string{"filler", "placed", "waiting-other"}},
		"worker":            {func(n *v1.MacNode) { n.Status.Worker.BinaryDigest = "sha256:ab" }, []string{"filler", "placed"}},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFleet(clocktesting.NewFakeClock(time.Now()))
			// mac-1 holds "placed" and "filler" and has room for one more shape of 22.
			n := testNode("mac-1", func(n *v1.MacNode) { n.Status.Capacity.LayerExecutables = 66 })
			f.observeNode(n)
			f.observeIdentity(id)
			f.observePlacement(testPlacement("placed", "mac-1", id))
			f.observePlacement(testPlacement("filler", "mac-1", id))
			f.observeLane(testLane("placed", id, nil), id, false, 0)
			f.observeLane(testLane("waiting", id, map[string]string{"pool": "a"}), id, true, 0)
			f.observeLane(testLane("waiting-other", other, nil), other, true, 0)
			changed := n.DeepCopy()
			tc.change(changed)
			if got := lanes(f.observeNode(changed)); !slices.Equal(got, tc.want) {
				t.Errorf("enqueued %v, want %v", got, tc.want)
			}
		})
	}
}

func TestANodeBackInServiceEnqueuesTheWaitingLanesThatFit(t *testing.T) {
	f := newFleet(clocktesting.NewFakeClock(time.Now()))
	small, big := testIdentity("small", 10), testIdentity("big", 95)
	down := testNode("mac-1", func(n *v1.MacNode) { n.Spec.Unschedulable = true })
	f.observeNode(down)
	f.observeIdentity(small)
	f.observePlacement(testPlacement("resident", "mac-1", small))
	f.observeLane(testLane("fits", small, nil), small, true, 0)
	f.observeLane(testLane("too-big", big, nil), big, true, 0)
	f.observeLane(testLane("elsewhere", small, map[string]string{"pool": "z"}), small, true, 0)
	f.observeLane(testLane("resident", small, nil), small, true, 0) // short of a second replica

	up := down.DeepCopy()
	up.Spec.Unschedulable = false
	if got := lanes(f.observeNode(up)); !slices.Equal(got, []string{"fits"}) {
		t.Errorf("enqueued %v, want only the lane that fits, is selected, and is not there already", got)
	}
	if got := lanes(f.forgetNode("mac-1")); !slices.Equal(got, []string{"resident"}) {
		t.Errorf("a deleted node enqueued %v, want the lane placed on it", got)
	}
}

// A node that returns (Ready again after its Lease lapsed) enqueues the lanes placed on it: a
// rollout that waits on its placement, and a ready count that left it out, go on at once, not
// at the next resync.
func TestANodeThatReturnsEnqueuesTheLanesPlacedOnIt(t *testing.T) {
	f := newFleet(clocktesting.NewFakeClock(time.Now()))
	id := testIdentity("gte", 22)
	lost := testNode("mac-1", func(n *v1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionUnknown })
	f.observeNode(lost)
	f.observeIdentity(id)
	f.observePlacement(testPlacement("rolling", "mac-1", id))
	f.observeLane(testLane("rolling", id, nil), id, false, 0)
	back := lost.DeepCopy()
	back.Status.Conditions[0].Status = metav1.ConditionTrue
	if got := lanes(f.observeNode(back)); !slices.Equal(got, []string{"rolling"}) {
		t.Errorf("enqueued %v, want the lane placed on the node", got)
	}
}

// A node that turns Ready while a lane is being placed finds the lane not yet waiting, and
// its event enqueues nothing: the lane's reconcile learns of it and places again, rather than
// waiting for a node event that may never come. Without such an event it does not.
func TestALaneFoundShortWhileANodeTurnedReadyIsPlacedAgain(t *testing.T) {
	f := newFleet(clocktesting.NewFakeClock(time.Now()))
	id := testIdentity("gte", 10)
	f.observeIdentity(id)
	notReady := testNode("mac-1", func(n *v1.MacNode) { n.Status.Conditions = nil })
	f.observeNode(notReady)

	epoch := f.nodeEpoch() // the reconcile starts: mac-1 is not Ready, the lane is short
	if got := lanes(f.observeNode(testNode("mac-1"))); len(got) != 0 {
		t.Fatalf("enqueued %v for a lane that is not waiting yet", got)
	}
	if !f.observeLane(testLane("lane", id, nil), id, true, epoch) {
		t.Error("the lane found short while mac-1 turned Ready is not placed again")
	}

	epoch = f.nodeEpoch()                                                        // the next pass: nothing arrives meanwhile
	f.observeNode(testNode("mac-1", func(n *v1.MacNode) { n.Status.Lanes = 1 })) // status that frees nothing
	if f.observeLane(testLane("lane", id, nil), id, true, epoch) {
		t.Error("a lane still short is placed again with no node event that could let it place")
	}
	if f.observeLane(testLane("lane", id, nil), id, false, 0) {
		t.Error("a lane that is not short is placed again")
	}
}

// Lanes reserved one after another, before any is reported, spread evenly and stop at the
// budget: the defect where a burst all went to the first node by name.
func TestReservationsSpreadAndNeverPassTheBudget(t *testing.T) {
	f := newFleet(clocktesting.NewFakeClock(time.Now()))
	id := testIdentity("gte", 22)
	for i := range 3 {
		f.observeNode(testNode(fmt.Sprintf("mac-%d", i)))
	}
	count := map[string]int{}
	for i := range 13 {
		got := reserveOne(f, testLane(fmt.Sprintf("lane-%02d", i), id, nil), id)
		if i == 12 {
			if len(got.chosen) != 0 || got.short != 3 || got.matching != 3 || got.selected != 3 {
				t.Fatalf("the 13th lane: %+v, want nothing chosen and 3 nodes short of budget", got)
			}
			continue
		}
		if len(got.chosen) != 1 {
			t.Fatalf("lane %d: %+v, want one node", i, got)
		}
		count[got.chosen[0]]++
		for node, k := range count {
			for other, j := range count {
				if k-j > 1 {
					t.Fatalf("after %d lanes %s holds %d and %s %d: not within one of even", i+1, node, k, other, j)
				}
			}
		}
	}
	for node, k := range count {
		if k != 4 {
			t.Errorf("%s holds %d lanes, want 4 (88 of 100 executables)", node, k)
		}
	}
}

func TestAnAssumedPlacementIsConfirmedThenReleased(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFleet(clk)
	id := testIdentity("gte", 60)
	f.observeNode(testNode("mac-1"))
	first := testLane("first", id, nil)
	if got := reserveOne(f, first, id); len(got.chosen) != 1 {
		t.Fatalf("%+v", got)
	}
	// The informer shows it: no reconcile of its own lane for what the controller did itself.
	p := testPlacement("first", "mac-1", id)
	if got := f.observePlacement(p); len(got) != 0 {
		t.Errorf("confirming an assumed placement enqueued %v", got)
	}
	clk.Step(2 * AssumeTimeout)
	second := testLane("second", id, nil)
	if got := reserveOne(f, second, id); len(got.chosen) != 0 || got.short != 1 {
		t.Fatalf("a confirmed placement must keep its charge: %+v", got)
	}
	f.observeLane(second, id, true, 0)
	// Its agent reports it Ready: its lane's status follows.
	ready := p.DeepCopy()
	ready.Status.Phase = v1.PhaseReady
	if got := lanes(f.observePlacement(ready)); !slices.Equal(got, []string{"first"}) {
		t.Errorf("a phase change enqueued %v", got)
	}
	// A compile-progress report changes nothing placement reads.
	progress := ready.DeepCopy()
	progress.Status.Compile = &v1.CompileProgress{Rung: 256, LayersDone: 3, LayersTotal: 60}
	if got := f.observePlacement(progress); len(got) != 0 {
		t.Errorf("a progress report enqueued %v", got)
	}
	if got := lanes(f.placementGone("ns", p.Name)); !slices.Equal(got, []string{"first", "second"}) {
		t.Errorf("a placement gone enqueued %v, want its lane and the lane waiting for its budget", got)
	}
}

func TestAnAssumptionNeverConfirmedExpires(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFleet(clk)
	id := testIdentity("gte", 60)
	f.observeNode(testNode("mac-1"))
	reserveOne(f, testLane("first", id, nil), id)
	if got := reserveOne(f, testLane("second", id, nil), id); len(got.chosen) != 0 {
		t.Fatalf("the assumed placement must hold the budget: %+v", got)
	}
	clk.Step(AssumeTimeout + time.Second)
	if live, _ := f.lanePlacements(types.NamespacedName{Namespace: "ns", Name: "first"}); len(live) != 0 {
		t.Errorf("an expired assumption still counts as a replica: %v", live)
	}
	if got := reserveOne(f, testLane("second", id, nil), id); len(got.chosen) != 1 {
		t.Errorf("an expired assumption still holds the budget: %+v", got)
	}
}

func TestADeletedPlacementStopsCountingButKeepsItsCharge(t *testing.T) {
	f := newFleet(clocktesting.NewFakeClock(time.Now()))
	id := testIdentity("gte", 60)
	f.observeNode(testNode("mac-1"))
	f.observeNode(testNode("mac-2"))
	p := testPlacement("first", "mac-1", id)
	f.observeIdentity(id)
	f.observePlacement(p)
	f.deleted(p)
	live, on := f.lanePlacements(types.NamespacedName{Namespace: "ns", Name: "first"})
	if len(live) != 0 {
		t.Errorf("a deleted placement still counts as a replica")
	}
	if _, ok := on["mac-1"]; !ok {
		t.Errorf("a deleted placement's node is free for its lane again before it is gone (its name is still taken)")
	}
	// A stale event from before the deletion does not bring it back.
	f.observePlacement(p.DeepCopy())
	if live, _ := f.lanePlacements(types.NamespacedName{Namespace: "ns", Name: "first"}); len(live) != 0 {
		t.Errorf("a stale event revived a deleted placement")
	}
	if got := reserveOne(f, testLane("second", id, nil), id); !slices.Equal(got.chosen, []string{"mac-2"}) {
		t.Errorf("the retiring placement's budget was given away: %+v", got)
	}
}

// An identity's status is rewritten as lanes come and go; none of it moves a lane. Only a new
// identity, a changed spec or a deleted one enqueues the lanes that name it.
func TestAnIdentityEnqueuesItsLanesOnlyWhenNewChangedOrGone(t *testing.T) {
	f := newFleet(clocktesting.NewFakeClock(time.Now()))
	id, other := testIdentity("gte", 22), testIdentity("other", 22)
	id.Generation, other.Generation = 1, 1
	f.observeLane(testLane("a", id, nil), id, true, 0)
	f.observeLane(testLane("b", id, nil), id, false, 0)
	f.observeLane(testLane("c", other, nil), other, true, 0)
	if got := lanes(f.observeIdentity(id)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("a new identity enqueued %v, want the lanes that name it", got)
	}
	status := id.DeepCopy()
	status.Status.LaneCount, status.Status.Lanes = 2, []string{"ns/a", "ns/b"}
	if got := f.observeIdentity(status); got != nil {
		t.Errorf("a status write enqueued %v", lanes(got))
	}
	changed := status.DeepCopy()
	changed.Generation = 2
	if got := lanes(f.observeIdentity(changed)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("a changed spec enqueued %v, want the lanes that name it", got)
	}
	if got := lanes(f.identityGone(id.Name)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("a deleted identity enqueued %v, want the lanes that name it", got)
	}
	if got := lanes(f.observeIdentity(changed)); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("an identity created again enqueued %v, want the lanes that name it", got)
	}
}

// A lane's placements are found under the lane, through every way one comes and goes: shown
// by the informer, assumed, moved to another node, deleted, expired.
func TestALanesPlacementsAreFoundUnderItsLane(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	f := newFleet(clk)
	id := testIdentity("gte", 10)
	f.observeIdentity(id)
	for i := range 3 {
		f.observeNode(testNode(fmt.Sprintf("mac-%d", i)))
	}
	names := func(lane string) []string {
		t.Helper()
		live, _ := f.lanePlacements(types.NamespacedName{Namespace: "ns", Name: lane})
		var out []string
		for _, p := range live {
			out = append(out, p.Spec.Node)
		}
		return out
	}
	f.observePlacement(testPlacement("a", "mac-0", id))
	f.observePlacement(testPlacement("b", "mac-1", id))
	if out := reserveOne(f, testLane("a", id, nil), id); len(out.chosen) != 1 {
		t.Fatalf("reserved %v", out.chosen)
	}
	if got := names("a"); len(got) != 2 || got[0] != "mac-0" {
		t.Errorf("lane a has placements on %v, want mac-0 and the one assumed", got)
	}
	if got := names("b"); !slices.Equal(got, []string{"mac-1"}) {
		t.Errorf("lane b has placements on %v, want mac-1", got)
	}
	moved := testPlacement("b", "mac-1", id)
	moved.Spec.Node = "mac-2"
	f.observePlacement(moved)
	if got := names("b"); !slices.Equal(got, []string{"mac-2"}) {
		t.Errorf("lane b has placements on %v after its placement moved, want mac-2", got)
	}
	if f.charged(f.nodes["mac-1"]) != 0 {
		t.Errorf("mac-1 is still charged for the placement that moved away")
	}
	f.placementGone("ns", moved.Name)
	if got := names("b"); got != nil {
		t.Errorf("lane b has placements on %v after its only one went", got)
	}
	clk.Step(AssumeTimeout + time.Second)
	if got := names("a"); !slices.Equal(got, []string{"mac-0"}) {
		t.Errorf("lane a has placements on %v after the assumption expired, want mac-0", got)
	}
	if len(f.byLane) != 1 {
		t.Errorf("the lane index holds %d lanes, want 1 (lane a)", len(f.byLane))
	}
}
