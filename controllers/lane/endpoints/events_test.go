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

package endpoints_test

import (
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

// Only a change of a node's addresses, serving port or health reconciles the lanes on it: the
// agents' progress reports and condition messages change nothing in an EndpointSlice.
func TestOnlyANodeChangeOfAddressOrPortReconcilesItsLanes(t *testing.T) {
	n := &v1.MacNode{Status: v1.MacNodeStatus{ServingPort: 7443, Addresses: []v1.NodeAddress{{Type: "InternalIP", Address: "10.0.0.2"}},
		Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed}}}}
	for name, tc := range map[string]struct {
		change func(*v1.MacNode)
		want   bool
	}{
		"nothing":       {func(*v1.MacNode) {}, false},
		"allocation":    {func(n *v1.MacNode) { n.Status.Allocated.LayerExecutables = 40 }, false},
		"queue":         {func(n *v1.MacNode) { n.Status.CompileQueue.Length = 2 }, false},
		"lanes":         {func(n *v1.MacNode) { n.Status.Lanes = 3 }, false},
		"ready message": {func(n *v1.MacNode) { n.Status.Conditions[0].Message = "3 lanes loaded" }, false},
		"address":       {func(n *v1.MacNode) { n.Status.Addresses[0].Address = "10.0.0.3" }, true},
		"address added": {func(n *v1.MacNode) {
			n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Address: "10.0.0.4"})
		}, true},
		"serving port": {func(n *v1.MacNode) { n.Status.ServingPort = 7444 }, true},
		"lost":         {func(n *v1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionUnknown }, true},
	} {
		cur := n.DeepCopy()
		tc.change(cur)
		if got := endpoints.ServingChanges.Update(event.UpdateEvent{ObjectOld: n, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	if !endpoints.ServingChanges.Create(event.CreateEvent{Object: n}) || !endpoints.ServingChanges.Delete(event.DeleteEvent{Object: n}) {
		t.Error("a new or deleted node did not reconcile its lanes")
	}
}

// A MacNode's AddressAllowed condition is set again when its addresses change, and when the
// condition itself changes (the controller's own write, whose pass reads a cache that shows it);
// the agents' other reports do not bring it back.
func TestAddressChangesPassesAddressesAndTheConditionItself(t *testing.T) {
	n := &v1.MacNode{Status: v1.MacNodeStatus{Addresses: []v1.NodeAddress{{Type: "InternalIP", Address: "10.0.0.2"}},
		Conditions: []metav1.Condition{{Type: v1.NodeConditionAddressAllowed, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAddressAllowed,
			Message: "address 10.0.0.2 is inside the allowed CIDRs"}}}}
	for name, tc := range map[string]struct {
		change func(*v1.MacNode)
		want   bool
	}{
		"nothing":             {func(*v1.MacNode) {}, false},
		"allocation":          {func(n *v1.MacNode) { n.Status.Allocated.LayerExecutables = 40 }, false},
		"address":             {func(n *v1.MacNode) { n.Status.Addresses[0].Address = "10.0.0.3" }, true},
		"condition dropped":   {func(n *v1.MacNode) { n.Status.Conditions = nil }, true},
		"condition turned":    {func(n *v1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionFalse }, true},
		"condition's reason":  {func(n *v1.MacNode) { n.Status.Conditions[0].Reason = "InsideServiceCIDR" }, true},
		"condition's message": {func(n *v1.MacNode) { n.Status.Conditions[0].Message = "address 10.0.0.2 is in a ServiceCIDR" }, true},
	} {
		cur := n.DeepCopy()
		tc.change(cur)
		if got := endpoints.AddressChanges.Update(event.UpdateEvent{ObjectOld: n, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	// A node that had no condition yet, now given one: the controller's first write comes back.
	bare := n.DeepCopy()
	bare.Status.Conditions = nil
	if !endpoints.AddressChanges.Update(event.UpdateEvent{ObjectOld: bare, ObjectNew: n}) {
		t.Error("the condition's first write did not pass")
	}
}

// Only a change of what a placement's lane lists of it, or of whether it is drained, reconciles
// the lane: its agent's progress reports on the way to Ready do not.
func TestOnlyAPlacementChangeOfServingReconcilesItsLane(t *testing.T) {
	p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{v1.LabelLane: "gte"}},
		Spec: v1.LanePlacementSpec{Lane: "gte", Node: "mac-a", Identity: "gte", VectorSpaceID: "gte-v1"},
		Status: v1.LanePlacementStatus{Phase: v1.PhaseCompiling,
			Conditions: []metav1.Condition{{Type: v1.PlacementConditionNodeReady, Status: metav1.ConditionTrue, Reason: "LeaseRenewed"}}}}
	for name, tc := range map[string]struct {
		change func(*v1.LanePlacement)
		want   bool
	}{
		"nothing":             {func(*v1.LanePlacement) {}, false},
		"another phase":       {func(p *v1.LanePlacement) { p.Status.Phase = v1.PhaseLoading }, false},
		"a condition's words": {func(p *v1.LanePlacement) { p.Status.Conditions[0].Message = "renewed at 12:00" }, false},
		"another condition": {func(p *v1.LanePlacement) {
			meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: "Compiled", Status: metav1.ConditionTrue, Reason: "Compiled"})
		}, false},
		"Ready":     {func(p *v1.LanePlacement) { p.Status.Phase = v1.PhaseReady }, true},
		"node lost": {func(p *v1.LanePlacement) { p.Status.Conditions[0].Status = metav1.ConditionFalse }, true},
		"terminating": {func(p *v1.LanePlacement) {
			meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionTerminating, Status: metav1.ConditionTrue, Reason: "Stopping"})
		}, true},
		"drained": {func(p *v1.LanePlacement) {
			meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionDrained, Status: metav1.ConditionTrue, Reason: v1.PlacementReasonNotAnEndpoint})
		}, true},
		"deleted":              {func(p *v1.LanePlacement) { now := metav1.Now(); p.DeletionTimestamp = &now }, true},
		"another vector space": {func(p *v1.LanePlacement) { p.Spec.VectorSpaceID = "gte-v2" }, true},
		"another lane":         {func(p *v1.LanePlacement) { p.Labels[v1.LabelLane] = "bge" }, true},
	} {
		cur := p.DeepCopy()
		tc.change(cur)
		if got := endpoints.PlacementServingChanges.Update(event.UpdateEvent{ObjectOld: p, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	if !endpoints.PlacementServingChanges.Create(event.CreateEvent{Object: p}) || !endpoints.PlacementServingChanges.Delete(event.DeleteEvent{Object: p}) {
		t.Error("a new or deleted placement did not reconcile its lane")
	}
}

// Only a change of what the endpoints controller reads of a lane reconciles it: the placement
// controller's writes of the lane's progress do not.
func TestOnlyALaneChangeOfServingReconcilesIt(t *testing.T) {
	l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Generation: 1},
		Status: v1.CatalogLaneStatus{VectorSpaceID: "gte-v1", Conditions: []metav1.Condition{
			{Type: v1.LaneConditionServiceReady, Status: metav1.ConditionTrue, Reason: v1.LaneReasonServiceReady, ObservedGeneration: 1},
			{Type: "Placed", Status: metav1.ConditionFalse, Reason: "Placing", Message: "1 of 2 replicas placed"}}}}
	for name, tc := range map[string]struct {
		change func(*v1.CatalogLane)
		want   bool
	}{
		"nothing":                   {func(*v1.CatalogLane) {}, false},
		"another condition":         {func(l *v1.CatalogLane) { l.Status.Conditions[1].Message = "2 of 2 replicas placed" }, false},
		"ready replicas":            {func(l *v1.CatalogLane) { l.Status.ReadyReplicas = 2 }, false},
		"spec":                      {func(l *v1.CatalogLane) { l.Generation = 2 }, true},
		"deleted":                   {func(l *v1.CatalogLane) { now := metav1.Now(); l.DeletionTimestamp = &now }, true},
		"vector space":              {func(l *v1.CatalogLane) { l.Status.VectorSpaceID, l.Status.VectorSpaceGeneration = "gte-v2", 1 }, true},
		"endpoints' vector space":   {func(l *v1.CatalogLane) { l.Status.EndpointsVectorSpaceID = "gte-v1" }, true},
		"ServiceReady dropped":      {func(l *v1.CatalogLane) { l.Status.Conditions = l.Status.Conditions[1:] }, true},
		"ServiceReady turned":       {func(l *v1.CatalogLane) { l.Status.Conditions[0].Status = metav1.ConditionFalse }, true},
		"ServiceReady's generation": {func(l *v1.CatalogLane) { l.Status.Conditions[0].ObservedGeneration = 0 }, true},
	} {
		cur := l.DeepCopy()
		tc.change(cur)
		if got := endpoints.LaneServingChanges.Update(event.UpdateEvent{ObjectOld: l, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}

// A lane's EndpointSlice brings its lane back when it is changed or deleted, to be mended, not
// when it is created: only the endpoints controller creates them.
func TestOnlyASliceChangedOrDeletedReconcilesItsLane(t *testing.T) {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "gte-8080", Namespace: "default"}}
	changed := s.DeepCopy()
	changed.Endpoints = []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.1"}}}
	if endpoints.SliceChanges.Create(event.CreateEvent{Object: s}) {
		t.Error("a slice's creation reconciled its lane")
	}
	if !endpoints.SliceChanges.Update(event.UpdateEvent{ObjectOld: s, ObjectNew: changed}) || !endpoints.SliceChanges.Delete(event.DeleteEvent{Object: s}) {
		t.Error("a changed or deleted slice did not reconcile its lane")
	}
}
