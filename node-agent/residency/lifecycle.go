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
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// load starts a model's first generation.
func (c *Core) load(spec ModelSpec) {
	if _, ok := c.models[spec.Lane]; ok {
		c.emit(Loaded{Lane: spec.Lane, Err: fmt.Errorf("lane %s is already loaded", spec.Lane)})
		return
	}
	if len(spec.Rungs) == 0 || spec.Layers <= 0 || spec.MaxResidentShapes <= 0 {
		c.emit(Loaded{Lane: spec.Lane, Err: fmt.Errorf("lane %s: a model needs rungs, layers and at least one resident shape", spec.Lane)})
		return
	}
	m := &model{spec: spec, state: loading, cached: map[int]bool{}}
	c.addModel(m)
	// Until the worker has loaded, the lane's admissions queue but are not elected.
	c.queue.SetRecovering(m.owner(), true)
	c.spawn(m)
}

// spawn starts the model's next generation.
func (c *Core) spawn(m *model) {
	m.spawning = true
	m.spawnRetryAt = time.Time{}
	m.spawnGen = &Gen{Lane: m.spec.Lane, N: m.genN() + 1}
	c.emit(Spawn{Gen: m.spawnGen, Spec: m.spec})
}

// spawned connects a started worker, unless the model is retiring: retirement is rechecked
// here, and a worker started for a retiring model is closed without ever being connected.
func (c *Core) spawned(in Spawned) {
	m := c.models[in.Gen.Lane]
	if m == nil || !m.spawning || in.Gen != m.spawnGen {
		// No such spawn is in flight: a late or repeated report of an earlier attempt (a retry
		// after a failed start has the same number, never the same Gen).
		return
	}
	m.spawning = false
	first := m.gen == nil // LoadModel waits for this one
	lane := m.spec.Lane
	if in.Err != nil {
		switch {
		case first:
			c.log.Info("the lane's first worker did not start", "lane", lane, "error", in.Err.Error())
			c.emit(Loaded{Lane: lane, Err: fmt.Errorf("starting the worker of lane %s: %w", lane, in.Err)})
			c.gone(m, refusal.New(refusal.EngineCrashed, lane, "the lane's worker did not start: %v", in.Err))
		case m.state == retiring:
			c.gone(m, nil)
		default:
			m.spawnFailures++
			backoff := time.Second << min(m.spawnFailures-1, 6)
			m.spawnRetryAt = c.now.Add(backoff)
			c.log.Error(in.Err, "starting a replacement worker failed; retrying", "lane", lane, "generation", in.Gen.N, "retryIn", backoff)
			c.failQueued(m, in.Err)
		}
		return
	}
	m.spawnFailures = 0
	in.Gen.Conn = in.Conn
	m.gen = in.Gen
	if m.state == retiring {
		c.log.Info("the lane retired while its worker started; closing it unconnected", "lane", lane, "generation", in.Gen.N)
		if first {
			c.emit(Loaded{Lane: lane, Err: fmt.Errorf("lane %s was retired while its worker started", lane)})
		}
		c.confirmExit(m)
		return
	}
	m.state = running
	m.cached = map[int]bool{}
	for _, r := range in.Cached {
		m.cached[r] = true
	}
	c.queue.SetRecovering(m.owner(), false)
	if first {
		c.emit(Loaded{Lane: lane})
		return
	}
	m.restarts++
	c.counts.Restarts++
	c.log.Info("replacement worker connected", "lane", lane, "generation", in.Gen.N)
}

// failQueued answers the requests queued for m's next worker, whose start just failed: as
// route answers every new one, they fail loudly now rather than wait to their bound for a
// worker that may never come. The jobs stay queued for the promises they made, and run if a
// replacement starts in time.
func (c *Core) failQueued(m *model, err error) {
	for _, j := range c.queue.Queued() {
		if j.Owner != m.owner() {
			continue
		}
		c.answerJob(j, func(w *waiter) error {
			return refusal.New(refusal.BackendUnavailable, w.Lane, "worker generation %d is dead and its replacement failed to start (%v); the next attempt is at %s, and the request is not sent elsewhere",
				m.genN(), err, m.spawnRetryAt.UTC().Format(time.RFC3339))
		})
	}
}

