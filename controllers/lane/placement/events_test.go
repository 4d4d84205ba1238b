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
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
)

// A lane is reconciled again for an edit of its spec and for the endpoints controller's word
// that its EndpointSlices follow its vector space, which a blue/green rollout waits for; not
// for the status this controller writes itself.
func TestALaneIsReconciledForItsEditsAndItsEndpointsSpace(t *testing.T) {
	l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "lane", Namespace: "default", Generation: 2},
		Status: v1.CatalogLaneStatus{VectorSpaceID: "gte-v2", EndpointsVectorSpaceID: "gte-v1", ReadyReplicas: 1}}
	for name, tc := range map[string]struct {
		change func(*v1.CatalogLane)
		want   bool
	}{
		"nothing":                       {func(*v1.CatalogLane) {}, false},
		"its own status: ready count":   {func(l *v1.CatalogLane) { l.Status.ReadyReplicas = 2 }, false},
		"its own status: vector space":  {func(l *v1.CatalogLane) { l.Status.VectorSpaceID = "gte-v3" }, false},
		"the spec (a new generation)":   {func(l *v1.CatalogLane) { l.Generation = 3 }, true},
		"the endpoints' vector space":   {func(l *v1.CatalogLane) { l.Status.EndpointsVectorSpaceID = "gte-v2" }, true},
		"the endpoints' space, cleared": {func(l *v1.CatalogLane) { l.Status.EndpointsVectorSpaceID = "" }, true},
	} {
		cur := l.DeepCopy()
		tc.change(cur)
		if got := placement.LaneChanges.Update(event.UpdateEvent{ObjectOld: l, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
	if !placement.LaneChanges.Create(event.CreateEvent{Object: l}) || !placement.LaneChanges.Delete(event.DeleteEvent{Object: l}) {
		t.Error("a new or deleted lane is not reconciled")
	}
}
