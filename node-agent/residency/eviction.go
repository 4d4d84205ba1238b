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
	"cmp"
	"slices"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// victim is an eviction candidate.
type victim struct {
	m  *model
	sh *shape
	// The order of preference, most evictable first.
	busy, demanded, smallest bool
	use                      int64
}

// starvation is what a head that cannot be made room for now asks of resident traffic.
type starvation int

const (
	// roomMade: the head will find budget and a shape slot (evictions may be on their way).
	roomMade starvation = iota
	// waitWithoutStarving: nothing that is leased could make room either (the charges belong to
	// admissions, evictions or exiting workers, which free them by themselves): resident
	// traffic does not yield.
	waitWithoutStarving
	// starveOwnLane: the head lacks only a shape slot of its own model, whose leased shapes will
	// free one: that lane's resident traffic yields, no other's.
	starveOwnLane
	// starveAll: releasing leased shapes can free the budget the head needs: every lane's
	// resident traffic yields to it.
	starveAll
)

// makeRoom makes sure the head's admission will find budget and a shape slot when the gate
// frees: it evicts ahead of time, while the running compile finishes, so the head's compile
// starts at once. Otherwise it says what the head waits for, and whose resident traffic must
// yield to it.
func (c *Core) makeRoom(head *compilequeue.Job) starvation {
	m := c.models[head.Owner]
	if m == nil || m.state != running {
		return roomMade // nothing to make room for until the worker is back
	}
	if sh := m.shape(head.Shape.Rung); sh != nil && sh.state == resident {
		// Its eviction was refused: the shape is resident again, and the head is dropped at the
		// gate for its requests to lease it. Evicting the shape to admit it again would be waste.
		return roomMade
	}
	free := c.budget - c.used
	slots := m.spec.MaxResidentShapes - len(m.shapes)
	for _, lane := range c.lanes {
		mm := c.models[lane]
		for _, sh := range mm.shapes {
			if sh.state == evicting {
				free += sh.charge
				if mm == m {
					slots++
				}
			}
		}
	}
	if free >= head.Layers && slots >= 1 {
		return roomMade
	}
	candidates := c.candidates()
	var picked []victim
	// A model at its shape limit evicts one of its own shapes.
	if slots < 1 {
		i := slices.IndexFunc(candidates, func(v victim) bool { return v.m == m })
		if i < 0 {
			if slices.ContainsFunc(m.shapes, func(sh *shape) bool { return sh.state == resident }) {
				return starveOwnLane // its own leased shapes will free a slot
			}
			return waitWithoutStarving // its shapes are admitting or evicting: a slot frees by itself
		}
		picked = append(picked, candidates[i])
		free += candidates[i].sh.charge
		candidates = slices.Delete(candidates, i, i+1)
	}
	for _, v := range candidates {
		if free >= head.Layers {
			break
		}
		picked = append(picked, v)
		free += v.sh.charge
	}
	if free < head.Layers {
		// Would the release of leased (or protected) resident shapes free enough? Only then is
		// it worth making resident traffic yield.
		for _, lane := range c.lanes {
			mm := c.models[lane]
			if mm.state != running {
				continue
			}
			for _, sh := range mm.shapes {
				if sh.state == resident && !slices.ContainsFunc(candidates, func(v victim) bool { return v.sh == sh }) &&
					!slices.ContainsFunc(picked, func(v victim) bool { return v.sh == sh }) {
					free += sh.charge
				}
			}
		}
		if free >= head.Layers {
			return starveAll
		}
		return waitWithoutStarving
	}
	for _, v := range picked {
		if !v.sh.cell.closeIfFree() {
			// Leased at this very instant: look again at once (the lease's release also wakes us).
			c.soon(c.now)
			return waitWithoutStarving
		}
		c.evict(v.m, v.sh, nil)
	}
	return roomMade
}

// candidates lists the shapes that may be evicted, most evictable first: never a leased shape,
// one a handoff cohort protects, one whose probe runs, or one of a worker that is not running.
// Among the rest an idle worker stream goes first, then a shape no request waits for, then a
// rung that is not the model's smallest, then the least recently used. A busy stream's shape
// stays a candidate, last, for when the idle ones cannot free enough.
func (c *Core) candidates() []victim {
	demand := map[*shape]bool{}
	for _, t := range sortedTickets(c.waiters) {
		w := c.waiters[t]
		if m := c.models[w.Lane]; m != nil && (w.blocked || w.probing != nil) {
			if sh := m.shape(w.Rung); sh != nil {
				demand[sh] = true
			}
		}
	}
	var out []victim
	for _, lane := range c.lanes {
		m := c.models[lane]
		if m.state != running {
			continue
		}
		for _, sh := range m.shapes {
			if sh.state != resident || sh.cell.Leases() > 0 || sh.cell.has(closedBit) || sh.cohort.protects(c.now) || sh.probe.running {
				continue
			}
			out = append(out, victim{m: m, sh: sh, busy: !m.idle(), demanded: demand[sh],
				smallest: sh.rung == m.smallestRung(), use: sh.cell.use.Load()})
		}
	}
	slices.SortStableFunc(out, func(a, b victim) int {
		for _, p := range [][2]bool{{a.busy, b.busy}, {a.demanded, b.demanded}, {a.smallest, b.smallest}} {
			if p[0] != p[1] {
				if p[0] {
					return 1
				}
				return -1
			}
		}
		return cmp.Compare(a.use, b.use)
	})
	return out
}

// evict dispatches the release of a shape whose cell the caller closed. Its charge stays
// counted until the worker acknowledges; a busy stream only delays the release, it is never a
// reason to refund early. unpark, if set, is an admission parked until the release is done.
func (c *Core) evict(m *model, sh *shape, unpark *compilequeue.Job) {
	sh.state = evicting
	sh.unpark = unpark
	sh.attempt = c.nextAttempt()
	m.busy++
	m.moving++
	c.trace(Event{Kind: EventEvictionDispatch, Lane: m.spec.Lane, Rung: sh.rung})
	c.emit(Evict{Gen: m.gen, Load: sh.load, Attempt: sh.attempt, Rung: sh.rung, Cell: sh.cell})
}

// evicted applies an eviction's outcome.
func (c *Core) evicted(in Evicted) {
	m := c.current(in.Gen)
	if m == nil {
		return // the exit was confirmed first: it refunded the shape and unparked its retry
	}
	sh := m.shapeByLoad(in.Load)
	if sh == nil || sh.state != evicting || sh.unknownOutcome || sh.attempt != in.Attempt {
		return
	}
	m.busy--
	m.moving--
	if j := sh.unpark; j != nil {
		sh.unpark = nil
		c.queue.Unpark(j)
	}
	switch {
	case in.Err == nil:
		m.removeShape(sh)
		c.used -= sh.charge
		c.counts.Evictions++
		if c.cfg.CertifyObservation {
			c.admittedCount--
		}
		c.trace(Event{Kind: EventEvictionAck, Lane: m.spec.Lane, Rung: sh.rung, Charge: sh.charge, Used: c.used})
	case IsWorkerError(in.Err):
		c.log.Info("the worker refused to release a shape; it stays resident", "lane", m.spec.Lane, "rung", sh.rung, "error", in.Err.Error())
		sh.state = resident
		if m.state == running {
			sh.cell.clearBits(closedBit)
		}
	default:
		// The outcome is unknown: the charge stays until the old process's exit is confirmed.
		sh.unknownOutcome = true
		c.fault(m, in.Gen, in.Err)
	}
}
