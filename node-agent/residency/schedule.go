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

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// schedule is one pass: it moves every model's life along, answers the requests whose time is
// up, makes room for the queue's head, starts the next admission, lets blocked requests lease
// once no head is starved, prewarms when nothing else waits, and sets when to look again.
func (c *Core) schedule() {
	now := c.now
	c.next = time.Time{}

	for _, lane := range append([]string(nil), c.lanes...) {
		c.drive(c.models[lane])
	}
	if h := c.hold; h != nil {
		if now.Before(h.until) {
			c.soon(h.until)
		} else {
			// The unknown outcome's hold is over though the exit is unconfirmed: the gate frees;
			// the charge stays until the exit is confirmed.
			c.queue.Finish(h.job)
			c.hold = nil
		}
	}

	_, refused, t := c.queue.Expire(now)
	c.soon(t)
	c.refuseQueued(refused)
	c.expireWaiters()

	for _, lane := range c.lanes {
		for _, sh := range c.models[lane].shapes {
			if sh.cohort == nil {
				continue
			}
			if sh.cohort.protects(now) {
				c.soon(sh.cohort.expires)
			} else {
				// Every member leased or left, or the window closed: the shape is an ordinary
				// resident again, and a starved head may evict it.
				sh.cohort = nil
			}
		}
	}
	_, at := c.queue.Reprice(now)
	c.soon(at)

	reroute := c.reroute
	c.reroute = nil
	for _, t := range reroute {
		if w := c.waiters[t]; w != nil && w.job == nil && w.probing == nil && !w.blocked {
			c.route(w)
		}
	}

	c.starved, c.starvedLane = false, ""
	if !c.observing() {
		if head := c.queue.Head(); head != nil {
			c.refuseQueued(c.queue.CheckHead(now, head))
			switch c.makeRoom(head) {
			case starveAll:
				c.starved = true
			case starveOwnLane:
				c.starved, c.starvedLane = true, head.Owner
			}
		}
		j, refused, wake := c.queue.Elect(now)
		c.soon(wake)
		c.refuseQueued(refused)
		if j != nil {
			c.startOrResolve(j)
			// The next head's requests are checked against their bounds now, not a pass later:
			// one predicted ready too late is answered at once.
			if head := c.queue.Head(); head != nil {
				c.refuseQueued(c.queue.CheckHead(now, head))
			}
		}
	}

	// Requests behind a starved head lease once it has its budget; those of a lane that is
	// no longer running are routed again at once.
	blocked := c.blocked
	c.blocked = nil
	for _, t := range blocked {
		w := c.waiters[t]
		if m := c.models[w.Lane]; c.yields(w.Lane) && m != nil && m.state == running {
			c.blocked = append(c.blocked, t)
			continue
		}
		w.blocked = false
		c.route(w)
	}

	if !c.observing() {
		c.drivePrewarm()
	}
	c.driveObservation()
	c.watch()
	// Waiters answered in this pass may have left a job nobody waits for past its drop time.
	// (Not the starved head's: a refusal moves its drop time, so it is never dropped here.)
	_, refused, t = c.queue.Expire(now)
	c.soon(t)
	c.refuseQueued(refused)
}

// expireWaiters answers the requests that wait outside the queue (behind a starved head or on
// a placement probe) once their deadline or admission bound is reached.
func (c *Core) expireWaiters() {
	for _, t := range sortedTickets(c.waiters) {
		w := c.waiters[t]
		if w.job != nil {
			continue // the queue answers its own waiters at their limits
		}
		lim := w.limit()
		if lim.IsZero() {
			continue
		}
		if c.now.Before(lim) {
			c.soon(lim)
			continue
		}
		if !w.Deadline.IsZero() && !c.now.Before(w.Deadline) {
			c.refuse(w, refusal.DeadlineExceeded, "the request's deadline passed while it waited for rung %d", w.Rung)
			continue
		}
		retry := MinRetryAfter
		if head := c.queue.Head(); head != nil {
			retry = max(retry, c.queue.ReadyAt(c.now, head).Sub(c.now))
		}
		c.answer(w, Answer{Err: &refusal.Error{Code: refusal.ShapeCompiling, Lane: w.Lane, RetryAfter: retry,
			Message: "the request's admission bound passed while the Neural Engine admitted a shape another request waits for"}})
	}
}

