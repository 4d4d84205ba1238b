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
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// Config sets one simulation run.
type Config struct {
	// Seed chooses everything; the same seed replays the same run.
	Seed uint64
	// Requests is how many requests arrive (default 80). Retries after shape_compiling come
	// on top.
	Requests int
	// NoFaults turns fault injection off (the run still has retirements and cancellations).
	NoFaults bool
	// MaxSteps bounds the run (default 200,000 steps of the core).
	MaxSteps int
	// TraceLen is how many of the last steps a failure report shows (default 80).
	TraceLen int
}

// Result says what a run exercised.
type Result struct {
	Seed                                        uint64
	Steps                                       int
	Requests, Answers, Leases, Refusals         int
	Admissions, Evictions, Probes, Exchanges    int
	Faults, Exits, Retirements, Loads, Observed int
	VirtualTime                                 time.Duration
	Lanes                                       int
	Panicked                                    bool
	// What the generator reached beyond the ordinary: outcome reports delivered twice,
	// promises checked, bursts of simultaneous arrivals, idle workers that crashed, loads
	// of a lane being retired, observations withdrawn.
	Duplicates, Promises, Bursts, IdleCrashes, LoadsWhileRetiring, Withdrawn int
}

// Failure is a broken invariant: the seed that replays it, what broke and the last steps.
type Failure struct {
	Seed  uint64
	Step  int
	At    time.Duration
	Err   error
	Trace []string
	State string
}

func (f *Failure) Error() string {
	return fmt.Sprintf("seed %d, step %d, at %s: %v\nlast steps:\n  %s\ncore: %s\nreplay: go test ./node-agent/residency/simulation -run TestSimulation -seed %d",
		f.Seed, f.Step, f.At, f.Err, strings.Join(f.Trace, "\n  "), f.State, f.Seed)
}

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// Run runs one seed. It returns a *Failure when an invariant breaks.
func Run(cfg Config) (res Result, err error) {
	if cfg.Requests == 0 {
		cfg.Requests = 80
	}
	if cfg.MaxSteps == 0 {
		cfg.MaxSteps = 200_000
	}
	if cfg.TraceLen == 0 {
		cfg.TraceLen = 80
	}
	s := newSim(cfg)
	defer func() {
		if r := recover(); r != nil {
			err = s.failure(fmt.Errorf("panic: %v", r))
		}
	}()
	err = s.run()
	s.res.Seed, s.res.Steps, s.res.VirtualTime = cfg.Seed, s.steps, s.now.Sub(epoch)
	return s.res, err
}

// event is something that happens at a time; ties go in the order they were scheduled.
type event struct {
	at  time.Time
	seq uint64
	fn  func()
}

type events []*event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if !e[i].at.Equal(e[j].at) {
		return e[i].at.Before(e[j].at)
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(*event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

type sim struct {
	cfg  Config
	rng  *rand.Rand
	now  time.Time
	core *residency.Core
	view *residency.View
	// views are the last views published: a request's fast path may read one the owner has
	// since replaced, as a reader that loaded the pointer just before a publish does.
	views []*residency.View
	next  time.Time

	queue events
	seq   uint64
	steps int
	trace []string
	err   error
	res   Result

	budget  int
	certify bool
	world
	clients
	promises
	// holdTick is the hold end the run last scheduled a step for.
	holdTick time.Time
	// faultsUntil: faults are injected before it; arrivalsUntil: requests arrive before it.
	faultsUntil, arrivalsUntil time.Time
	// draining: the run's end: every lane is being retired.
	draining bool
}

func newSim(cfg Config) *sim {
	s := &sim{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x5eed)), now: epoch, budget: residency.DefaultBudget}
	s.certify = s.rng.IntN(2) == 0
	s.core = residency.New(residency.Config{Budget: s.budget, CertifyObservation: s.certify, Log: logr.Discard(),
		Warn: func(string, ...any) {}})
	s.view = s.core.Ready().View
	s.world.init(s)
	s.clients.init(s)
	s.started = map[uint64]bool{}
	return s
}

// at schedules fn at t (not before now).
func (s *sim) at(t time.Time, fn func()) {
	if t.Before(s.now) {
		t = s.now
	}
	s.seq++
	heap.Push(&s.queue, &event{at: t, seq: s.seq, fn: fn})
}

