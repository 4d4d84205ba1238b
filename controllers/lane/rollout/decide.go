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

// Package rollout decides a lane's rollout step from a snapshot of its placements: which vector
// space the lane answers in, how many placements of its latest spec it may have, which old ones
// retire now, and why it waits. It reads no clock and writes nothing, so every combination of
// replicas, maxSurge and maxUnavailable can be driven to its end by a test (decide_test.go);
// the placement controller builds the snapshot and carries the plan out.
package rollout

import (
	"slices"
	"time"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// Placement is what the decision reads of one placement.
type Placement struct {
	// Space is the vector space the placement answers in.
	Space string
	// Serves: Ready on a Ready node, so it can be one of the lane's endpoints.
	Serves bool
}

// Endpoints is where the lane's EndpointSlices stand against its latest switch of vector space.
type Endpoints struct {
	// Followed: the slices list the lane's vector space alone (endpointsVectorSpaceGeneration
	// reached vectorSpaceGeneration).
	Followed bool
	// DrainLeft is what is left of the drain that starts when they followed.
	DrainLeft time.Duration
}

// Snapshot is what one pass knows of a lane.
type Snapshot struct {
	// Replicas, MaxSurge and MaxUnavailable are the lane's, resolved: an unset maxSurge is
	// Replicas, maxUnavailable is at most Replicas.
	Replicas, MaxSurge, MaxUnavailable int
	// NewSpace is the vector space of the lane's latest identity; Space the one the lane
	// answers in now (its status; "" before it has one).
	NewSpace, Space string
	// Current are the placements of the lane's latest spec, Old those of an earlier one.
	Current, Old []Placement
	// Retiring is how many of the lane's placements are being deleted (still on their nodes).
	Retiring  int
	Endpoints Endpoints
}

// Plan is the step decided.
type Plan struct {
	// Space is the vector space the lane answers in from now on; Switched says this step
	// switched it.
	Space    string
	Switched bool
	// Strategy is v1.LaneReasonRollingUpdate or v1.LaneReasonBlueGreen while old placements are
	// left, "" otherwise.
	Strategy string
	// NewTarget is how many placements of the latest spec the lane may have now.
	NewTarget int
	// Retire are the indices in Snapshot.Old of the placements that retire now.
	Retire []int
	// AwaitingEndpoints: old placements wait for the EndpointSlices to follow the switch;
	// DrainWait: for their drain to end. Drained: the old space's drain is over and its
	// placements retire.
	AwaitingEndpoints bool
	DrainWait         time.Duration
	Drained           bool
	// Stalled says why the rollout cannot go on within the lane's bounds ("" when it can), and
	// what to change.
	Stalled string
}

// Decide is the rollout's step. A lane moves to a new identity, task or ladder within one vector
// space a node at a time (rolling); across vector spaces the new come up beside the old and the
// lane switches once enough of the new serve (blue/green).
func Decide(s Snapshot) Plan {
	p := Plan{Space: s.Space, NewTarget: s.Replicas}
	if len(s.Old) == 0 {
		p.Space = s.NewSpace
		return p
	}
	blueGreen := slices.ContainsFunc(s.Old, func(o Placement) bool { return o.Space != s.NewSpace })
	if p.Space == "" {
		p.Space = s.NewSpace
		if blueGreen {
			p.Space = s.Old[0].Space
		}
	}
	p.Strategy = v1.LaneReasonRollingUpdate
	if blueGreen {
		p.Strategy = v1.LaneReasonBlueGreen
	}
	switch {
	case p.Space != s.NewSpace:
		beforeSwitch(s, &p)
	case blueGreen:
		afterSwitch(s, &p)
	default:
		rolling(s, &p)
	}
	return p
}

// rolling: old and new answer in one space. Old placements that do not serve go at once; one
// that serves goes only while the lane keeps Replicas-MaxUnavailable serving, and only when no
// placement of the lane is still being retired: a node at a time.
func rolling(s Snapshot, p *Plan) {
	readyOld := 0
	for i, o := range s.Old {
		if o.Serves {
			readyOld++
		} else {
			p.Retire = append(p.Retire, i)
		}
	}
	if readyOld > 0 && readyOld+serving(s.Current) > s.Replicas-s.MaxUnavailable && s.Retiring == 0 {
		p.Retire = append(p.Retire, slices.IndexFunc(s.Old, func(o Placement) bool { return o.Serves }))
	}
	p.NewTarget = min(s.Replicas, max(len(s.Current), s.Replicas+s.MaxSurge-(len(s.Old)-len(p.Retire))))
	if s.MaxSurge == 0 && s.MaxUnavailable == 0 && s.Replicas > 0 {
		// The API server refuses these bounds now; a lane stored before it did says what to fix.
		p.Stalled = "rollout.maxSurge and rollout.maxUnavailable are both 0: no placement of the latest spec can come up beside the old and no old one may go; " +
			"set maxSurge to 1 (a spare node) or maxUnavailable to 1 (a node at a time, no spare node)"
	}
}

// serving counts the placements that serve.
func serving(ps []Placement) int {
	n := 0
	for _, p := range ps {
		if p.Serves {
			n++
		}
	}
	return n
}
