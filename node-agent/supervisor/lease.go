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
	"context"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// Lease is a request's hold on a resident shape: while it is held the shape is never evicted.
// It is a small value: keep it in one variable and Release it exactly once, after the reply
// has been read (a copy shares the hold but not its fault or release record).
type Lease struct {
	s         *Supervisor
	c         *residency.Cell
	requestID string
	fault     error
	released  bool
}

// Rung is the leased shape's rung.
func (l *Lease) Rung() int { return l.c.Rung }

// Generation is the worker generation the lease runs on.
func (l *Lease) Generation() int64 { return l.c.Gen.N }

// Exchange runs one request on the leased shape. It holds the worker's stream for the whole
// request and reply. A fault (I/O, malformed reply, timeout) is returned, never replayed: the
// exchange may already have executed. The worker is recovered after the lease is released.
func (l *Lease) Exchange(ctx context.Context, payload []byte) ([]byte, error) {
	var reply []byte
	ev := Event{RequestID: l.requestID, Lane: l.c.Lane, Rung: l.c.Rung, RPC: "exchange", Riders: residency.Riders(ctx)}
	err := l.s.traced(streamOf(l.c.Gen), ev, func(w Worker) error {
		var err error
		reply, err = w.Exchange(ctx, l.c.Rung, payload)
		return err
	})
	if err != nil && !residency.IsWorkerError(err) {
		l.Fault(err)
		return nil, refusal.New(refusal.EngineCrashed, l.c.Lane, "worker generation %d failed during the exchange, which is not replayed: %v", l.c.Gen.N, err)
	}
	return reply, err
}

// Fault reports that the exchange's reply was malformed (it failed validation above the
// stream): the worker goes through confirmed-exit recovery once the lease is released.
func (l *Lease) Fault(err error) {
	if l.fault == nil {
		l.fault = err
	}
}

// Release gives the shape back. If the exchange faulted, the worker's recovery starts now.
func (l *Lease) Release() {
	if l.c == nil || l.released {
		return
	}
	l.released = true
	if l.fault != nil {
		// No request leases this generation again, even before the owner applies the fault:
		// its stream may be broken, and its recovery begins now.
		l.c.Gen.MarkFaulted()
	}
	s := l.s
	var at time.Time
	if s.cfg.Trace != nil {
		at = s.clk.Now() // before the lease goes: an eviction it allows is stamped later
	}
	wake := l.c.Release()
	if s.cfg.Trace != nil {
		s.trace(Event{At: at, Kind: EventLeaseRelease, RequestID: l.requestID, Lane: l.c.Lane, Rung: l.c.Rung})
	}
	if l.fault != nil {
		s.report(residency.ExchangeFault{Gen: l.c.Gen, Err: l.fault})
		return
	}
	if wake {
		s.wake()
	}
}

// Acquire leases rung of lane's model for one request whose absolute deadline is deadline.
// A resident shape is leased on the lock-free fast path; otherwise the request waits for the
// owner, which admits the shape, answers shape_compiling with a retry time when it will not be
// ready in time, or refuses. Every wait ends by the deadline or the lane's admission bound.
func (s *Supervisor) Acquire(ctx context.Context, lane string, rung int, deadline time.Time) (Lease, error) {
	c, wake := s.view.Load().TryLease(lane, rung)
	if c != nil {
		l := Lease{s: s, c: c}
		if s.cfg.Trace != nil {
			l.requestID = residency.RequestID(ctx)
			s.trace(Event{Kind: EventLeaseGrant, RequestID: l.requestID, Lane: lane, Rung: rung})
		}
		return l, nil
	}
	if wake {
		s.wake()
	}
	if s.testHookAfterPrecheck != nil {
		s.testHookAfterPrecheck()
	}
	a, err := s.wait(ctx, residency.Acquire{Lane: lane, Rung: rung, Deadline: deadline, RequestID: residency.RequestID(ctx)})
	if err != nil {
		return Lease{}, err
	}
	if a.Err != nil {
		return Lease{}, a.Err
	}
	l := Lease{s: s, c: a.Cell, requestID: residency.RequestID(ctx)}
	s.trace(Event{Kind: EventLeaseGrant, RequestID: l.requestID, Lane: lane, Rung: rung, Ticket: uint64(a.Ticket)})
	return l, nil
}