// refuseQueued answers queued waiters the queue gave up on.
func (c *Core) refuseQueued(refused []compilequeue.Refusal) {
	for _, r := range refused {
		w := c.waiters[r.Ticket]
		if w == nil {
			continue
		}
		w.job = nil // the queue already let it go
		if r.DeadlineExceeded {
			c.refuse(w, refusal.DeadlineExceeded, "the request's deadline passed before rung %d was ready", w.Rung)
			continue
		}
		c.answer(w, Answer{Err: &refusal.Error{Code: refusal.ShapeCompiling, Lane: w.Lane, RetryAfter: r.RetryAfter,
			Message: "rung is predicted ready only after the request's admission bound; its compile stays queued"}})
	}
}

// answerJob answers every waiter of j with err and lets them go from it.
func (c *Core) answerJob(j *compilequeue.Job, err func(w *waiter) error) {
	for _, t := range j.Waiters() {
		c.queue.Leave(j, t)
		if w := c.waiters[t]; w != nil && w.job == j {
			w.job = nil
			c.answer(w, Answer{Err: err(w)})
		}
	}
}

// fitsNow reports whether j can start now: its model runs and has a free shape slot and the
// budget has room for its charge. A queued job reserves nothing until then.
func (c *Core) fitsNow(j *compilequeue.Job) bool {
	m := c.models[j.Owner]
	if m == nil || m.state != running {
		return false
	}
	if m.shape(j.Shape.Rung) != nil {
		return false // the rung is still being evicted
	}
	return len(m.shapes) < m.spec.MaxResidentShapes && c.used+j.Layers <= c.budget
}

// startOrResolve starts the elected job, or, if its shape became resident or admitting by
// another way meanwhile, drops it and routes its waiters again (they lease or join), so a job
// can never sit at the head for a shape that needs no admission.
func (c *Core) startOrResolve(j *compilequeue.Job) {
	m := c.models[j.Owner]
	if m != nil && m.state == running {
		if sh := m.shape(j.Shape.Rung); sh != nil && sh.state != evicting {
			c.queue.Drop(j)
			c.soon(c.now) // the gate is still free: the next head may start at once
			for _, t := range j.Waiters() {
				c.queue.Leave(j, t)
				if w := c.waiters[t]; w != nil {
					w.job = nil
					c.route(w)
				}
			}
			return
		}
	}
	if c.fitsNow(j) {
		c.queue.Start(c.now, j)
		c.admit(m, j)
	}
}

// watch sets the watch bit on exactly the cells whose releases the core waits for: every
// leased cell while a head is starved or requests are blocked, every cell of a lane whose
// prewarm waits for it to be quiet, and every cell of a retiring lane. Releases of other cells stay on the fast path and never wake the owner.
func (c *Core) watch() {
	added := false
	for _, lane := range c.lanes {
		m := c.models[lane]
		for _, sh := range m.shapes {
			if sh.cell == nil {
				continue
			}
			want := m.state == retiring || (c.starved || len(c.blocked) > 0 || c.prewarmWaits(m)) && sh.state == resident
			switch have := sh.cell.has(watchBit); {
			case want && !have:
				sh.cell.setBits(watchBit)
				added = true
			case !want && have:
				sh.cell.clearBits(watchBit)
			}
		}
	}
	if added {
		// A release between this pass's reading of the counts and the new watch bit woke
		// nobody: look once more, at once. Releases from now on wake the owner.
		c.soon(c.now)
	}
}
