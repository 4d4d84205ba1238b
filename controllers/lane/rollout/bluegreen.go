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

package rollout

import (
	"fmt"
	"slices"
)

// beforeSwitch: the old space answers; the new comes up beside it within MaxSurge, and old
// placements of the answering space retire to make room while the lane keeps
// Replicas-MaxUnavailable of them serving. The lane switches once switchAt new ones serve.
func beforeSwitch(s Snapshot, p *Plan) {
	retireOtherSpaces(s, p)
	old := serving(inSpace(s.Old, p.Space))
	need := switchAt(s, old)
	if serving(s.Current) >= need {
		p.Space, p.Switched = s.NewSpace, true
		return
	}
	keep := min(old, s.Replicas-s.MaxUnavailable)
	if keep+need > s.Replicas+s.MaxSurge {
		p.Stalled = noRoom(s, p.Space, keep, need)
		p.NewTarget = min(s.Replicas, len(s.Current))
		return
	}
	live := len(s.Old) - len(p.Retire)
	short := need - (s.Replicas + s.MaxSurge - live)
	for _, i := range retirementOrder(s.Old, p.Space) {
		if short <= 0 {
			break
		}
		if s.Old[i].Serves {
			if old <= keep {
				break
			}
			old--
		}
		p.Retire = append(p.Retire, i)
		short--
		live--
	}
	p.NewTarget = min(s.Replicas, max(len(s.Current), s.Replicas+s.MaxSurge-live))
}

// switchAt is how many placements of the new space must serve for the lane to switch to it:
// Replicas-MaxUnavailable, and never more than the old space serves now (a switch then costs
// nothing the lane still has: a lane whose old placements were lost is not held on them), but
// at least one while the lane has replicas.
func switchAt(s Snapshot, oldServing int) int {
	if s.Replicas == 0 {
		return 0
	}
	return max(1, min(s.Replicas-s.MaxUnavailable, oldServing))
}

// noRoom says why a switch cannot happen within the lane's bounds and what to change: need
// placements of the new space must serve beside the keep that maxUnavailable keeps serving in
// the old, and replicas+maxSurge placements is all the lane may have.
func noRoom(s Snapshot, space string, keep, need int) string {
	surge := keep + need - s.Replicas
	unavailable := s.MaxUnavailable
	for unavailable < s.Replicas && s.MaxSurge+2*unavailable < s.Replicas {
		unavailable++
	}
	return fmt.Sprintf("a switch to vector space %s needs %d of its placements serving while %d of %s keep answering (spec.replicas %d - rollout.maxUnavailable %d), "+
		"%d placements, and spec.replicas + rollout.maxSurge allows %d: set rollout.maxSurge to at least %d or rollout.maxUnavailable to at least %d",
		s.NewSpace, need, keep, space, s.Replicas, s.MaxUnavailable, keep+need, s.Replicas+s.MaxSurge, surge, unavailable)
}

// afterSwitch: the lane answers in the new space. The old leave the endpoints once the
// endpoints controller has followed the lane's status (endpointsVectorSpaceGeneration counts
// switches: a rollback is never mistaken for the switch before it), and retire once they have
// drained: however long the endpoints controller takes, no client is sent by a slice to a
// placement that is gone. Old placements of the new space (the lane edited again within it
// during the drain) are the rolling update's, replaced a node at a time once these are gone.
func afterSwitch(s Snapshot, p *Plan) {
	switch {
	case s.Space != s.NewSpace:
		// Switched by this very step: the status is not even written yet.
	case !s.Endpoints.Followed:
		p.AwaitingEndpoints = true
	case s.Endpoints.DrainLeft > 0:
		p.DrainWait = s.Endpoints.DrainLeft
	default:
		for i, o := range s.Old {
			if o.Space != s.NewSpace {
				p.Retire = append(p.Retire, i)
			}
		}
		p.Drained = true
	}
}

// retireOtherSpaces: old placements of a space the lane no longer answers in (an earlier
// rollout's, the lane edited again since) serve nothing once the lane's EndpointSlices have
// followed its switch and they have drained: then they go. Until then no step retires them:
// the slices may still list them.
func retireOtherSpaces(s Snapshot, p *Plan) {
	if !slices.ContainsFunc(s.Old, func(o Placement) bool { return o.Space != p.Space }) {
		return
	}
	switch {
	case !s.Endpoints.Followed:
		p.AwaitingEndpoints = true
	case s.Endpoints.DrainLeft > 0:
		p.DrainWait = s.Endpoints.DrainLeft
	default:
		for i, o := range s.Old {
			if o.Space != p.Space {
				p.Retire = append(p.Retire, i)
			}
		}
	}
}

// inSpace is the placements of one space.
func inSpace(ps []Placement, space string) []Placement {
	return slices.DeleteFunc(slices.Clone(ps), func(p Placement) bool { return p.Space != space })
}

// retirementOrder lists the indices of the old placements of space, those that do not serve
// first.
func retirementOrder(old []Placement, space string) []int {
	var out []int
	for i, o := range old {
		if o.Space == space {
			out = append(out, i)
		}
	}
	slices.SortStableFunc(out, func(a, b int) int {
		switch {
		case old[a].Serves == old[b].Serves:
			return 0
		case old[a].Serves:
			return 1
		}
		return -1
	})
	return out
}
