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

package v1alpha1

import (
	"slices"
	"testing"
)

func TestALanesServiceNamesAreBoundToItsNamespace(t *testing.T) {
	got := LaneServiceDNSNames("team-a", "gte-search", "cluster.local")
	want := []string{"gte-search.team-a", "gte-search.team-a.svc", "gte-search.team-a.svc.cluster.local"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if got := LaneServiceDNSNames("team-a", "gte-search", ""); !slices.Equal(got, want[:2]) {
		t.Fatalf("without a cluster domain: got %v, want %v", got, want[:2])
	}
}
