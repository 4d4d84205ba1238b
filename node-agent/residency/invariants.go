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
	"errors"
	"fmt"
	"slices"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// CheckInvariants checks the core's own consistency, recomputing every derived figure from
// scratch: the simulator runs it after every step, and so does every hand-driven test. It
// reports every broken rule, one group of the seed's rules at a time.
func (c *Core) CheckInvariants() error {
	if c.stopped != nil {
		return nil
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	c.checkBudget(fail)
	c.checkModels(fail)
	c.checkGate(fail)
	c.checkQueue(fail)
	c.checkWaiters(fail)
	c.checkProgress(fail)
	return errors.Join(errs...)
}

type failf func(format string, args ...any)

// checkBudget: the charges recomputed from the shapes, never past the machine's budget or a
// model's shape limit; a shape being evicted is closed to leases, never leased, never one a
// handoff cohort protects.
func (c *Core) checkBudget(fail failf) {
	sum, held := 0, 0
	for _, lane := range c.lanes {
		m := c.models[lane]
		if len(m.shapes) > m.spec.MaxResidentShapes {
			fail("%s holds %d shapes, over its limit of %d", lane, len(m.shapes), m.spec.MaxResidentShapes)
		}
		for i, sh := range m.shapes {
			sum += sh.charge
			if sh.state != admitting {
				held++
			}
			if i > 0 && m.shapes[i-1].rung >= sh.rung {
				fail("%s's shapes are not one per rung in order", lane)
			}
			switch {
			case sh.state == admitting && (sh.job == nil || sh.cell != nil):
				fail("%s/%d admits without a job, or has a cell", lane, sh.rung)
			case sh.state != admitting && sh.cell == nil:
				fail("%s/%d is resident or evicting without a cell", lane, sh.rung)
			case sh.state == evicting && !sh.cell.has(closedBit):
				fail("%s/%d is being evicted but its cell is open to leases", lane, sh.rung)
			case sh.state == evicting && sh.cell.Leases() > 0 && m.state == running:
				fail("%s/%d is being evicted while %d leases hold it", lane, sh.rung, sh.cell.Leases())
			case sh.state == evicting && sh.cohort.protects(c.now):
				fail("%s/%d is being evicted while its handoff cohort still protects it", lane, sh.rung)
			}
		}
	}
	if sum != c.used {
		fail("charged %d executables, but the shapes add up to %d", c.used, sum)
	}
	if c.used > c.budget {
		fail("charged %d executables, over the budget of %d", c.used, c.budget)
	}
	if c.cfg.CertifyObservation && c.admittedCount != held {
		fail("the independent admission count is %d, but %d shapes are resident or evicting", c.admittedCount, held)
	}
}

// checkModels: each model's state says what its generation may be doing.
func (c *Core) checkModels(fail failf) {
	for _, lane := range c.lanes {
		m := c.models[lane]
		if m.busy < 0 || m.moving < 0 || m.moving > m.busy {
			fail("%s counts %d calls in flight, %d moving shapes", lane, m.busy, m.moving)
		}
		switch m.state {
		case loading:
			if !m.spawning || m.gen != nil {
				fail("%s is loading without its first spawn in flight", lane)
			}
		case running:
			if m.gen == nil || !m.live() || m.exiting || m.spawning {
				fail("%s runs without a live, connected generation", lane)
			}
		case recovering:
			if !m.exiting && !m.spawning && m.spawnRetryAt.IsZero() {
				fail("%s recovers but neither confirms an exit nor spawns", lane)
			}
		}
	}
}

// checkGate: at most one admission holds the compile gate: a running job admitting exactly one
// shape of a live generation, after its start hold, or a failed one held for its unknown
// outcome, which ends at its worker's confirmed exit or at most UnknownOutcomeGateHold after
// the restart began. A worker's own error answer frees the gate at once, so a hold is only
// ever of an unknown outcome.
func (c *Core) checkGate(fail failf) {
	j := c.queue.Running()
	if j == nil {
		if c.hold != nil {
			fail("a hold remains after the gate was freed")
		}
		return
	}
	if !c.queue.Failed() {
		m := c.models[j.Owner]
		var sh *shape
		if m != nil {
			sh = m.shape(j.Shape.Rung)
		}
		if sh == nil || sh.state != admitting || sh.job != j || !m.live() {
			fail("the gate is held by %s/%d, which admits nothing", j.Owner, j.Shape.Rung)
		}
		if started := c.queue.StartedAt(); !j.Background && !j.Retried && !j.Recycled && started.Before(j.Arrival.Add(compilequeue.StartHold)) {
			fail("%s/%d took the gate %s after it arrived, before its %s start hold", j.Owner, j.Shape.Rung, started.Sub(j.Arrival), compilequeue.StartHold)
		}
		return
	}
	h := c.hold
	if h == nil || h.job != j {
		fail("a failed admission holds the gate without a hold")
		return
	}
	if !c.now.Before(h.until) {
		fail("the unknown outcome of %s/%d still holds the gate %s after its hold ended", j.Owner, j.Shape.Rung, c.now.Sub(h.until))
	}
	if m := c.models[h.gen.Lane]; m != nil && !m.restartBegan.IsZero() && h.until.After(m.restartBegan.Add(UnknownOutcomeGateHold)) {
		fail("%s/%d's hold ends %s after its worker's restart began, past %s", j.Owner, j.Shape.Rung, h.until.Sub(m.restartBegan), UnknownOutcomeGateHold)
	}
	if !h.outstanding {
		m := c.current(h.gen)
		var sh *shape
		if m != nil {
			sh = m.shape(j.Shape.Rung)
		}
		if sh == nil || sh.job != j || !sh.unknownOutcome {
			fail("%s/%d holds the gate, but its outcome is not unknown (a worker's error answer frees it at once)", j.Owner, j.Shape.Rung)
		}
	}
}

// checkQueue: every job's waiters wait for it; one job per (owner, shape); queued jobs belong to
// loaded lanes that are not retiring, start in start-key order, and one nobody waits for is
// gone by twice its last promise.
func (c *Core) checkQueue(fail failf) {
	jobs := c.queue.Queued()
	if j := c.queue.Running(); j != nil && !c.queue.Failed() {
		jobs = append(jobs, j)
	}
	type key struct {
		owner string
		shape compilequeue.Shape
	}
	seen := map[key]bool{}
	for _, j := range jobs {
		if k := (key{j.Owner, j.Shape}); seen[k] {
			fail("two admissions of %s/%d: requests for one shape must join one", j.Owner, j.Shape.Rung)
		} else {
			seen[k] = true
		}
		for _, t := range j.Waiters() {
			if w := c.waiters[t]; w == nil || w.job != j {
				fail("ticket %d is held by %s/%d but does not wait for it", t, j.Owner, j.Shape.Rung)
			}
		}
	}
	for _, j := range c.queue.Queued() {
		switch m := c.models[j.Owner]; {
		case m == nil:
			fail("a job of %s, which is not loaded, is queued", j.Owner)
		case m.state == retiring:
			fail("a job of %s, which is retiring, is still queued", j.Owner)
		}
		if len(j.Waiters()) == 0 && !c.now.Before(j.DropAt()) {
			fail("%s/%d is queued past the time it should have been dropped", j.Owner, j.Shape.Rung)
		}
	}
	if err := c.queue.CheckOrder(); err != nil {
		fail("queue order: %v", err)
	}
	for _, j := range c.queue.Queued() {
		if j.Parked() && !c.unparks(j) {
			fail("%s/%d is parked for an eviction that no shape is being released for: it would wait for ever", j.Owner, j.Shape.Rung)
		}
	}
}

// unparks reports whether an eviction on its way will unpark j.
func (c *Core) unparks(j *compilequeue.Job) bool {
	for _, lane := range c.lanes {
		for _, sh := range c.models[lane].shapes {
			if sh.unpark == j {
				return true
			}
		}
	}
	return false
}

// checkWaiters: every request waits in exactly one place, and every place holds only waiting
// requests; a retiring lane has none.
func (c *Core) checkWaiters(fail failf) {
	for _, t := range sortedTickets(c.waiters) {
		w := c.waiters[t]
		if m := c.models[w.Lane]; m != nil && m.state == retiring {
			fail("ticket %d still waits on %s, which is retiring", t, w.Lane)
		}
		places := 0
		if w.job != nil {
			places++
			if !w.job.HasWaiter(t) || (c.queue.Running() != w.job && !c.queue.Queues(w.job)) {
				fail("ticket %d waits for a job that does not hold it", t)
			}
		}
		if w.probing != nil {
			places++
			if !slices.Contains(w.probing.probe.waiters, t) {
				fail("ticket %d waits for a probe that does not hold it", t)
			}
		}
		if w.blocked {
			places++
			if !slices.Contains(c.blocked, t) {
				fail("ticket %d is blocked but not in the blocked list", t)
			}
		}
		if places != 1 {
			fail("ticket %d waits in %d places", t, places)
		}
	}
	for _, t := range c.blocked {
		if w := c.waiters[t]; w == nil || !w.blocked {
			fail("blocked ticket %d does not wait", t)
		}
	}
	if c.starved && c.queue.Head() == nil {
		fail("starved without a head")
	}
}

// checkProgress: the scheduler is work-conserving, and it answers at once what it cannot serve.
// After a pass, no request waits for the queue's head while the head is predicted ready after
// the request's limit (the head is checked before anything is dispatched or evicted for it),
// and the gate is not left free while the head could start now (its worker runs, its start
// hold has passed, nothing parks it, it fits the budget and a shape slot). Unless an
// observation holds every admission back, or the core asked to be stepped again at once.
func (c *Core) checkProgress(fail failf) {
	if c.observing() || (!c.next.IsZero() && !c.next.After(c.now)) {
		return
	}
	if h := c.queue.Head(); h != nil {
		ready := c.queue.ReadyAt(c.now, h)
		for _, t := range h.Waiters() {
			if lim := h.Limit(t); ready.After(lim) {
				fail("ticket %d still waits for %s/%d, predicted ready %s after its limit", t, h.Owner, h.Shape.Rung, ready.Sub(lim))
			}
		}
	}
	if c.queue.Running() != nil {
		return
	}
	j := c.queue.Head()
	if j == nil || j.Parked() {
		return
	}
	if hold := j.Arrival.Add(compilequeue.StartHold); c.now.Before(hold) && !j.Retried && !j.Recycled {
		return
	}
	if c.fitsNow(j) {
		fail("the gate is free and %s/%d could start now, but nothing started it", j.Owner, j.Shape.Rung)
	}
}