// ProbeResident runs the placement probe on rung of lane if the rung is resident and not yet
// probed in its current load; it never loads anything. It reports whether the rung is
// resident and probed, and the probe's refusal if it failed.
func (s *Supervisor) ProbeResident(ctx context.Context, lane string, rung int) (bool, error) {
	v := s.view.Load()
	if err := v.Stopped(); err != nil {
		// A stopped core's view holds no lanes: "not resident" would be a lie about a
		// scheduler that is gone.
		return false, refusal.New(refusal.EngineCrashed, lane, "the compile scheduler stopped: %v", err)
	}
	switch resident, probed := v.Probed(lane, rung); {
	case !resident:
		return false, nil
	case probed:
		return true, nil // nothing to ask the owner
	}
	a, err := s.wait(ctx, residency.Acquire{Lane: lane, Rung: rung, ResidentOnly: true})
	if err != nil {
		return false, err
	}
	return a.Resident, a.Err
}

// wait sends a slow-path request to the owner and waits for its answer. A handoff answer is
// followed at once by the ticket's return as a cohort member.
func (s *Supervisor) wait(ctx context.Context, acq residency.Acquire) (residency.Answer, error) {
	if err := s.stopped(); err != nil {
		return residency.Answer{}, refusal.New(refusal.EngineCrashed, acq.Lane, "the compile scheduler stopped: %v", err)
	}
	acq.Ticket = residency.Ticket(s.tickets.Add(1))
	acq.Since = s.clk.Now()
	req := &request{ticket: acq.Ticket, lane: acq.Lane, reply: make(chan residency.Answer, 1)}
	for {
		if !s.sendBy(ctx, acq.Deadline, input{in: acq, req: req}) {
			if acq.Member {
				// Gone between its handoff and its return: its cohort membership goes too.
				s.send(context.Background(), input{in: residency.Leave{Ticket: acq.Ticket}, req: req})
			}
			return residency.Answer{}, s.gaveUp(ctx, acq)
		}
		select {
		case a := <-req.reply:
			if a.Handoff {
				acq.Member = true
				continue
			}
			return a, nil
		case <-ctx.Done():
			s.send(context.Background(), input{in: residency.Leave{Ticket: acq.Ticket}, req: req})
			return residency.Answer{}, s.gaveUp(ctx, acq)
		case <-s.done:
			return s.answerAfterStop(req, acq)
		}
	}
}

// answerAfterStop is a waiting request's answer once the owner has stopped: the answer it left
// for the request if it is final, otherwise the stop. A handoff answered just before the stop
// is not final (its lease was never granted): returning it would hand the caller a Lease with
// no shape and no error.
func (s *Supervisor) answerAfterStop(req *request, acq residency.Acquire) (residency.Answer, error) {
	select {
	case a := <-req.reply:
		if !a.Handoff {
			return a, nil
		}
	default:
	}
	return residency.Answer{}, refusal.New(refusal.EngineCrashed, acq.Lane, "the compile scheduler stopped: %v", s.stopped())
}

// gaveUp is the answer of a request that stopped waiting: a deadline refusal once its deadline
// has passed, the scheduler's stop, or its context's error.
func (s *Supervisor) gaveUp(ctx context.Context, acq residency.Acquire) error {
	if err := s.stopped(); err != nil {
		return refusal.New(refusal.EngineCrashed, acq.Lane, "the compile scheduler stopped: %v", err)
	}
	if !acq.Deadline.IsZero() && !s.clk.Now().Before(acq.Deadline) {
		return refusal.New(refusal.DeadlineExceeded, acq.Lane, "the request's deadline passed while it waited for rung %d", acq.Rung)
	}
	return ctx.Err()
}

// sendBy is send for a request with a deadline: if the owner's input queue is full, the request
// waits for room at most until its deadline.
func (s *Supervisor) sendBy(ctx context.Context, deadline time.Time, in input) bool {
	select {
	case s.in <- in:
		return true
	default:
	}
	if deadline.IsZero() {
		return s.send(ctx, in)
	}
	timer := s.clk.NewTimer(deadline.Sub(s.clk.Now()))
	defer timer.Stop()
	select {
	case s.in <- in:
		return true
	case <-s.done:
		return false
	case <-ctx.Done():
		return false
	case <-timer.C():
		return false
	}
}
