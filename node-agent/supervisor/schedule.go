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

package supervisor

import (
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// schedule is one pass of the scheduler: it routes new requests, answers the ones whose time
// is up, makes room for the queue's head, starts the next admission and lets blocked requests
// lease once no head is starved. It returns when it must look again (zero: on the next event).
// Callers hold mu; only Run calls it.
func (s *Supervisor) schedule(now time.Time) time.Time {
	var next time.Time
	soon := func(t time.Time) {
		if !t.IsZero() && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}

	incoming := s.incoming
	s.incoming = nil
	for _, w := range incoming {
		s.route(now, w)
	}

	_, refused, t := s.queue.Expire(now)
	soon(t)
	s.refuse(refused)

	for _, m := range s.models {
		for _, sh := range m.shapes {
			if sh.cohort == nil {
				continue
			}
			if sh.cohort.protects(now) {
				soon(sh.cohort.expires)
			} else {
				// Every member leased or left, or the window closed: the shape is an ordinary
				// resident again, and a starved head may evict it.
				sh.cohort = nil
			}
		}
		soon(s.driveLifecycle(now, m))
	}

	_, at := s.queue.Reprice(now)
	soon(at)
	if !s.gateHold.IsZero() {
		if now.Before(s.gateHold) {
			soon(s.gateHold)
		} else {
			s.queue.Finish()
			s.gateHold = time.Time{}
		}
	}

	s.starved = false
	if head := s.queue.Head(); head != nil {
		s.refuse(s.queue.CheckHead(now, head))
		s.starved = !s.makeRoom(now, head)
	}

	j, refused, wake := s.queue.Elect(now)
	soon(wake)
	s.refuse(refused)
	if j != nil && s.fitsNow(j) {
		s.startAdmission(now, j)
	}

	// Requests behind a starved head lease once it has its budget; those of a retiring lane
	// are answered at once.
	blocked := s.blocked
	s.blocked = nil
	for _, w := range blocked {
		if !s.starved || w.m.state != running {
			s.route(now, w)
		} else {
			s.blocked = append(s.blocked, w)
		}
	}

	// Lowest priority: background prewarm, only when every request has what it needs.
	s.drivePrewarm(now)
	return next
}

// route is the locked grant decision for a slow-path request: retirement is checked here, so a
// request that passed the unlocked precheck of a lane that retired since is refused and
// reserves nothing.
func (s *Supervisor) route(now time.Time, w *waiter) {
	m := w.m
	if m.state == retiring || m.state == retired || s.models[m.spec.Lane] != m {
		w.answer(grant{err: refusal.New(refusal.LaneRetired, m.spec.Lane, "the lane is being unloaded from this node")})
		return
	}
	if sh := m.shapes[w.rung]; sh != nil && sh.state == resident && m.state == running {
		if l := s.tryLease(now, m, w.rung, 0); l != nil {
			w.answer(grant{lease: l})
		} else {
			s.blocked = append(s.blocked, w)
		}
		return
	}
	if m.spec.Layers > s.budget {
		w.answer(grant{err: refusal.New(refusal.ResourcesExhausted, m.spec.Lane,
			"one shape needs %d layer executables, more than the machine's %d", m.spec.Layers, s.budget)})
		return
	}
	a := s.queue.Submit(now, compilequeue.Request{
		Ticket: w.ticket, Owner: m.owner(), Shape: compilequeue.Shape{Model: m.spec.Identity, Rung: w.rung},
		Layers: m.spec.Layers, Cached: m.cached[w.rung], Deadline: w.deadline, Bound: m.spec.AdmissionBound,
	})
	if !a.Accepted {
		w.answer(grant{err: &refusal.Error{Code: refusal.ShapeCompiling, Lane: m.spec.Lane, RetryAfter: a.RetryAfter,
			Message: "rung is predicted ready only after the request's deadline or admission bound; its compile stays queued"}})
		return
	}
	w.job = s.queue.Find(m.owner(), compilequeue.Shape{Model: m.spec.Identity, Rung: w.rung})
	s.waiting[w.ticket] = w
	s.trace(Event{At: now, Kind: EventQueueEntry, RequestID: w.requestID, Lane: m.spec.Lane, Rung: w.rung, Ticket: uint64(w.ticket)})
}

// refuse answers waiters the queue gave up on.
func (s *Supervisor) refuse(refused []compilequeue.Refusal) {
	for _, r := range refused {
		w := s.waiting[r.Ticket]
		if w == nil {
			continue
		}
		delete(s.waiting, r.Ticket)
		if r.DeadlineExceeded {
			w.answer(grant{err: refusal.New(refusal.DeadlineExceeded, w.m.spec.Lane, "the request's deadline passed before rung %d was ready", w.rung)})
			continue
		}
		w.answer(grant{err: &refusal.Error{Code: refusal.ShapeCompiling, Lane: w.m.spec.Lane, RetryAfter: r.RetryAfter,
			Message: "rung is predicted ready only after the request's admission bound; its compile stays queued"}})
	}
}

// answerJob answers every waiter of a job with err.
func (s *Supervisor) answerJob(tickets []compilequeue.Ticket, err func(w *waiter) error) {
	for _, t := range tickets {
		if w := s.waiting[t]; w != nil {
			delete(s.waiting, t)
			w.answer(grant{err: err(w)})
		}
	}
}

// fitsNow reports whether j can start now: its model runs and has a free shape slot and the
// budget has room for its charge. A queued job reserves nothing until then.
func (s *Supervisor) fitsNow(j *compilequeue.Job) bool {
	m := s.models[j.Owner]
	if m == nil || m.state != running {
		return false
	}
	if _, taken := m.shapes[j.Shape.Rung]; taken {
		return false // the rung is still being evicted
	}
	return m.occupied() < m.spec.MaxResidentShapes && s.used+j.Layers <= s.budget
}
