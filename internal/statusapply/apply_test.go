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

package statusapply

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

var (
	then = metav1.NewTime(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	now  = metav1.NewTime(then.Add(time.Minute))
)

// A condition applied again with the same status keeps the time it last changed; a new status
// takes the time given; the stored list is left as it is.
func TestNextKeepsTheTransitionTimeUnlessTheStatusChanges(t *testing.T) {
	stored := []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed, LastTransitionTime: then}}
	same := Next(stored, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed,
		Message: "another message", LastTransitionTime: now})
	if !same.LastTransitionTime.Equal(&then) || same.Message != "another message" {
		t.Errorf("same status: %+v, want the stored transition time and the new message", same)
	}
	flipped := Next(stored, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionUnknown, Reason: v1.NodeReasonLeaseExpired,
		LastTransitionTime: now})
	if !flipped.LastTransitionTime.Equal(&now) {
		t.Errorf("new status: %+v, want the transition time given", flipped)
	}
	if stored[0].Status != metav1.ConditionTrue || stored[0].Message != "" {
		t.Errorf("Next changed the stored conditions: %+v", stored)
	}
	added := Next(nil, metav1.Condition{Type: v1.NodeConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAgentRunning, LastTransitionTime: now})
	if added.Type != v1.NodeConditionAgentReady || !added.LastTransitionTime.Equal(&now) {
		t.Errorf("a first condition: %+v", added)
	}
}

// A writer writes when what it says differs: status, reason, message or observed generation,
// not the transition time it would give.
func TestChangedComparesWhatTheWriterSays(t *testing.T) {
	stored := []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: "R", Message: "m", ObservedGeneration: 1, LastTransitionTime: then}}
	base := stored[0]
	base.LastTransitionTime = now
	for name, tc := range map[string]struct {
		change func(*metav1.Condition)
		want   bool
	}{
		"nothing but the time": {func(*metav1.Condition) {}, false},
		"status":               {func(c *metav1.Condition) { c.Status = metav1.ConditionUnknown }, true},
		"reason":               {func(c *metav1.Condition) { c.Reason = "Other" }, true},
		"message":              {func(c *metav1.Condition) { c.Message = "other" }, true},
		"observed generation":  {func(c *metav1.Condition) { c.ObservedGeneration = 2 }, true},
		"another type":         {func(c *metav1.Condition) { c.Type = v1.NodeConditionAgentReady }, true},
	} {
		c := base
		tc.change(&c)
		if got := Changed(stored, c); got != tc.want {
			t.Errorf("%s: Changed = %v, want %v", name, got, tc.want)
		}
	}
}

// Each writer keeps to its own types: the agent's status never carries a controller's.
func TestTheAgentsConditionsLeaveTheControllersOut(t *testing.T) {
	conds := []metav1.Condition{{Type: v1.ConditionReady}, {Type: v1.NodeConditionAgentReady}, {Type: v1.NodeConditionAddressAllowed},
		{Type: v1.NodeConditionPaused}, {Type: v1.NodeConditionEvictionHeld}}
	got := only(conds, AgentConditions)
	if len(got) != 2 || got[0].Type != v1.NodeConditionAgentReady || got[1].Type != v1.NodeConditionPaused {
		t.Errorf("the agent would write %+v", got)
	}
	if len(conds) != 5 {
		t.Errorf("only changed its input: %+v", conds)
	}
	placement := []metav1.Condition{{Type: v1.ConditionReady}, {Type: v1.PlacementConditionNodeReady}, {Type: v1.PlacementConditionDrained},
		{Type: v1.PlacementConditionTerminating}}
	if got := only(placement, AgentPlacementConditions); len(got) != 2 || got[0].Type != v1.ConditionReady || got[1].Type != v1.PlacementConditionTerminating {
		t.Errorf("the agent would write %+v on a placement", got)
	}
}
