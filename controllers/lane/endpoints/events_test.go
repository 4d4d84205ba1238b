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
