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

// Package supervisor is the direct-ANE residency supervisor's runtime: the shell around the
// pure core in package residency. One goroutine (Run) owns the core: it feeds it the callers'
// requests and the outcomes of worker calls, publishes the view the core builds, and executes
// the core's effects — worker calls on goroutines of their own that report back, answers on
// the requests' reply channels. Requests lease resident shapes on a lock-free fast path over
// the published view, or wait for the core's answer.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

const (
	// DefaultBudget is the machine-wide number of layer executables.
	DefaultBudget = residency.DefaultBudget
	// HandoffWindow is how long a finished admission's cohort keeps its shape protected.
	HandoffWindow = residency.HandoffWindow
	// UnknownOutcomeGateHold bounds how long an admission of unknown outcome holds the gate.
	UnknownOutcomeGateHold = residency.UnknownOutcomeGateHold
	// ExitGrace is how long a closed worker has to exit before it is killed.
	ExitGrace = 10 * time.Second
	// inputQueue bounds the requests and outcomes waiting for the owner; a sender blocks (and
	// can give up) when it is full.
	inputQueue = 1024
)

// ProbeTimeout bounds one placement probe.
var ProbeTimeout = 10 * time.Minute

// Config configures a Supervisor.
type Config struct {
	Clock   clock.WithTicker
	Spawner Spawner
	Log     logr.Logger
	// Warn, if set, receives warnings (a refused prewarm admission) at a warning level.
	Warn func(msg string, keysAndValues ...any)
	// Budget is the number of layer executables; DefaultBudget if zero.
	Budget int
	// CertifyObservation records worker inventories and an independent admission count for
	// the certification validator. Ordinary serving leaves it off and records nothing.
	CertifyObservation bool
	// Trace, if set, receives the timeline events (the stress tool's report). It must be safe
	// for concurrent use and quick: it runs on the owner's, the workers' and the requests' paths.
	Trace func(Event)
	// OnChange, if set, is called after a step of the core changed what Snapshot, Node or
	// Prewarmed report (the agent's status writer wakes on it). It runs on the owner goroutine:
	// it must return at once and must not wait for the supervisor.
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
	cfg     Config
	clk     clock.WithTicker
	log     logr.Logger
	lockMu  sync.Mutex
	lock    *lanelock.Lock
	view    atomic.Pointer[residency.View]
	in      chan input
	kick    chan struct{}
	done    chan struct{} // closed once Run has stopped and answered everyone
	stopErr atomic.Pointer[error]
	tickets atomic.Uint64
	obsIDs  atomic.Uint64

	// Owned by Run's goroutine.
	core     *residency.Core
	pending  map[residency.Ticket]*request
	loads    map[string]*loadCall
	retires  map[string][]chan error
	observes map[uint64]chan observed

	// testHookAfterPrecheck runs between a request's failed fast path and its slow path.
	testHookAfterPrecheck func()
}

// input is one message for the owner.
type input struct {
	in residency.Input
	// For an Acquire: its request. For a Load: its call. For a Retire or an Observe: the
	// channel the answer goes to.
	req     *request
	load    *loadCall
	retired chan error
	obs     chan observed
	// judge rules on a Probed measurement on the owner goroutine, just before it is applied.
	judge func(rung int, gen int64, device, cpu time.Duration) error
	// fn, for tests, runs on the owner goroutine with the core between steps.
	fn func(*residency.Core)
}

// request is a slow-path request's reply channel.
type request struct {
	ticket residency.Ticket
	lane   string
	reply  chan residency.Answer
}

type loadCall struct {
	ctx  context.Context
	done chan error
}

type observed struct {
	obs certify.Observation
	err error
}

