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

package prewarm

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// TestTheConflictMessageReadsTheSameWhateverTheListOrder: the lanes a policy lost were listed in
// the cache's order, so its status was written again whenever that order changed.
func TestTheConflictMessageReadsTheSameWhateverTheListOrder(t *testing.T) {
	one := lostTo(map[string][]string{"alpha": {"gte", "bge", "e5"}, "beta": {"rerank"}})
	other := lostTo(map[string][]string{"beta": {"rerank"}, "alpha": {"e5", "gte", "bge"}})
	if one != other || one != "alpha:[bge, e5, gte]; beta:[rerank]" {
		t.Errorf("the message reads %q and %q, want both alpha:[bge, e5, gte]; beta:[rerank]", one, other)
	}
}

// TestOnlyWhatResolvesAPolicyReconciles: a lane's or a policy's status write (the placement and
// endpoints controllers rewrite lanes' many times a second while they roll out) reconciles no
// policy and, through PolicyChanges, no lane; a spec or label change does.
func TestOnlyWhatResolvesAPolicyReconciles(t *testing.T) {
	lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "gte", Namespace: "default", Generation: 1, Labels: map[string]string{"tier": "search"}}}
	policy := &v1.PrewarmPolicy{ObjectMeta: metav1.ObjectMeta{Name: "alpha", Namespace: "default", Generation: 1}}
	for name, tc := range map[string]struct {
		change func(*v1.CatalogLane)
		want   bool
	}{
		"a lane's status": {func(l *v1.CatalogLane) { l.Status.ReadyReplicas = 2 }, false},
		"a lane's spec":   {func(l *v1.CatalogLane) { l.Generation = 2 }, true},
		"a lane's labels": {func(l *v1.CatalogLane) { l.Labels = map[string]string{"tier": "batch"} }, true},
	} {
		cur := lane.DeepCopy()
		tc.change(cur)
		if got := LaneChanges.Update(event.UpdateEvent{ObjectOld: lane, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	for name, tc := range map[string]struct {
		change func(*v1.PrewarmPolicy)
		want   bool
	}{
		"a policy's status": {func(p *v1.PrewarmPolicy) { p.Status.SelectedLanes = 3 }, false},
		"a policy's spec":   {func(p *v1.PrewarmPolicy) { p.Generation = 2 }, true},
	} {
		cur := policy.DeepCopy()
		tc.change(cur)
		if got := PolicyChanges.Update(event.UpdateEvent{ObjectOld: policy, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	if !PolicyChanges.Create(event.CreateEvent{Object: policy}) || !PolicyChanges.Delete(event.DeleteEvent{Object: policy}) ||
		!LaneChanges.Create(event.CreateEvent{Object: lane}) || !LaneChanges.Delete(event.DeleteEvent{Object: lane}) {
		t.Error("a new or deleted policy or lane reconciles nothing")
	}
}
