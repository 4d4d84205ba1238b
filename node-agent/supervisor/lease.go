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
	"slices"
	"sync"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// waiter is a request on the slow path, waiting for the scheduler's answer.
type waiter struct {
	ticket    compilequeue.Ticket
	requestID string
	m         *model
	rung      int
	deadline  time.Time
	reply     chan grant // buffered: the scheduler never blocks on it
	answered  bool
	job       *compilequeue.Job
}

func (w *waiter) answer(g grant) {
	if w.answered {
		return
	}
	w.answered = true
	w.reply <- g
}

// grant is the scheduler's answer to a waiter: a lease, a handoff (the ticket joined the
// admission that made the shape resident and may lease it ahead of a starved head), or a
// refusal.
type grant struct {
	lease   *Lease
	handoff bool
	err     error
}

// Lease is a request's hold on a resident shape: while it is held the shape is never evicted.
// Release it exactly once, after the reply has been read.
type Lease struct {
	s         *Supervisor
	requestID string
	m         *model
	sh        *shape
	stream    *stream
	gen       int64
	// probed: the shape's placement probe had passed (or the lane has none) when the lease
	// was granted, so the gate is passed without taking the lock again.
	probed   bool
	released bool
	mu       sync.Mutex
	fault    error
}

// Rung is the leased shape's rung.
func (l *Lease) Rung() int { return l.sh.rung }

// Generation is the worker generation the lease runs on.
func (l *Lease) Generation() int64 { return l.gen }

// Exchange runs one request on the leased shape. It holds the worker's stream for the whole
// request and reply. A fault (I/O, malformed reply, timeout) is returned, never replayed: the
// exchange may already have executed. The worker is recovered after the lease is released.
func (l *Lease) Exchange(ctx context.Context, payload []byte) ([]byte, error) {
	var reply []byte
	ev := Event{RequestID: l.requestID, Lane: l.m.spec.Lane, Rung: l.sh.rung, RPC: "exchange"}
	err := l.s.traced(l.stream, ev, func(w Worker) error {
		var err error
		reply, err = w.Exchange(ctx, l.sh.rung, payload)
		return err
	})
	if err != nil && !isWorkerError(err) {
		l.mu.Lock()
		l.fault = err
		l.mu.Unlock()
		return nil, refusal.New(refusal.EngineCrashed, l.m.spec.Lane, "worker generation %d failed during the exchange, which is not replayed: %v", l.gen, err)
	}
	return reply, err
}

// Probe runs the runtime placement probe on the leased shape: the fastest of 5 evaluations on
// the device and on a CPU-only reference of the same artifact. A fault is handled as an
// exchange's.
func (l *Lease) Probe(ctx context.Context) (device, cpu time.Duration, err error) {
	ev := Event{RequestID: l.requestID, Lane: l.m.spec.Lane, Rung: l.sh.rung, RPC: "probe"}
	err = l.s.traced(l.stream, ev, func(w Worker) error {
		var err error
		device, cpu, err = w.Probe(ctx, l.sh.rung)
		return err
	})
	if err != nil && !isWorkerError(err) {
		l.mu.Lock()
		l.fault = err
		l.mu.Unlock()
		return 0, 0, refusal.New(refusal.EngineCrashed, l.m.spec.Lane, "worker generation %d failed during the placement probe: %v", l.gen, err)
	}
	return device, cpu, err
}

// Fault reports that the exchange's reply was malformed (it failed validation above the
// stream): the worker goes through confirmed-exit recovery once the lease is released.
func (l *Lease) Fault(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fault == nil {
		l.fault = err
	}
}

// Release gives the shape back. If the exchange faulted, the worker's recovery starts now.
func (l *Lease) Release() {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.released {
		return
	}
	l.released = true
	s.trace(Event{Kind: EventLeaseRelease, RequestID: l.requestID, Lane: l.m.spec.Lane, Rung: l.sh.rung})
	l.sh.leases--
	l.sh.lastUsed = s.clk.Now()
	l.mu.Lock()
	fault := l.fault
	l.mu.Unlock()
	if fault != nil {
		// No request leases this generation again, even before the scheduler applies the
		// fault: its stream may be broken, and its recovery has begun.
		l.m.faultedGen = max(l.m.faultedGen, l.gen)
		s.events = append(s.events, func(now time.Time) { s.fault(now, l.m, l.gen, fault) })
	}
	// A release matters to the scheduler only if something waits for budget or a drain, or
	// the shape's cohort may be done; otherwise the hot path leaves it asleep.
	if fault != nil || s.starved || len(s.blocked) > 0 || l.m.state != running || l.sh.cohort != nil || s.queue.Head() != nil {
		s.wake()
	}
}

