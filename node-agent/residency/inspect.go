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

package residency

import (
	"fmt"
	"strings"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// Inspection is a copy of the core's state for tests and the simulator's failure reports.
type Inspection struct {
	Used, Budget int
	// Starved: resident traffic yields to a starved head: every lane's, or StarvedLane's only.
	Starved     bool
	StarvedLane string
	// Running is the job holding the compile gate; Held says it failed and only holds it, for
	// generation HeldBy's unknown outcome, until HoldUntil at the latest.
	Running   *JobInfo
	Held      bool
	HeldBy    *Gen
	HoldUntil time.Time
	Queued    []JobInfo
	// Waiting counts the unanswered requests; Blocked those behind a starved head.
	Waiting, Blocked int
	Models           map[string]ModelInfo
}

// JobInfo is one queued or running admission.
type JobInfo struct {
	ID      uint64
	Owner   string
	Rung    int
	Waiters []Ticket
	Parked  bool
	Retried bool
	// Recycled: put back for its worker's replacement; Background: a prewarm admission.
	Recycled, Background bool
	// Arrival is when it was queued; DropAt when it is dropped if nobody waits for it (twice
	// its last promise after the promise).
	Arrival, DropAt time.Time
	// Kind and Cost are the job's prediction: a compile or a load from aned's cache.
	Kind string
	Cost time.Duration
}

// ModelInfo is one loaded model.
type ModelInfo struct {
	State                       string
	Gen                         int64
	Busy                        int
	Exiting, Spawning           bool
	SpawnFailures               int
	Shapes                      []ShapeInfo
	PrewarmJob, PrewarmRunning  bool
	ProbeWaiters, CohortMembers int
}

// ShapeInfo is one shape.
type ShapeInfo struct {
	Rung   int
	State  string
	Leases int
	Cohort bool
	Probed bool
}

// Inspect copies the core's state.
func (c *Core) Inspect() Inspection {
	out := Inspection{Used: c.used, Budget: c.budget, Starved: c.starved, StarvedLane: c.starvedLane, Waiting: len(c.waiters), Blocked: len(c.blocked),
		Models: map[string]ModelInfo{}}
	if j := c.queue.Running(); j != nil {
		ji := jobInfo(j)
		out.Running = &ji
		out.Held = c.queue.Failed()
		if h := c.hold; h != nil {
			out.HeldBy, out.HoldUntil = h.gen, h.until
		}
	}
	for _, j := range c.queue.Queued() {
		out.Queued = append(out.Queued, jobInfo(j))
	}
	for _, lane := range c.lanes {
		m := c.models[lane]
		mi := ModelInfo{State: m.state.String(), Gen: m.genN(), Busy: m.busy, Exiting: m.exiting, Spawning: m.spawning,
			SpawnFailures: m.spawnFailures, PrewarmJob: m.prewarm != nil && m.prewarm.job != nil,
			PrewarmRunning: m.prewarm != nil && m.prewarm.summary.State == "Running"}
		for _, sh := range m.shapes {
			si := ShapeInfo{Rung: sh.rung, State: [...]string{"admitting", "resident", "evicting"}[sh.state],
				Cohort: sh.cohort != nil, Probed: sh.probe.passed}
			if sh.cell != nil {
				si.Leases = sh.cell.Leases()
			}
			if sh.cohort != nil {
				mi.CohortMembers += len(sh.cohort.members)
			}
			mi.ProbeWaiters += len(sh.probe.waiters)
			mi.Shapes = append(mi.Shapes, si)
		}
		out.Models[lane] = mi
	}
	return out
}

func jobInfo(j *compilequeue.Job) JobInfo {
	return JobInfo{ID: uint64(j.ID), Owner: j.Owner, Rung: j.Shape.Rung, Waiters: j.Waiters(), Parked: j.Parked(), Retried: j.Retried,
		Recycled: j.Recycled, Background: j.Background, Arrival: j.Arrival, DropAt: j.DropAt(),
		Kind: j.Prediction.Kind.String(), Cost: j.Prediction.Cost}
}

// Job returns the queued or running job admitting lane's rung, and false if there is none.
func (i Inspection) Job(lane string, rung int) (JobInfo, bool) {
	if r := i.Running; r != nil && !i.Held && r.Owner == lane && r.Rung == rung {
		return *r, true
	}
	for _, j := range i.Queued {
		if j.Owner == lane && j.Rung == rung {
			return j, true
		}
	}
	return JobInfo{}, false
}

// Shape returns lane's shape of rung, and false if it has none.
func (i Inspection) Shape(lane string, rung int) (ShapeInfo, bool) {
	for _, sh := range i.Models[lane].Shapes {
		if sh.Rung == rung {
			return sh, true
		}
	}
	return ShapeInfo{}, false
}

func (i Inspection) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "used=%d/%d starved=%v waiting=%d blocked=%d", i.Used, i.Budget, i.Starved, i.Waiting, i.Blocked)
	if r := i.Running; r != nil {
		fmt.Fprintf(&b, " running=%s/%d(held %v, waiters %v)", r.Owner, r.Rung, i.Held, r.Waiters)
	}
	for _, j := range i.Queued {
		fmt.Fprintf(&b, " queued=%s/%d(waiters %v parked %v)", j.Owner, j.Rung, j.Waiters, j.Parked)
	}
	for lane, m := range i.Models {
		fmt.Fprintf(&b, " [%s %s gen=%d busy=%d exiting=%v spawning=%v", lane, m.State, m.Gen, m.Busy, m.Exiting, m.Spawning)
		for _, sh := range m.Shapes {
			fmt.Fprintf(&b, " %d:%s,leases=%d,cohort=%v", sh.Rung, sh.State, sh.Leases, sh.Cohort)
		}
		b.WriteString("]")
	}
	return b.String()
}
