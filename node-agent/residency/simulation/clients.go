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

package simulation

import (
	"errors"
	"fmt"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// req is one request as its client sees it.
type req struct {
	ticket       residency.Ticket
	lane         string
	rung         int
	residentOnly bool
	since        time.Time
	deadline     time.Time
	// limit is when the request must have been answered: its deadline or its lane's bound,
	// checked for requests that arrive once faults have stopped.
	limit time.Time
	// waiting: the core holds it; over: it has its final answer (or its client gave up, or
	// never came back from a handoff).
	waiting, over bool
	// held is the lease it holds, until released.
	held     *residency.Cell
	canceled bool
	// settled: it arrived once faults were over and their traces gone (see settled).
	settled bool
}

type clients struct {
	s       *sim
	reqs    map[residency.Ticket]*req
	tickets uint64
	leases  map[*residency.Cell]int
	obsID   uint64
	obsOpen map[uint64]bool
	// obsWithdrawn: its caller gave up; the core answers it only if it had already asked the
	// workers.
	obsWithdrawn map[uint64]bool
	aborted      bool
}

func (c *clients) init(s *sim) {
	c.s, c.reqs, c.leases, c.obsOpen, c.obsWithdrawn = s, map[residency.Ticket]*req{}, map[*residency.Cell]int{}, map[uint64]bool{}, map[uint64]bool{}
}

// start loads every lane and schedules the workload: arrivals, retirements, observations and
// (rarely) a scheduler panic.
func (s *sim) start() {
	span := time.Duration(10+s.rng.IntN(50)) * time.Minute
	s.arrivalsUntil = s.now.Add(span)
	s.faultsUntil = s.now.Add(span * 6 / 10)
	for _, l := range s.lanes {
		s.load(l)
		if s.chance(0.1) {
			// Retired while its first worker loads.
			s.after(s.dur(0, 500*time.Millisecond), func() { s.retire(l) })
		}
	}
	for range s.cfg.Requests {
		s.at(s.now.Add(s.dur(0, span)), func() { s.arrive(nil) })
	}
	for range s.rng.IntN(3) {
		// A burst: many requests at the very same instant.
		at, n := s.now.Add(s.dur(0, span)), 5+s.rng.IntN(16)
		s.at(at, func() { s.res.Bursts++ })
		for range n {
			s.at(at, func() { s.arrive(nil) })
		}
	}
	if !s.cfg.NoFaults {
		for t := s.dur(5*time.Second, 2*time.Minute); t < span*6/10; t += s.dur(5*time.Second, 2*time.Minute) {
			s.at(s.now.Add(t), s.idleCrash)
		}
	}
	for t := s.dur(20*time.Second, 5*time.Minute); t < span; t += s.dur(20*time.Second, 5*time.Minute) {
		s.at(s.now.Add(t), func() {
			if s.chance(0.6) {
				s.retire(s.lanes[s.rng.IntN(len(s.lanes))])
			}
		})
	}
	if s.certify {
		for t := s.dur(10*time.Second, 2*time.Minute); t < span; t += s.dur(10*time.Second, 2*time.Minute) {
			s.at(s.now.Add(t), func() {
				s.obsID++
				id := s.obsID
				s.obsOpen[id] = true
				s.step(residency.Observe{ID: id})
				if s.chance(0.2) {
					// Its caller gives up: withdrawn if the workers were not asked yet.
					s.after(s.dur(0, 100*time.Millisecond), func() {
						if s.obsOpen[id] {
							s.obsWithdrawn[id] = true
							s.res.Withdrawn++
							s.step(residency.Observe{ID: id, Withdraw: true})
						}
					})
				}
			})
		}
	}
	if !s.cfg.NoFaults && s.chance(0.02) {
		s.at(s.now.Add(s.dur(0, span*6/10)), s.abort)
	}
}

func (s *sim) load(l *lane) {
	if s.aborted {
		return
	}
	l.phase = loading
	s.res.Loads++
	s.step(residency.Load{Spec: l.spec})
}

func (s *sim) retire(l *lane) {
	if l.phase != loading && l.phase != loaded {
		return
	}
	l.phase = retiring
	s.step(residency.Retire{Lane: l.name})
	if s.chance(0.2) {
		// Loaded again while it retires: the core refuses; the retirement goes on.
		s.after(s.dur(0, 50*time.Millisecond), func() {
			if l.phase == retiring {
				s.res.LoadsWhileRetiring++
				s.step(residency.Load{Spec: l.spec})
			}
		})
	}
}

// idleCrash ends a live worker that has no call on its stream: nothing tells the core until
// its next call fails.
func (s *sim) idleCrash() {
	if !s.faulty(0.7) {
		return
	}
	for _, l := range s.lanes {
		for g, p := range s.procs {
			if g.Lane == l.name && !p.dead && !p.closing && len(p.stream) == 0 {
				s.logf("%s#%d crashes while idle", g.Lane, g.N)
				s.res.IdleCrashes++
				s.res.Faults++
				s.die(p)
				return
			}
		}
	}
}

func (s *sim) loaded(fx residency.Loaded) {
	l := s.lane(fx.Lane)
	if fx.Err != nil {
		if l.phase == loading {
			l.phase = gone
			s.reload(l)
		}
		return
	}
	if l.phase != loading {
		s.violate("%s reported loaded while %v", l.name, l.phase)
	}
	l.phase = loaded
	if s.chance(0.7) {
		rungs := l.spec.Rungs[:min(3, len(l.spec.Rungs))]
		s.step(residency.Prewarm{Lane: l.name, Rungs: rungs})
	}
}

func (s *sim) retired(fx residency.Retired) {
	l := s.lane(fx.Lane)
	if fx.Err != nil {
		return
	}
	if l.phase != retiring && l.phase != gone {
		s.violate("%s reported retired while %v", l.name, l.phase)
	}
	l.phase = gone
	s.res.Retirements++
	s.reload(l)
}

func (s *sim) reload(l *lane) {
	if s.draining || s.now.After(s.arrivalsUntil) {
		return
	}
	s.after(s.dur(time.Second, time.Minute), func() {
		if l.phase == gone && !s.draining {
			s.load(l)
		}
	})
}

// arrive starts a request: a new one, or the retry of one answered shape_compiling.
func (s *sim) arrive(retryOf *req) {
	if s.draining {
		return
	}
	s.tickets++
	r := &req{ticket: residency.Ticket(s.tickets), since: s.now}
	if retryOf != nil {
		r.lane, r.rung, r.deadline = retryOf.lane, retryOf.rung, retryOf.deadline
	} else {
		l := s.lanes[s.rng.IntN(len(s.lanes))]
		r.lane, r.rung = l.name, l.spec.Rungs[s.rng.IntN(len(l.spec.Rungs))]
		if s.chance(0.02) {
			r.rung = 300 // not in any ladder
		}
		r.residentOnly = s.chance(0.03)
		if s.chance(0.5) {
			r.deadline = s.now.Add(s.dur(200*time.Millisecond, 15*time.Minute))
		}
	}
	if l := s.lane(r.lane); !s.now.Before(s.faultsUntil) {
		r.limit = r.since.Add(l.spec.AdmissionBound)
		if !r.deadline.IsZero() && r.deadline.Before(r.limit) {
			r.limit = r.deadline
		}
		if r.limit.Before(r.since) {
			r.limit = r.since // a retry whose deadline has passed is answered at once
		}
	}
	r.settled = s.settled()
	s.reqs[r.ticket] = r
	s.res.Requests++
	if s.chance(0.08) {
		s.after(s.dur(0, 2*time.Minute), func() { s.cancel(r) })
	}
	if !r.residentOnly {
		if cell, wake := s.readView().TryLease(r.lane, r.rung); cell != nil {
			s.logf("fast lease t%d %s#%d/%d", r.ticket, r.lane, cell.Gen.N, r.rung)
			r.over = true
			s.res.Answers++
			s.granted(r, cell)
			return
		} else if wake {
			s.step(residency.Tick{})
		}
	}
	r.waiting = true
	s.step(residency.Acquire{Ticket: r.ticket, Lane: r.lane, Rung: r.rung, Deadline: r.deadline, Since: r.since, ResidentOnly: r.residentOnly})
}

// cancel: the client gives up. A request the core still holds leaves; a lease not yet used
// is given back unused.
func (s *sim) cancel(r *req) {
	r.canceled = true
	switch {
	case r.waiting:
		r.waiting, r.over = false, true
		s.step(residency.Leave{Ticket: r.ticket})
	case !r.over:
		// Handed off, and gone before it came back for its lease: its cohort membership goes.
		r.over = true
		s.step(residency.Leave{Ticket: r.ticket})
	}
}

// answered takes the core's answer to a request.
func (s *sim) answered(fx residency.Answer) {
	r := s.reqs[fx.Ticket]
	switch {
	case r == nil:
		s.violate("an answer to ticket %d, which nobody asked", fx.Ticket)
		return
	case !r.waiting:
		s.violate("ticket %d was answered twice, or after its client left", fx.Ticket)
		return
	case fx.Lane != r.lane:
		s.violate("ticket %d of %s was answered for lane %s", fx.Ticket, r.lane, fx.Lane)
	}
	r.waiting = false
	if fx.Handoff {
		// The client comes back for its lease at once, a little later, or (suspended) never.
		switch {
		case s.chance(0.9):
			s.after(0, func() { s.comeBack(r) })
		case s.chance(0.7):
			s.after(s.dur(0, 500*time.Millisecond), func() { s.comeBack(r) })
		default:
			r.over = true
			s.res.Answers++
		}
		return
	}
	r.over = true
	s.res.Answers++
	if !r.limit.IsZero() && s.now.After(r.limit) {
		s.violate("ticket %d (%s/%d, since %s) was answered at %s, after its limit %s", r.ticket, r.lane, r.rung,
			rel(r.since), rel(s.now), rel(r.limit))
	}
	if s.aborted && (fx.Err == nil || refusal.CodeOf(fx.Err) != refusal.EngineCrashed) {
		s.violate("after the scheduler stopped, ticket %d was answered %v, not engine_crashed", r.ticket, fx.Err)
	}
	if fx.Cell != nil {
		s.granted(r, fx.Cell)
		return
	}
	if fx.Err != nil {
		s.res.Refusals++
		s.checkServed(r, fx.Err)
		var rf *refusal.Error
		if errors.As(fx.Err, &rf) && rf.Code == refusal.ShapeCompiling {
			s.promised(r, rf)
		}
		if errors.As(fx.Err, &rf) && rf.Code == refusal.ShapeCompiling && s.chance(0.6) && !r.canceled {
			s.after(rf.RetryAfter, func() { s.arrive(r) })
		}
	}
}

func (s *sim) comeBack(r *req) {
	if r.canceled || r.over || r.waiting {
		return
	}
	r.waiting = true
	if !r.limit.IsZero() && r.limit.Before(s.now) {
		r.limit = s.now // the client itself came back late: it is answered at once
	}
	s.step(residency.Acquire{Ticket: r.ticket, Lane: r.lane, Rung: r.rung, Deadline: r.deadline, Since: r.since, Member: true})
}

// granted checks a lease against the machine and runs one exchange on it.
func (s *sim) granted(r *req, c *residency.Cell) {
	p := s.procs[c.Gen]
	switch {
	case c.Rung != r.rung || c.Lane != r.lane:
		s.violate("ticket %d for %s/%d leased %s/%d", r.ticket, r.lane, r.rung, c.Lane, c.Rung)
	case s.evicting[c]:
		s.violate("ticket %d leased %s#%d/%d while its release is on its way", r.ticket, c.Lane, c.Gen.N, c.Rung)
	case p == nil || (!p.dead && !p.resident[c.Rung]):
		s.violate("ticket %d leased %s#%d/%d, which the device does not hold", r.ticket, c.Lane, c.Gen.N, c.Rung)
	}
	s.leases[c]++
	s.res.Leases++
	r.held = c
	s.after(s.dur(0, 5*time.Millisecond), func() {
		if r.canceled {
			s.release(r, nil) // given up before using it
			return
		}
		s.exchange(r, p)
	})
}

// exchange runs the request on its worker's stream: once, never replayed.
func (s *sim) exchange(r *req, p *proc) {
	s.res.Exchanges++
	c := &call{name: "exchange"}
	c.start = func(c *call) {
		d := s.dur(time.Millisecond, 40*time.Millisecond)
		var err error
		switch {
		case s.faulty(0.015):
			s.crashAt(p, s.now.Add(d/2))
			return
		case s.faulty(0.015):
			err = fmt.Errorf("malformed reply: %w", errFault)
		case s.faulty(0.01):
			err = &residency.WorkerError{Code: "invalid_input", Message: "bad payload"}
		case s.faulty(0.005):
			s.hang(p, c, callTimeout)
			return
		}
		// The serving path validates the reply before it releases the lease: a fault is
		// reported a little after the stream is free again.
		s.finish(p, c, d, func() { s.after(s.dur(0, 30*time.Millisecond), func() { s.release(r, err) }) })
	}
	c.fail = func() { s.after(s.dur(0, 30*time.Millisecond), func() { s.release(r, errFault) }) }
	s.enqueue(p, c)
}

// release gives a lease back, reporting a fault as the serving path does.
func (s *sim) release(r *req, err error) {
	c := r.held
	r.held = nil
	s.leases[c]--
	fault := err != nil && !residency.IsWorkerError(err)
	if fault {
		s.res.Faults++
		c.Gen.MarkFaulted()
	}
	wake := c.Release()
	switch {
	case fault:
		s.step(residency.ExchangeFault{Gen: c.Gen, Err: err})
	case wake:
		s.step(residency.Tick{})
	}
}

func (s *sim) observed(fx residency.Observed) {
	if !s.obsOpen[fx.ID] {
		s.violate("observation %d answered twice or never asked", fx.ID)
	}
	if s.obsWithdrawn[fx.ID] && fx.Err == nil {
		// Withdrawn too late: the workers had been asked, and the answer stands.
		delete(s.obsWithdrawn, fx.ID)
	}
	delete(s.obsOpen, fx.ID)
	if fx.Err != nil {
		if !s.aborted {
			s.violate("observation %d failed: %v", fx.ID, fx.Err)
		}
		return
	}
	s.res.Observed++
	complete := true
	for _, w := range fx.Observation.Workers {
		complete = complete && w.Inventory != nil
	}
	err := certify.Validate(fx.Observation)
	switch {
	case complete && err != nil:
		s.violate("a complete observation failed the placement gate: %v (%+v)", err, fx.Observation)
	case !complete && !errors.Is(err, certify.ErrInventoryOmitted):
		s.violate("an observation missing an inventory passed the gate as %v", err)
	}
}

// abort is the scheduler's panic: the owner stops the core; every waiting request must be
// answered engine_crashed with its lane, and every later one too.
func (s *sim) abort() {
	s.logf("abort: the scheduler panicked")
	s.aborted = true
	s.res.Panicked = true
	s.core.Abort(errors.New("injected scheduler panic"))
	rd := s.core.Ready()
	s.publish(rd.View)
	s.next = rd.Next
	for _, fx := range rd.Effects {
		s.logf("out %s", describe(fx))
		s.effect(fx)
	}
	for _, r := range s.reqs {
		if r.waiting {
			s.violate("ticket %d was not answered when the scheduler stopped", r.ticket)
		}
	}
}
