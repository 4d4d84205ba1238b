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

// Package prewarm resolves which rungs of a lane load in the background, and reports on each
// PrewarmPolicy which lanes it applies to and whether another policy won a lane from it.
package prewarm

import (
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// DefaultRungs are prewarmed when no policy applies to a lane.
var DefaultRungs = []v1.Rung{128, 256, 512}

// Resolution is the policy that applies to a lane and the rungs it loads.
type Resolution struct {
	// Policy is the winning policy's name; empty when the default applies.
	Policy string
	// Rungs are the policy's rungs that are in the lane's ladder, ascending.
	Rungs []v1.Rung
	// Losers are the other policies whose selector matched the lane.
	Losers []string
}

// Resolve picks the policy of lane among the namespace's policies: the one the lane names, or
// else the matching policies, the first by name winning, deterministically. Only rungs of the
// lane's ladder are kept.
func Resolve(lane *v1.CatalogLane, policies []v1.PrewarmPolicy) Resolution {
	var matching []v1.PrewarmPolicy
	for _, p := range policies {
		if p.Namespace != lane.Namespace || !p.DeletionTimestamp.IsZero() {
			continue
		}
		if ref := lane.Spec.PrewarmPolicyRef; ref != nil {
			if p.Name == ref.Name {
				matching = []v1.PrewarmPolicy{p}
				break
			}
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&p.Spec.LaneSelector)
		if err != nil || !sel.Matches(labels.Set(lane.Labels)) {
			continue
		}
		matching = append(matching, p)
	}
	slices.SortFunc(matching, func(a, b v1.PrewarmPolicy) int { return strings.Compare(a.Name, b.Name) })
	res := Resolution{Rungs: DefaultRungs}
	if len(matching) > 0 {
		res.Policy, res.Rungs = matching[0].Name, matching[0].Spec.Rungs
		for _, p := range matching[1:] {
			res.Losers = append(res.Losers, p.Name)
		}
	}
	var in []v1.Rung
	for _, r := range res.Rungs {
		if slices.Contains(lane.Spec.Rungs, r) {
			in = append(in, r)
		}
	}
	res.Rungs = in
	return res
}