// New returns a supervisor; it does nothing until Run is started.
func New(cfg Config) *Supervisor {
	s := &Supervisor{cfg: cfg, clk: cfg.Clock, log: cfg.Log, in: make(chan input, inputQueue), kick: make(chan struct{}, 1),
		done: make(chan struct{}), pending: map[residency.Ticket]*request{}, loads: map[string]*loadCall{},
		retires: map[string][]chan error{}, observes: map[uint64]chan observed{}}
	var trace func(Event)
	if cfg.Trace != nil {
		// Stamped when the owner records it, after what it records happened (a shape closed for
		// its eviction, say), never with the step's start time.
		trace = func(e Event) { e.At = s.clk.Now(); cfg.Trace(e) }
	}
	s.core = residency.New(residency.Config{Budget: cfg.Budget, CertifyObservation: cfg.CertifyObservation, Log: cfg.Log,
		Warn: cfg.Warn, Trace: trace})
	s.view.Store(s.core.Ready().View)
	return s
}

// wake asks the owner for a pass (a watched lease was released).
func (s *Supervisor) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// send hands an input to the owner. It reports false if the owner has stopped or ctx ended
// first.
func (s *Supervisor) send(ctx context.Context, in input) bool {
	select {
	case s.in <- in:
		return true
	case <-s.done:
		return false
	case <-ctx.Done():
		return false
	}
}

// stopped is the error the owner stopped with, or nil.
func (s *Supervisor) stopped() error {
	if p := s.stopErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Run is the owner goroutine. It returns when ctx ends. If it stops for any other reason (a
// panic), every request is answered engine_crashed with its lane from then on.
func (s *Supervisor) Run(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("compile scheduler panicked: %v", r)
			s.log.Error(err, "the residency supervisor stopped; every request is refused until the agent restarts")
		}
		if err == nil {
			err = errors.New("compile scheduler stopped")
		}
		s.abort(err)
	}()
	var next time.Time
	for {
		var fire <-chan time.Time
		var timer clock.Timer
		if !next.IsZero() {
			// Measured from the clock's time now: time that passed during the step must not
			// push the wake-up later than next.
			now := s.clk.Now()
			d := next.Sub(now)
			if d <= 0 {
				select {
				case <-ctx.Done():
					return ctx.Err()
				default:
				}
				next = s.step(residency.Tick{}, input{})
				continue
			}
			timer = s.clk.NewTimer(d)
			// The timer's wake-up is the clock's time at NewTimer plus d: time that passed
			// between reading the clock and arming it (a test stepping a fake clock, or a
			// preemption) would make it late by as much, and a wake-up at next would never come
			// on a clock that moves no more. Armed again then, or stepped now if next has come.
			if moved := s.clk.Since(now); moved >= time.Millisecond || !s.clk.Now().Before(next) {
				timer.Stop()
				continue
			}
			fire = timer.C()
		}
		var in input
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return ctx.Err()
		case in = <-s.in:
		case <-s.kick:
			in.in = residency.Tick{}
		case <-fire:
			in.in = residency.Tick{}
		}
		if timer != nil {
			timer.Stop()
		}
		if in.fn != nil {
			in.fn(s.core)
			continue
		}
		if l, ok := in.in.(residency.Load); ok && s.loads[l.Spec.Lane] != nil {
			// Another LoadModel of the lane is under way: this one is refused, and the first
			// keeps its answer and its context.
			in.load.done <- fmt.Errorf("lane %s is already being loaded", l.Spec.Lane)
			continue
		}
		next = s.step(in.in, in)
	}
}

// step registers what waits for an answer, steps the core, publishes its view and executes its
// effects. It returns when to step again.
func (s *Supervisor) step(ri residency.Input, in input) time.Time {
	switch v := ri.(type) {
	case residency.Acquire:
		s.pending[v.Ticket] = in.req
	case residency.Leave:
		if _, waiting := s.pending[v.Ticket]; !waiting {
			// Answered before the caller gave up: drain the answer it will not read.
			s.drain(in.req)
		}
		delete(s.pending, v.Ticket)
	case residency.Load:
		s.loads[v.Spec.Lane] = in.load
	case residency.Retire:
		s.retires[v.Lane] = append(s.retires[v.Lane], in.retired)
	case residency.Observe:
		if v.Withdraw {
			delete(s.observes, v.ID)
		} else {
			s.observes[v.ID] = in.obs
		}
	case residency.Probed:
		if v.Err == nil && in.judge != nil {
			if err := observe(func() error { v.Verdict = in.judge(v.Cell.Rung, v.Gen.N, v.Device, v.CPU); return nil }); err != nil {
				v.Verdict = err
			}
			ri = v
		}
	}
	s.core.Step(s.clk.Now(), ri)
	rd := s.core.Ready()
	changed := s.view.Swap(rd.View) != rd.View
	for _, fx := range rd.Effects {
		s.execute(fx)
	}
	if changed && s.cfg.OnChange != nil {
		s.cfg.OnChange()
	}
	return rd.Next
}

