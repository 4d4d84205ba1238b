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
)

// CheckInvariants checks the core's own consistency, recomputing every derived figure from
// scratch: the simulator runs it after every step. It reports the first broken rule.
func (c *Core) CheckInvariants() error {
	if c.stopped != nil {
		return nil
	}
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	// The budget: the charges recomputed from the shapes, and never past the machine's.
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
			}
		}
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
	if sum != c.used {
		errs = append(errs, fmt.Errorf("charged %d executables, but the shapes add up to %d", c.used, sum))
	}
	if c.used > c.budget {
		fail("charged %d executables, over the budget of %d", c.used, c.budget)
	}
	if c.cfg.CertifyObservation && c.admittedCount != held {
		fail("the independent admission count is %d, but %d shapes are resident or evicting", c.admittedCount, held)
	}

	// The gate: one running job, admitting exactly one shape of a live generation, or held
	// for an unknown outcome.
	if j := c.queue.Running(); j != nil {
		if c.queue.Failed() {
			if c.hold == nil || c.hold.job != j {
				fail("a failed admission holds the gate without a hold")
			}
		} else {
			m := c.models[j.Owner]
			var sh *shape
			if m != nil {
				sh = m.shape(j.Shape.Rung)
			}
			if sh == nil || sh.state != admitting || sh.job != j || !m.live() {
				fail("the gate is held by %s/%d, which admits nothing", j.Owner, j.Shape.Rung)
			}
		}
	} else if c.hold != nil {
		fail("a hold remains after the gate was freed")
	}
	jobs := c.queue.Queued()
	if j := c.queue.Running(); j != nil {
		jobs = append(jobs, j)
	}
	for _, j := range jobs {
		for _, t := range j.Waiters() {
			if w := c.waiters[t]; w == nil || w.job != j {
				fail("ticket %d is held by %s/%d but does not wait for it", t, j.Owner, j.Shape.Rung)
			}
		}
	}
	for _, j := range c.queue.Queued() {
		if c.models[j.Owner] == nil {
			fail("a job of %s, which is not loaded, is queued", j.Owner)
		}
		if len(j.Waiters()) == 0 && !c.now.Before(j.DropAt()) {
			fail("%s/%d is queued past the time it should have been dropped", j.Owner, j.Shape.Rung)
		}
	}

	// Every request waits in exactly one place, and every place holds only waiting requests.
	for _, t := range sortedTickets(c.waiters) {
		w := c.waiters[t]
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
	return errors.Join(errs...)
}
