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
	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// acquire takes a slow-path request.
func (c *Core) acquire(in Acquire) {
	if _, dup := c.waiters[in.Ticket]; dup {
		panic("residency: a ticket is waiting twice")
	}
	if in.Since.IsZero() || in.Since.After(c.now) {
		in.Since = c.now
	}
	w := &waiter{Acquire: in}
	if m := c.models[in.Lane]; m != nil {
		w.boundAt = in.Since.Add(m.spec.AdmissionBound)
	}
	c.waiters[in.Ticket] = w
	c.route(w)
}

// leave withdraws a waiter whose caller gave up, wherever it waits, and its cohort membership.
func (c *Core) leave(t Ticket) {
	if w := c.waiters[t]; w != nil {
		c.unwait(w)
	}
	for _, lane := range c.lanes {
		for _, sh := range c.models[lane].shapes {
			if sh.cohort != nil {
				delete(sh.cohort.members, t)
			}
		}
	}
}

// route is the locked grant decision for a slow-path request: every check is made here, by
// the one owner, so a request that passed a stale check elsewhere reserves nothing.
func (c *Core) route(w *waiter) {
	m := c.models[w.Lane]
	switch {
	case m == nil:
		c.refuse(w, refusal.UnknownLane, "no such lane is loaded on this node")
		return
	case m.state == retiring:
		c.refuse(w, refusal.LaneRetired, "the lane is being unloaded from this node")
		return
	case !w.Deadline.IsZero() && !c.now.Before(w.Deadline):
		c.refuse(w, refusal.DeadlineExceeded, "the request's deadline passed before it could be served")
		return
	case !m.spec.fits(w.Rung):
		c.refuse(w, refusal.UnsupportedShape, "rung %d is not in the lane's ladder %v", w.Rung, m.spec.Rungs)
		return
	case m.state == recovering && m.spawnFailures > 0:
		// The worker is dead and its replacement failed to start: waiting would be for
		// nothing. Every request fails loudly until one serves; none goes elsewhere.
		c.refuse(w, refusal.BackendUnavailable, "worker generation %d is dead and its replacement failed to start; the next attempt is at %s, and the request is not sent elsewhere",
			m.genN(), m.spawnRetryAt.UTC().Format("2006-01-02T15:04:05Z07:00"))
		return
	}
	sh := m.shape(w.Rung)
	if w.ResidentOnly {
		if m.state != running || sh == nil || sh.state != resident {
			c.answer(w, Answer{})
			return
		}
		c.gateOnProbe(w, m, sh, func() { c.answer(w, Answer{Resident: true}) })
		return
	}
	if m.state == running && sh != nil && sh.state == resident {
		c.gateOnProbe(w, m, sh, func() { c.leaseFor(w, m, sh) })
		return
	}
	if m.spec.Layers > c.budget {
		c.refuse(w, refusal.ResourcesExhausted, "one shape needs %d layer executables, more than the machine's %d", m.spec.Layers, c.budget)
		return
	}
	a := c.queue.Submit(c.now, compilequeue.Request{
		Ticket: w.Ticket, Owner: m.owner(), Shape: compilequeue.Shape{Model: m.spec.Identity, Rung: w.Rung},
		Layers: m.spec.Layers, Cached: m.cached[w.Rung], Deadline: w.Deadline, Bound: m.spec.AdmissionBound, Since: w.Since,
	})
	if !a.Accepted {
		c.answer(w, Answer{Err: &refusal.Error{Code: refusal.ShapeCompiling, Lane: w.Lane, RetryAfter: a.RetryAfter,
			Message: "rung is predicted ready only after the request's deadline or admission bound; its compile stays queued"}})
		return
	}
	w.job = c.queue.Find(m.owner(), compilequeue.Shape{Model: m.spec.Identity, Rung: w.Rung})
	c.trace(Event{Kind: EventQueueEntry, RequestID: w.RequestID, Lane: w.Lane, Rung: w.Rung, Ticket: uint64(w.Ticket)})
}

// gateOnProbe runs then once the shape's placement probe has passed: at once, or when the probe
// it starts or joins passes. A failed probe refuses.
func (c *Core) gateOnProbe(w *waiter, m *model, sh *shape, then func()) {
	switch {
	case sh.probe.failed != nil:
		c.answer(w, Answer{Err: sh.probe.failed})
	case sh.probe.passed || m.spec.Probe == nil:
		then()
	default:
		c.waitForProbe(w, m, sh)
	}
}

// leaseFor leases a resident, probed shape for w, unless a starved budget head waits and w is
// not a member of the shape's handoff cohort: then w waits behind the head.
func (c *Core) leaseFor(w *waiter, m *model, sh *shape) {
	member := w.Member && sh.cohort.protects(c.now) && sh.cohort.members[w.Ticket]
	if c.yields(w.Lane) && !member {
		c.block(w)
		return
	}
	if ok, _ := sh.cell.lease(closedBit); !ok {
		// The generation faulted and the core has not heard yet (the faulting lease is still
		// held): wait for the recovery, which routes it again.
		c.block(w)
		return
	}
	if member {
		delete(sh.cohort.members, w.Ticket)
	}
	c.answer(w, Answer{Cell: sh.cell})
}

func (c *Core) block(w *waiter) {
	w.blocked = true
	c.blocked = append(c.blocked, w.Ticket)
}

// routeAgain takes w from where it waits and routes it again later in this pass.
func (c *Core) routeAgain(w *waiter) {
	c.unwait(w)
	c.waiters[w.Ticket] = w
	c.reroute = append(c.reroute, w.Ticket)
}