// fault starts the confirmed-exit recovery of generation g after an I/O error, a malformed
// reply or a bounded call that failed. One fault restarts its generation once: a fault reported
// for another generation, or while its exit is already being confirmed, is stale and ignored,
// so it never restarts a recovered owner.
func (c *Core) fault(m *model, g *Gen, err error) {
	if m.gen != g || !m.live() || m.exiting || (m.state != running && m.state != retiring) {
		c.log.V(1).Info("ignoring a stale worker fault", "lane", m.spec.Lane, "generation", g.N, "current", m.genN(), "error", err.Error())
		return
	}
	c.log.Info("worker faulted; confirming its exit before a replacement starts", "lane", m.spec.Lane, "generation", g.N, "error", err.Error())
	if m.state == running {
		m.state = recovering
	}
	m.restartBegan = c.now
	m.lastFault = &Fault{Code: string(refusal.EngineCrashed), Message: fmt.Sprintf("worker generation %d: %v", g.N, err), At: c.now}
	g.MarkFaulted()
	c.queue.SetRecovering(m.owner(), true)
	c.cancelPrewarmRun(m)
	for _, sh := range m.shapes {
		if sh.cell != nil {
			sh.cell.setBits(closedBit)
		}
		// The probe on this generation cannot give a verdict: its requests fail, and the
		// replacement probes its own load afresh.
		for _, t := range append([]Ticket(nil), sh.probe.waiters...) {
			if w := c.waiters[t]; w != nil {
				c.refuse(w, refusal.EngineCrashed, "worker generation %d failed before rung %d's placement probe finished: %v", g.N, sh.rung, err)
			}
		}
	}
	// Requests behind a starved head for this lane are routed again: they queue for the
	// replacement.
	for _, t := range append([]Ticket(nil), c.blocked...) {
		if w := c.waiters[t]; w.Lane == m.spec.Lane {
			c.routeAgain(w)
		}
	}
	c.confirmExit(m)
}

func (c *Core) confirmExit(m *model) {
	m.exiting = true
	c.emit(ConfirmExit{Gen: m.gen})
}

// exited releases every slot of the exited process: its shapes' charges, the compile gate an
// admission of it held, the admission it was running (whose requests fail). Then it finishes a
// retirement or spawns the replacement.
func (c *Core) exited(in Exited) {
	m := c.current(in.Gen)
	if m == nil || !m.exiting {
		return
	}
	m.exiting = false
	m.exitedGen = in.Gen.N
	lane := m.spec.Lane
	c.trace(Event{Kind: EventExitConfirmed, Lane: lane})
	if h := c.hold; h != nil && h.gen == in.Gen {
		c.queue.Finish(h.job)
		c.hold = nil
	}
	for _, sh := range append([]*shape(nil), m.shapes...) {
		if j := sh.unpark; j != nil {
			sh.unpark = nil
			c.queue.Unpark(j)
		}
		if sh.state == admitting {
			// The process is gone but the admission's call has not returned yet: its requests
			// fail now, and it keeps the gate until the call returns (at most the hold).
			c.answerJob(sh.job, func(w *waiter) error {
				return refusal.New(refusal.EngineCrashed, lane, "worker generation %d exited while admitting rung %d", in.Gen.N, sh.rung)
			})
			c.prewarmEnded(m, sh.job, false, "Cancelled")
			if c.queue.Running() == sh.job {
				c.holdGate(sh.job, sh.load, in.Gen, c.holdUntil(m), true)
			}
		}
		c.refund(m, sh)
	}
	m.busy, m.moving, m.admitting = 0, 0, nil
	c.log.Info("worker exit confirmed; its reservations are refunded", "lane", lane, "generation", in.Gen.N)
	if m.state == retiring {
		c.gone(m, nil)
		return
	}
	c.spawn(m)
}

