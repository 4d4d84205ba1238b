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
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// Input is what the owner feeds the core through Step: a request of the core's callers, or
// the outcome of a call an Effect started.
type Input interface{ input() }

// Load loads a model: its first worker generation is spawned. Loaded answers it.
type Load struct{ Spec ModelSpec }

// Acquire is a slow-path request for a shape: the fast path could not lease it. Answered by
// an Answer effect with the same ticket.
type Acquire struct {
	Ticket    Ticket
	Lane      string
	Rung      int
	RequestID string
	// Deadline is the request's absolute deadline (zero: none); Since is when the request began
	// to wait (its admission bound counts from then; zero: now).
	Deadline, Since time.Time
	// Member: the ticket was answered with a handoff and comes back for its first lease, ahead
	// of a starved budget head while its cohort's window is open.
	Member bool
	// ResidentOnly: lease nothing and admit nothing; answer whether the rung is resident and
	// its placement probe has passed, running the probe if it has not (the agent's probe loop).
	ResidentOnly bool
}

// Leave withdraws a request whose caller gave up. An answer already sent is not taken back:
// the owner releases a lease it finds in it.
type Leave struct{ Ticket Ticket }

// Retire unloads a lane: no new leases, queued admissions dropped, in-flight work drained, the
// worker's exit confirmed, and only then its reservations refunded. Retired answers it.
type Retire struct{ Lane string }

// Prewarm asks for the lane's prewarm rungs to be loaded in the background.
type Prewarm struct {
	Lane  string
	Rungs []int
}

// Observe asks for a certify observation; Observed answers it. With Withdraw, the observation
// ID is no longer wanted: it is dropped if its inventories have not been asked yet.
type Observe struct {
	ID       uint64
	Withdraw bool
}

// Tick says time passed or a watched lease was released: the core looks again.
type Tick struct{}

// ExchangeFault reports that an exchange on a lease of generation Gen faulted (I/O, a
// malformed reply, a bounded exchange that failed); sent once the lease is released.
type ExchangeFault struct {
	Gen *Gen
	Err error
}

// Spawned is the outcome of a Spawn effect: Gen is the effect's, and Conn the owner's handle on
// the started worker, which the core keeps in the generation for its calls.
type Spawned struct {
	Gen    *Gen
	Conn   any
	Cached []int
	Err    error
}

// Admitted is the outcome of an Admit effect. Took runs from the moment the admission reached
// the worker.
type Admitted struct {
	Gen       *Gen
	Job       compilequeue.JobID
	Load      uint64
	Admission Admission
	Took      time.Duration
	Err       error
}

// Evicted is the outcome of an Evict effect.
type Evicted struct {
	Gen     *Gen
	Load    uint64
	Attempt uint64
	Err     error
}

// Probed is the outcome of a Probe effect: the measurement, or the error that prevented it,
// and the lane's judgement of the measurement.
type Probed struct {
	Gen         *Gen
	Load        uint64
	Attempt     uint64
	Cell        *Cell
	Device, CPU time.Duration
	Err         error
	Verdict     error
}

// Exited confirms that generation Gen's process exited.
type Exited struct{ Gen *Gen }

// Inventoried is a worker's answer to an Inventory effect.
type Inventoried struct {
	Observation uint64
	Gen         *Gen
	Rungs       []int
	Err         error
}

func (Load) input()          {}
func (Acquire) input()       {}
func (Leave) input()         {}
func (Retire) input()        {}
func (Prewarm) input()       {}
func (Observe) input()       {}
func (Tick) input()          {}
func (ExchangeFault) input() {}
func (Spawned) input()       {}
func (Admitted) input()      {}
func (Evicted) input()       {}
func (Probed) input()        {}
func (Exited) input()        {}
func (Inventoried) input()   {}

// Effect is something the owner must do. Worker calls report back with the matching Input.
type Effect interface{ effect() }

// Spawn starts generation Gen of the lane's worker and waits until it has loaded the model;
// Spawned reports it.
type Spawn struct {
	Gen  *Gen
	Spec ModelSpec
}

// Admit compiles or loads rung on generation Gen; Admitted reports it. Progress receives the
// layers the worker reports done.
type Admit struct {
	Gen *Gen
	Job compilequeue.JobID
	// Load names this attempt: a job retried after a resource refusal is admitted again under
	// a new load, so a late report of the first attempt never settles the retry. Admitted
	// names it back.
	Load      uint64
	Rung      int
	Progress  *Progress
	RequestID string
	Ticket    Ticket
}

// Evict releases rung on generation Gen; Evicted reports it once the worker acknowledged.
type Evict struct {
	Gen  *Gen
	Load uint64
	// Attempt names this release: a release refused and asked again is another attempt, so a
	// late report of the first never settles the second. Evicted names it back.
	Attempt uint64
	Rung    int
	// Cell is the closed cell of the load being released.
	Cell *Cell
}

// ProbeShape runs the placement probe on a resident shape, on a lease the core took for it;
// Probed reports it (and gives the lease back). Judge is the lane's ModelSpec.Probe.
type ProbeShape struct {
	Gen  *Gen
	Load uint64
	// Attempt names this probe of the load, as Evict's does; Probed names it back.
	Attempt uint64
	Rung    int
	Cell    *Cell
	Judge   func(rung int, gen int64, device, cpu time.Duration) error
}

// ConfirmExit closes the generation's channel, waits for its process to exit (killing it after
// a grace) and reports Exited.
type ConfirmExit struct{ Gen *Gen }

// Inventory asks a worker for its resident rungs; Inventoried reports it.
type Inventory struct {
	Observation uint64
	Gen         *Gen
}

// Answer answers a slow-path request: a lease (Cell, taken on the request's behalf), a handoff
// (come back as a cohort Member), for a ResidentOnly request whether the rung is resident and
// probed, or a refusal.
type Answer struct {
	Ticket   Ticket
	Lane     string
	Cell     *Cell
	Handoff  bool
	Resident bool
	Err      error
}

// Loaded answers Load: nil once the first worker is connected.
type Loaded struct {
	Lane string
	Err  error
}

// Retired answers Retire once the lane is gone: its worker's exit confirmed and its
// reservations refunded.
type Retired struct {
	Lane string
	Err  error
}

// Observed answers Observe.
type Observed struct {
	ID          uint64
	Observation certify.Observation
	Err         error
}

func (Spawn) effect()       {}
func (Admit) effect()       {}
func (Evict) effect()       {}
func (ProbeShape) effect()  {}
func (ConfirmExit) effect() {}
func (Inventory) effect()   {}
func (Answer) effect()      {}
func (Loaded) effect()      {}
func (Retired) effect()     {}
func (Observed) effect()    {}

// Ready is what one Step asks of the owner.
type Ready struct {
	// Effects, in order. Answers come after the View that reflects them.
	Effects []Effect
	// View is the state to publish (never nil after the first Step).
	View *View
	// Next is when to step the core again if nothing else happens (zero: never).
	Next time.Time
}