// Acquire leases rung of lane's model for one request whose absolute deadline is deadline.
// A resident shape is leased on the lock-only fast path; otherwise the request waits for the
// scheduler, which admits the shape, answers shape_compiling with a retry time when it will
// not be ready in time, or refuses.
func (s *Supervisor) Acquire(ctx context.Context, lane string, rung int, deadline time.Time) (*Lease, error) {
	for {
		// The precheck and the fast path.
		s.mu.Lock()
		m, err := s.modelFor(lane)
		if err != nil {
			s.mu.Unlock()
			return nil, err
		}
		if !m.fits(rung) {
			s.mu.Unlock()
			return nil, refusal.New(refusal.UnsupportedShape, lane, "rung %d is not in the lane's ladder %v", rung, m.spec.Rungs)
		}
		if m.state == recovering && m.spawnFailures > 0 {
			// The worker is dead and its replacement failed to start: waiting would be for
			// nothing. Every request fails loudly until one serves; none goes elsewhere.
			gen, retry := m.gen, m.spawnRetryAt
			s.mu.Unlock()
			return nil, refusal.New(refusal.BackendUnavailable, lane, "worker generation %d is dead and its replacement failed to start; the next attempt is at %s, and the request is not sent elsewhere",
				gen, retry.UTC().Format(time.RFC3339))
		}
		if l := s.tryLease(s.clk.Now(), m, rung, 0); l != nil {
			s.mu.Unlock()
			return s.granted(ctx, l, 0)
		}
		s.mu.Unlock()
		if s.testHookAfterPrecheck != nil {
			s.testHookAfterPrecheck()
		}

		w := &waiter{m: m, rung: rung, deadline: deadline, reply: make(chan grant, 1), requestID: requestID(ctx)}
		s.mu.Lock()
		if s.stopped != nil {
			s.mu.Unlock()
			return nil, refusal.New(refusal.EngineCrashed, lane, "the compile scheduler stopped: %v", s.stopped)
		}
		s.ticket++
		w.ticket = s.ticket
		s.incoming = append(s.incoming, w)
		s.mu.Unlock()
		s.wake()

		select {
		case g := <-w.reply:
			if !g.handoff {
				if g.lease != nil {
					return s.granted(ctx, g.lease, uint64(w.ticket))
				}
				return nil, g.err
			}
			s.mu.Lock()
			l := s.tryLease(s.clk.Now(), m, rung, w.ticket)
			s.mu.Unlock()
			if l != nil {
				return s.granted(ctx, l, uint64(w.ticket))
			}
			// The handoff window closed (or the shape went) before this request took its
			// lease: it goes the ordinary way, behind any starved head.
		case <-ctx.Done():
			s.leave(w)
			if !deadline.IsZero() && !s.clk.Now().Before(deadline) {
				return nil, refusal.New(refusal.DeadlineExceeded, lane, "the request's deadline passed while it waited for rung %d", rung)
			}
			return nil, ctx.Err()
		}
	}
}

// LeaseResident leases rung of lane only if it is resident now, on the fast path; it never
// admits anything and does not pass the placement-probe gate. ProbeResident uses it: the
// probe measures what is loaded and must not load anything itself.
func (s *Supervisor) LeaseResident(lane string, rung int) *Lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.modelFor(lane)
	if err != nil {
		return nil
	}
	return s.tryLease(s.clk.Now(), m, rung, 0)
}

// granted tags a lease with its request, records the grant and holds it at the shape's
// placement-probe gate.
func (s *Supervisor) granted(ctx context.Context, l *Lease, ticket uint64) (*Lease, error) {
	l.requestID = requestID(ctx)
	s.trace(Event{Kind: EventLeaseGrant, RequestID: l.requestID, Lane: l.m.spec.Lane, Rung: l.sh.rung, Ticket: ticket})
	if err := s.probeGate(ctx, l); err != nil {
		return nil, err
	}
	return l, nil
}

// tryLease leases a resident shape if nothing forbids it: the model runs, and no starved
// budget head waits, unless member is a ticket of the shape's handoff cohort. Callers hold mu.
func (s *Supervisor) tryLease(now time.Time, m *model, rung int, member compilequeue.Ticket) *Lease {
	sh := m.shapes[rung]
	if m.state != running || sh == nil || sh.state != resident || m.faultedGen == m.gen {
		return nil
	}
	inCohort := member != 0 && sh.cohort.protects(now) && sh.cohort.members[member]
	if s.starved && !inCohort {
		return nil
	}
	if inCohort {
		delete(sh.cohort.members, member)
	}
	sh.leases++
	sh.lastUsed = now
	return &Lease{s: s, m: m, sh: sh, stream: m.stream, gen: m.gen, probed: m.spec.Probe == nil || sh.probe.passed}
}

// leave withdraws a waiter whose caller gave up, and returns anything it was granted.
func (s *Supervisor) leave(w *waiter) {
	s.mu.Lock()
	if !w.answered {
		w.answered = true
		s.incoming = slices.DeleteFunc(s.incoming, func(o *waiter) bool { return o == w })
		s.blocked = slices.DeleteFunc(s.blocked, func(o *waiter) bool { return o == w })
		delete(s.waiting, w.ticket)
		if w.job != nil {
			s.queue.Leave(w.job, w.ticket)
		}
	}
	if sh := w.m.shapes[w.rung]; sh != nil && sh.cohort != nil {
		delete(sh.cohort.members, w.ticket)
	}
	s.mu.Unlock()
	s.wake()
	select {
	case g := <-w.reply:
		if g.lease != nil {
			g.lease.Release()
		}
	default:
	}
}
