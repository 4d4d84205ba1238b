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
	"slices"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// modelState is where a loaded model is in its life. Each state says whether a worker process
// may exist and whether it may serve; nothing is encoded in a nil field.
type modelState int

const (
	// loading: the first generation is being spawned; nothing serves yet.
	loading modelState = iota
	// running: the current generation is connected and serves.
	running
	// recovering: the current generation faulted; its exit is being confirmed, or its
	// replacement is being spawned (or waits to be spawned again after a failed start).
	recovering
	// retiring: no new leases; in-flight work drains, then the worker's exit is confirmed.
	retiring
)

func (s modelState) String() string {
	return [...]string{"loading", "running", "recovering", "retiring"}[s]
}

// model is one loaded model: its worker generations and its shapes.
type model struct {
	spec  ModelSpec
	state modelState
	// gen is the current generation: spawned and connected, or (while recovering or retiring)
	// the one whose exit is being confirmed. Nil until the first spawn returns.
	gen *Gen
	// exitedGen is the newest generation whose exit is confirmed.
	exitedGen int64
	// exiting: a ConfirmExit of gen is in flight. spawning: a Spawn of the next generation is,
	// spawnGen.
	exiting, spawning bool
	spawnGen          *Gen
	// spawnRetryAt is when a failed replacement spawn is tried again; spawnFailures counts
	// consecutive failures for the backoff.
	spawnRetryAt  time.Time
	spawnFailures int
	restartBegan  time.Time
	// shapes are the rungs charged to the current generation, sorted by rung.
	shapes []*shape
	// cached are the rungs the worker reported held by aned.
	cached map[int]bool
	// busy counts the core's calls in flight on the current generation (admissions,
	// evictions, probes, inventories); moving counts the admissions and evictions among them,
	// which change what is resident.
	busy, moving int
	// prewarmRungs are loaded in the background once the lane is ready; prewarm is the
	// current generation's progress.
	prewarmRungs []int
	prewarm      *prewarm
	// admitting is the admission on the wire, for the status.
	admitting *Progress
	lastFault *Fault
	restarts  int
}

func (m *model) owner() string { return m.spec.Lane }

func (m *model) genN() int64 {
	if m.gen == nil {
		return 0
	}
	return m.gen.N
}

// live: a process of the current generation may exist and its exit is not confirmed.
func (m *model) live() bool { return m.gen != nil && m.exitedGen < m.gen.N }

func (m *model) shape(rung int) *shape {
	for _, sh := range m.shapes {
		if sh.rung == rung {
			return sh
		}
	}
	return nil
}

func (m *model) shapeByLoad(load uint64) *shape {
	for _, sh := range m.shapes {
		if sh.load == load {
			return sh
		}
	}
	return nil
}

func (m *model) addShape(sh *shape) {
	i, _ := slices.BinarySearchFunc(m.shapes, sh.rung, func(s *shape, r int) int { return s.rung - r })
	m.shapes = slices.Insert(m.shapes, i, sh)
}

func (m *model) removeShape(sh *shape) {
	m.shapes = slices.DeleteFunc(m.shapes, func(s *shape) bool { return s == sh })
}

// leases counts the leases held on the model's shapes (read from their cells).
func (m *model) leases() int {
	n := 0
	for _, sh := range m.shapes {
		if sh.cell != nil {
			n += sh.cell.Leases()
		}
	}
	return n
}

func (m *model) smallestRung() int { return m.spec.Rungs[0] }

// idle: no call of the core runs on the generation's stream and no request holds or waits
// for it.
func (m *model) idle() bool { return m.busy == 0 && (m.gen == nil || m.gen.idle()) }

type shapeState int

const (
	admitting shapeState = iota
	resident
	evicting
)

// shape is one rung of one model's current generation: reserved while admitting, resident, or
// evicting until the worker acknowledges the release. Its charge stays counted in all three.
type shape struct {
	rung   int
	state  shapeState
	charge int
	// load names this load of the shape: an eviction's outcome names it.
	load uint64
	// job is the admission that loads it, while admitting.
	job *compilequeue.Job
	// cell is what leases hold, once resident.
	cell   *Cell
	cohort *cohort
	// unpark is an admission parked at the queue's head until this shape's release is
	// acknowledged (the device refused it for resources).
	unpark *compilequeue.Job
	probe  probeState
	// attempt names the eviction on the wire, if any.
	attempt uint64
	// unknownOutcome: its admission or eviction was reported with an unknown outcome. Its
	// charge stays until the process's exit is confirmed, and a repeated report of that
	// outcome changes nothing.
	unknownOutcome bool
}

// cohort is the closed set of tickets that joined an admission while it ran. Until every
// member leases or leaves, or the handoff window ends, they may lease ahead of a starved
// budget head and the shape is not evicted.
type cohort struct {
	members map[Ticket]bool
	expires time.Time
}

func (c *cohort) protects(now time.Time) bool {
	return c != nil && len(c.members) > 0 && now.Before(c.expires)
}

// probeState is one load's placement-probe state.
type probeState struct {
	passed bool
	// failed is the judgement that refuses every lease of this load.
	failed error
	// running: the probe is in flight, as attempt; waiters wait for its verdict.
	running bool
	attempt uint64
	waiters []Ticket
}
