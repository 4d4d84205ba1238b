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

// Package supervisor is the direct-ANE residency supervisor and its compile scheduler.
//
// It keeps each loaded model's shapes resident on the Neural Engine within a machine-wide
// budget of layer executables, leases resident shapes to requests, admits (compiles or loads)
// missing ones through the machine-wide compile queue, evicts, hands a finished admission to
// the requests that joined it, retires models and recovers faulted workers.
//
// One scheduler goroutine (Run) makes every decision: it elects the next admission, reserves
// budget, evicts, answers waiting requests at their bounds, hands off, and drives recovery.
// Requests lease resident shapes on a lock-only fast path or wait for its answer. Worker
// calls run on their own goroutines and report back to it as events.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

const (
	// DefaultBudget is the machine-wide number of layer executables, pending admissions and
	// evictions included.
	DefaultBudget = 100
	// HandoffWindow is how long a finished admission's cohort keeps its shape protected.
	HandoffWindow = 250 * time.Millisecond
	// UnknownOutcomeGateHold bounds how long an admission of unknown outcome holds the compile
	// gate after its worker's restart began, if the old process's exit is not confirmed.
	UnknownOutcomeGateHold = 35 * time.Second
	// ExitGrace is how long a closed worker has to exit before it is killed.
	ExitGrace = 10 * time.Second
)

// Config configures a Supervisor.
type Config struct {
	Clock   clock.WithTicker
	Spawner Spawner
	Log     logr.Logger
	// Budget is the number of layer executables; DefaultBudget if zero.
	Budget int
	// CertifyObservation records worker inventories and an independent admission count for
	// the certification validator. Ordinary serving leaves it off and records nothing.
	CertifyObservation bool
	// Trace, if set, receives the timeline events (the stress tool's report). It must be safe
	// for concurrent use and quick: it runs on the scheduler's and the workers' paths.
	Trace func(Event)
	// OnChange, if set, is called after every scheduling pass, whose outcomes may have changed
	// what Snapshot reports (the agent's status writer wakes on it). It runs under the
	// supervisor's lock: it must return at once and must not call the supervisor.
	OnChange func()
	// LockPath is the machine-wide direct-ANE lane lock, taken on the first load and handed to
	// every worker the spawner starts (if it implements LockInheritor). Empty takes none (tests
	// that run no real device).
	LockPath string
}

// LockInheritor is a Spawner whose workers inherit the lane lock.
type LockInheritor interface {
	InheritLock(f *os.File)
}

// Supervisor is the residency supervisor. Create it with New and start Run.
type Supervisor struct {
	clk      clock.WithTicker
	spawner  Spawner
	log      logr.Logger
	budget   int
	certify  bool
	lockPath string
	lock     *lanelock.Lock
	tracer   func(Event)
	onChange func()

	mu            sync.Mutex
	models        map[string]*model
	used          int // charged executables: resident, admitting and evicting shapes
	queue         *compilequeue.Queue
	ticket        compilequeue.Ticket
	incoming      []*waiter                       // slow-path requests the loop has not seen
	waiting       map[compilequeue.Ticket]*waiter // requests waiting for an admission
	blocked       []*waiter                       // requests for resident shapes behind a starved head
	starved       bool                            // the budget head cannot be given budget now
	gate          *gateOwner                      // a failed admission holds the gate until its worker's exit is confirmed
	gateHold      time.Time                       // ... or until then, when its outcome is unknown
	events        []func(now time.Time)           // outcomes reported by worker goroutines
	stopped       error                           // set when the scheduler stopped
	admittedCount int                             // certify: admissions minus evictions, counted apart
	counts        Counts

	kick chan struct{}

	// testHookAfterPrecheck runs between a request's unlocked precheck and its locked grant.
	testHookAfterPrecheck func()
}

// New returns a supervisor; it does nothing until Run is started.
func New(cfg Config) *Supervisor {
	if cfg.Budget == 0 {
		cfg.Budget = DefaultBudget
	}
	return &Supervisor{
		clk: cfg.Clock, spawner: cfg.Spawner, log: cfg.Log, budget: cfg.Budget, certify: cfg.CertifyObservation, lockPath: cfg.LockPath,
		tracer: cfg.Trace, onChange: cfg.OnChange,
		models:  map[string]*model{},
		queue:   compilequeue.New(compilequeue.NewCostModel()),
		waiting: map[compilequeue.Ticket]*waiter{},
		kick:    make(chan struct{}, 1),
	}
}

// wake asks the scheduler for a pass. Callers may hold mu.
func (s *Supervisor) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// post hands an outcome to the scheduler goroutine, which applies it under mu.
func (s *Supervisor) post(ev func(now time.Time)) {
	s.mu.Lock()
	s.events = append(s.events, ev)
	s.mu.Unlock()
	s.wake()
}

// Run is the scheduler goroutine. It returns when ctx ends. If it stops for any other reason
// (a panic), every request is answered engine_crashed from then on.
func (s *Supervisor) Run(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("compile scheduler panicked: %v", r)
		}
		if err == nil {
			err = errors.New("compile scheduler stopped")
		}
		s.stop(err)
	}()
	var timer clock.Timer
	for {
		next := s.pass()

		if timer != nil {
			timer.Stop()
			timer = nil
		}
		var fire <-chan time.Time
		if !next.IsZero() {
			// Measured from the clock's time now, not the pass's: time that passed during the
			// pass must not push the wake-up later than next.
			d := next.Sub(s.clk.Now())
			if d <= 0 {
				// Already due: pass again at once (a fake clock never fires a zero timer).
				select {
				case <-ctx.Done():
					return ctx.Err()
				default:
				}
				continue
			}
			timer = s.clk.NewTimer(d)
			fire = timer.C()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.kick:
		case <-fire:
		}
	}
}

// pass applies the reported outcomes and runs one scheduling pass. The deferred unlock matters:
// a panic in here must not leave mu held for stop.
func (s *Supervisor) pass() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	events := s.events
	s.events = nil
	for _, ev := range events {
		ev(now)
	}
	next := s.schedule(now)
	if s.onChange != nil {
		s.onChange()
	}
	return next
}

// stop answers every waiting request engine_crashed and refuses all later ones.
func (s *Supervisor) stop(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = err
	for _, w := range s.allWaiters() {
		w.answer(grant{err: refusal.New(refusal.EngineCrashed, w.m.spec.Lane, "the compile scheduler stopped: %v", err)})
	}
	s.incoming, s.blocked, s.waiting = nil, nil, map[compilequeue.Ticket]*waiter{}
}

func (s *Supervisor) allWaiters() []*waiter {
	out := append(append([]*waiter{}, s.incoming...), s.blocked...)
	for _, w := range s.waiting {
		out = append(out, w)
	}
	return out
}

// Used reports the charged layer executables.
func (s *Supervisor) Used() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}