// drain releases a lease in an answer its caller gave up on.
func (s *Supervisor) drain(req *request) {
	select {
	case a := <-req.reply:
		if a.Cell != nil && a.Cell.Release() {
			s.wake()
		}
	default:
	}
}

// execute carries out one effect of the core.
func (s *Supervisor) execute(fx residency.Effect) {
	switch fx := fx.(type) {
	case residency.Answer:
		req := s.pending[fx.Ticket]
		delete(s.pending, fx.Ticket)
		if req == nil {
			// The caller left before the owner saw the request: nobody will read the answer.
			if fx.Cell != nil && fx.Cell.Release() {
				s.wake()
			}
			return
		}
		req.reply <- fx
	case residency.Loaded:
		if l := s.loads[fx.Lane]; l != nil {
			delete(s.loads, fx.Lane)
			l.done <- fx.Err
		}
	case residency.Retired:
		for _, c := range s.retires[fx.Lane] {
			c <- fx.Err
		}
		delete(s.retires, fx.Lane)
	case residency.Observed:
		if c := s.observes[fx.ID]; c != nil {
			delete(s.observes, fx.ID)
			c <- observed{fx.Observation, fx.Err}
		}
	case residency.Spawn:
		ctx := context.Background()
		if l := s.loads[fx.Gen.Lane]; l != nil && fx.Gen.N == 1 {
			ctx = l.ctx // the first worker starts within LoadModel's context
		}
		go s.spawn(ctx, fx)
	case residency.Admit:
		go s.admit(fx)
	case residency.Evict:
		go s.evict(fx)
	case residency.ProbeShape:
		go s.probe(fx)
	case residency.ConfirmExit:
		go s.confirmExit(fx)
	case residency.Inventory:
		go s.inventory(fx)
	default:
		panic(fmt.Sprintf("supervisor: unknown effect %T", fx))
	}
}

// report hands a worker call's outcome back to the owner; it is dropped if the owner stopped.
func (s *Supervisor) report(in residency.Input) {
	s.send(context.Background(), input{in: in})
}

// abort answers every request engine_crashed with its lane and refuses all later ones. The
// core answers what it knows (Abort); whatever a panic kept from it is answered from the
// owner's own registry of waiting callers.
func (s *Supervisor) abort(err error) {
	s.stopErr.Store(&err)
	s.view.Store(residency.StoppedView(err))
	func() {
		defer func() { _ = recover() }() // a core that panicked may panic again: the registry remains
		s.core.Abort(err)
		for _, fx := range s.core.Ready().Effects {
			if a, ok := fx.(residency.Answer); ok {
				if req := s.pending[a.Ticket]; req != nil {
					delete(s.pending, a.Ticket)
					req.reply <- a
				}
			}
		}
	}()
	for t, req := range s.pending {
		req.reply <- residency.Answer{Ticket: t, Lane: req.lane, Err: refusal.New(refusal.EngineCrashed, req.lane, "the compile scheduler stopped: %v", err)}
	}
	s.pending = nil
	for lane, l := range s.loads {
		l.done <- fmt.Errorf("loading lane %s: the compile scheduler stopped: %w", lane, err)
	}
	for lane, cs := range s.retires {
		for _, c := range cs {
			c <- fmt.Errorf("retiring lane %s: the compile scheduler stopped: %w", lane, err)
		}
	}
	for _, c := range s.observes {
		c <- observed{err: fmt.Errorf("the compile scheduler stopped: %w", err)}
	}
	close(s.done)
}
