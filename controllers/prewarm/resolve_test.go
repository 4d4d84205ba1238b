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
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

func policy(name string, match map[string]string, rungs ...v1.Rung) v1.PrewarmPolicy {
	return v1.PrewarmPolicy{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: v1.PrewarmPolicySpec{LaneSelector: metav1.LabelSelector{MatchLabels: match}, Rungs: rungs}}
}

func lane(labels map[string]string, ref string, rungs ...v1.Rung) *v1.CatalogLane {
	l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "default", Labels: labels}, Spec: v1.CatalogLaneSpec{Rungs: rungs}}
	if ref != "" {
		l.Spec.PrewarmPolicyRef = &v1.LocalObjectReference{Name: ref}
	}
	return l
}

func TestWithoutAPolicyTheDefaultRungsOfTheLaddersApply(t *testing.T) {
	r := Resolve(lane(nil, "", 256, 512, 1024), nil)
	if r.Policy != "" || !slices.Equal(r.Rungs, []v1.Rung{256, 512}) {
		t.Fatalf("got %+v, want 256 and 512 of the default", r)
	}
}

func TestOnlyRungsOfTheLanesLadderArePrewarmed(t *testing.T) {
	r := Resolve(lane(map[string]string{"tier": "a"}, "", 128, 1024), []v1.PrewarmPolicy{policy("p", map[string]string{"tier": "a"}, 128, 256, 1024)})
	if r.Policy != "p" || !slices.Equal(r.Rungs, []v1.Rung{128, 1024}) {
		t.Fatalf("got %+v", r)
	}
}

func TestConflictingPoliciesResolveByNameAndTheLosersAreNamed(t *testing.T) {
	ps := []v1.PrewarmPolicy{policy("zeta", nil, 512), policy("alpha", nil, 128), policy("mid", map[string]string{"x": "y"}, 256)}
	r := Resolve(lane(map[string]string{"x": "y"}, "", 128, 256, 512), ps)
	if r.Policy != "alpha" || !slices.Equal(r.Rungs, []v1.Rung{128}) || !slices.Equal(r.Losers, []string{"mid", "zeta"}) {
		t.Fatalf("got %+v", r)
	}
}

func TestALanesNamedPolicyWinsOverSelectors(t *testing.T) {
	ps := []v1.PrewarmPolicy{policy("alpha", nil, 128), policy("named", map[string]string{"none": "x"}, 512)}
	r := Resolve(lane(nil, "named", 128, 512), ps)
	if r.Policy != "named" || !slices.Equal(r.Rungs, []v1.Rung{512}) || len(r.Losers) != 0 {
		t.Fatalf("got %+v", r)
	}
}