func (s *sim) after(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

// dur is a uniform random duration in [lo, hi).
func (s *sim) dur(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(s.rng.Int64N(int64(hi-lo)))
}

func (s *sim) chance(p float64) bool { return s.rng.Float64() < p }

// faulty draws a fault with probability p, only while faults are on.
func (s *sim) faulty(p float64) bool {
	return !s.cfg.NoFaults && s.now.Before(s.faultsUntil) && s.chance(p)
}

func (s *sim) logf(format string, args ...any) {
	line := fmt.Sprintf("%9.3fs ", s.now.Sub(epoch).Seconds()) + fmt.Sprintf(format, args...)
	if len(s.trace) >= s.cfg.TraceLen {
		copy(s.trace, s.trace[1:])
		s.trace = s.trace[:len(s.trace)-1]
	}
	s.trace = append(s.trace, line)
}

// violate records the first broken invariant.
func (s *sim) violate(format string, args ...any) {
	if s.err == nil {
		s.err = s.failure(fmt.Errorf(format, args...))
	}
}

func (s *sim) failure(err error) *Failure {
	return &Failure{Seed: s.cfg.Seed, Step: s.steps, At: s.now.Sub(epoch), Err: err, Trace: append([]string(nil), s.trace...),
		State: s.core.Inspect().String()}
}

// step feeds the core one input, hands its effects to the world and the clients, and checks
// every invariant.
func (s *sim) step(in residency.Input) {
	s.steps++
	s.noteFault(in)
	s.logf("in  %s", describe(in))
	s.core.Step(s.now, in)
	rd := s.core.Ready()
	s.publish(rd.View)
	s.next = rd.Next
	if !s.next.IsZero() && s.next.Before(s.now) {
		s.violate("the core asked to be stepped at %s, in the past", s.next.Sub(epoch))
	}
	for _, fx := range rd.Effects {
		s.logf("out %s", describe(fx))
		s.effect(fx)
	}
	s.check()
}

// report feeds the core a worker call's outcome, and now and then, while faults are on,
// delivers it once more a little later: a late or repeated report must change nothing.
func (s *sim) report(in residency.Input) {
	s.step(in)
	if s.faulty(0.05) {
		s.res.Duplicates++
		s.after(s.dur(0, 50*time.Millisecond), func() {
			s.logf("the same outcome reported again")
			s.step(in)
		})
	}
}

func (s *sim) publish(v *residency.View) {
	s.view = v
	if len(s.views) == 4 {
		s.views = s.views[1:]
	}
	s.views = append(s.views, v)
}

// readView is the view a fast path reads: mostly the newest, sometimes a stale one.
func (s *sim) readView() *residency.View {
	if len(s.views) > 1 && s.chance(0.2) {
		return s.views[s.rng.IntN(len(s.views))]
	}
	return s.view
}

func (s *sim) effect(fx residency.Effect) {
	switch fx := fx.(type) {
	case residency.Answer:
		s.answered(fx)
	case residency.Loaded:
		s.loaded(fx)
	case residency.Retired:
		s.retired(fx)
	case residency.Observed:
		s.observed(fx)
	default:
		s.world.effect(fx)
	}
}

func (s *sim) run() error {
	s.start()
	idle := 0
	for s.err == nil {
		if s.steps >= s.cfg.MaxSteps {
			return s.failure(fmt.Errorf("the run did not settle within %d steps: %s", s.cfg.MaxSteps, s.pendingSummary()))
		}
		var ev *event
		if len(s.queue) > 0 {
			ev = s.queue[0]
		}
		switch {
		case !s.next.IsZero() && (ev == nil || !ev.at.Before(s.next)):
			s.now = s.next
			s.next = time.Time{}
			s.step(residency.Tick{})
		case ev != nil:
			heap.Pop(&s.queue)
			s.now = ev.at
			ev.fn()
		default:
			// Nothing is scheduled and the core waits for nothing: the run is over.
			if s.finished() {
				s.endChecks()
				return s.err
			}
			idle++
			if idle > 1 {
				return s.failure(fmt.Errorf("nothing moves, yet the run is not over: %s", s.pendingSummary()))
			}
			s.drain()
		}
	}
	return s.err
}

// noteFault marks the generation an input reports a fault of.
func (s *sim) noteFault(in residency.Input) {
	var g *residency.Gen
	var err error
	switch in := in.(type) {
	case residency.ExchangeFault:
		g, err = in.Gen, in.Err
	case residency.Admitted:
		g, err = in.Gen, in.Err
	case residency.Evicted:
		g, err = in.Gen, in.Err
	case residency.Probed:
		g, err = in.Gen, in.Err
	case residency.Inventoried:
		g, err = in.Gen, in.Err
	}
	if err != nil && (!residency.IsWorkerError(err) || isRecycle(err)) {
		if p := s.procs[g]; p != nil {
			p.faulted = true
		}
	}
}

// errFault is a worker fault: its outcome is unknown.
var errFault = errors.New("broken pipe")

func describe(v any) string {
	switch v := v.(type) {
	case residency.Acquire:
		return fmt.Sprintf("Acquire t%d %s/%d member=%v residentOnly=%v deadline=%s", v.Ticket, v.Lane, v.Rung, v.Member, v.ResidentOnly, rel(v.Deadline))
	case residency.Answer:
		switch {
		case v.Cell != nil:
			return fmt.Sprintf("Answer t%d lease %s#%d/%d", v.Ticket, v.Lane, v.Cell.Gen.N, v.Cell.Rung)
		case v.Handoff:
			return fmt.Sprintf("Answer t%d handoff", v.Ticket)
		case v.Err != nil:
			return fmt.Sprintf("Answer t%d %v", v.Ticket, v.Err)
		}
		return fmt.Sprintf("Answer t%d resident=%v", v.Ticket, v.Resident)
	case residency.Spawn:
		return fmt.Sprintf("Spawn %s#%d", v.Gen.Lane, v.Gen.N)
	case residency.Spawned:
		return fmt.Sprintf("Spawned %s#%d err=%v", v.Gen.Lane, v.Gen.N, v.Err)
	case residency.Admit:
		return fmt.Sprintf("Admit %s#%d/%d job %d", v.Gen.Lane, v.Gen.N, v.Rung, v.Job)
	case residency.Admitted:
		return fmt.Sprintf("Admitted %s#%d job %d err=%v", v.Gen.Lane, v.Gen.N, v.Job, v.Err)
	case residency.Evict:
		return fmt.Sprintf("Evict %s#%d/%d", v.Gen.Lane, v.Gen.N, v.Rung)
	case residency.Evicted:
		return fmt.Sprintf("Evicted %s#%d load %d err=%v", v.Gen.Lane, v.Gen.N, v.Load, v.Err)
	case residency.ProbeShape:
		return fmt.Sprintf("Probe %s#%d/%d", v.Gen.Lane, v.Gen.N, v.Rung)
	case residency.Probed:
		return fmt.Sprintf("Probed %s#%d/%d err=%v verdict=%v", v.Gen.Lane, v.Gen.N, v.Cell.Rung, v.Err, v.Verdict)
	case residency.ConfirmExit:
		return fmt.Sprintf("ConfirmExit %s#%d", v.Gen.Lane, v.Gen.N)
	case residency.Exited:
		return fmt.Sprintf("Exited %s#%d", v.Gen.Lane, v.Gen.N)
	case residency.ExchangeFault:
		return fmt.Sprintf("ExchangeFault %s#%d %v", v.Gen.Lane, v.Gen.N, v.Err)
	case residency.Inventory:
		return fmt.Sprintf("Inventory %s#%d obs %d", v.Gen.Lane, v.Gen.N, v.Observation)
	case residency.Inventoried:
		return fmt.Sprintf("Inventoried %s#%d %v err=%v", v.Gen.Lane, v.Gen.N, v.Rungs, v.Err)
	case residency.Load:
		return fmt.Sprintf("Load %s layers=%d rungs=%v max=%d bound=%s", v.Spec.Lane, v.Spec.Layers, v.Spec.Rungs, v.Spec.MaxResidentShapes, v.Spec.AdmissionBound)
	}
	return fmt.Sprintf("%T%+v", v, v)
}

func rel(t time.Time) string {
	if t.IsZero() {
		return "none"
	}
	return fmt.Sprintf("%.3fs", t.Sub(epoch).Seconds())
}

func isRecycle(err error) bool {
	var we *residency.WorkerError
	return errors.As(err, &we) && we.Code == protocol.CodeRecycle
}