// retire unloads a lane: it stops new leases and replacement spawning, drops its queued
// admissions and answers its waiting requests; drive then drains in-flight work, closes the
// worker's channel and confirms its exit, and only then are its reservations refunded.
func (c *Core) retire(lane string) {
	m := c.models[lane]
	if m == nil {
		c.emit(Retired{Lane: lane})
		return
	}
	if m.state == retiring {
		return // already on its way; Retired comes once
	}
	m.state = retiring
	c.log.Info("retiring lane", "lane", lane, "generation", m.genN())
	c.cancelPrewarm(m)
	for _, j := range c.queue.DropOwner(m.owner()) {
		c.answerJob(j, func(*waiter) error {
			return refusal.New(refusal.LaneRetired, lane, "the lane is being unloaded from this node")
		})
	}
	for _, t := range sortedTickets(c.waiters) {
		if w := c.waiters[t]; w.Lane == lane {
			c.refuse(w, refusal.LaneRetired, "the lane is being unloaded from this node")
		}
	}
	for _, sh := range m.shapes {
		if sh.cell != nil {
			sh.cell.setBits(closedBit | watchBit)
		}
		sh.cohort = nil
	}
}

// drive moves a model's retirement and failed spawns along.
func (c *Core) drive(m *model) {
	switch {
	case m.state == retiring && !m.exiting && !m.spawning && m.live():
		if m.leases() == 0 && m.busy == 0 {
			// Drained: close the channel and confirm the exit before refunding anything.
			c.confirmExit(m)
		}
	case m.state == retiring && !m.exiting && !m.spawning:
		// No process is left (its exit is confirmed and no replacement started).
		c.gone(m, nil)
	case m.state == recovering && !m.exiting && !m.spawning && !m.spawnRetryAt.IsZero():
		if c.now.Before(m.spawnRetryAt) {
			c.soon(m.spawnRetryAt)
			return
		}
		c.spawn(m)
	}
}

// gone removes a model whose worker is not running (never started, or its exit is confirmed),
// answering whoever still waits on it with why.
func (c *Core) gone(m *model, why error) {
	lane := m.spec.Lane
	for _, j := range c.queue.DropOwner(m.owner()) {
		c.answerJob(j, func(*waiter) error { return why })
	}
	for _, t := range sortedTickets(c.waiters) {
		if w := c.waiters[t]; w.Lane == lane {
			err := why
			if err == nil {
				err = refusal.New(refusal.LaneRetired, lane, "the lane was unloaded from this node")
			}
			c.answer(w, Answer{Err: err})
		}
	}
	wasRetiring := m.state == retiring
	c.removeModel(m)
	if wasRetiring {
		c.emit(Retired{Lane: lane})
		c.log.Info("lane retired; worker exit confirmed and reservations refunded", "lane", lane)
	}
}

// holdGate keeps the compile gate for j, an admission (attempt load) of unknown outcome, until
// gen's exit is confirmed (or, if outstanding, until that attempt's call returns), and at the
// latest until: the queue predicts the gate busy until then.
func (c *Core) holdGate(j *compilequeue.Job, load uint64, gen *Gen, until time.Time, outstanding bool) {
	c.queue.Fail(j, until)
	c.hold = &gateHold{job: j, load: load, gen: gen, until: until, outstanding: outstanding}
}

// holdUntil is when an unknown outcome of m's current generation stops holding the gate:
// UnknownOutcomeGateHold after its restart began.
func (c *Core) holdUntil(m *model) time.Time {
	began := m.restartBegan
	if began.IsZero() {
		began = c.now
	}
	return began.Add(UnknownOutcomeGateHold)
}
