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
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// errBrokenPipe stands for an I/O fault on a worker's stream.
var errBrokenPipe = errors.New("write |1: broken pipe")

// fakeWorker is a hand-written Worker that records calls and takes its time on the fake
// clock. Its knobs are one-shot errors and gates that hold a call until the test opens them.
type fakeWorker struct {
	clk     *clocktesting.FakeClock
	spawner *fakeSpawner
	lane    string
	gen     int64

	mu       sync.Mutex
	calls    []string
	resident map[int]bool
	// admitCost is how long an admission takes on the fake clock.
	admitCost map[int]time.Duration
	// cacheHits: admissions report every layer loaded from aned's cache.
	cacheHits bool
	// omitCounts: an older worker that omits cache_hit_layers and compiled_layers.
	omitCounts bool
	// exchangeGate, when set, holds every exchange until it is closed.
	exchangeGate chan struct{}
	// exitGate, when set, holds the process's exit after Close until it is closed.
	exitGate chan struct{}
	// unkillable: a process wedged in the driver, which not even a kill ends.
	unkillable bool

	nextAdmitErr, nextEvictErr, nextExchangeErr, nextInventoryErr error
	evictedAt                                                     map[int]time.Time
	// admitErrs answer the next admissions, in order.
	admitErrs []error

	// probeGate, when set, holds every probe until it is closed; nextProbeErr fails the next.
	probeGate    chan struct{}
	nextProbeErr error

	exited     chan struct{}
	exitOnce   sync.Once
	closed     bool
	exchanging int
}

func (w *fakeWorker) record(format string, args ...any) {
	call := fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.calls = append(w.calls, call)
	w.mu.Unlock()
	if w.spawner != nil {
		w.spawner.mu.Lock()
		w.spawner.calls = append(w.spawner.calls, w.lane+": "+call)
		w.spawner.mu.Unlock()
	}
}

func (w *fakeWorker) Calls() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.calls...)
}

func (w *fakeWorker) setAdmitCost(rung int, d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.admitCost[rung] = d
}

func (w *fakeWorker) takeErr(p *error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	err := *p
	*p = nil
	return err
}

func (w *fakeWorker) Admit(ctx context.Context, rung int) (Admission, error) {
	w.record("admit %d", rung)
	w.mu.Lock()
	if len(w.admitErrs) > 0 {
		err := w.admitErrs[0]
		w.admitErrs = w.admitErrs[1:]
		w.mu.Unlock()
		return Admission{}, err
	}
	w.mu.Unlock()
	if err := w.takeErr(&w.nextAdmitErr); err != nil {
		return Admission{}, err
	}
	w.mu.Lock()
	cost := w.admitCost[rung]
	w.mu.Unlock()
	if cost > 0 {
		ReportProgress(ctx, 11) // half the layers, as a worker reporting progress does
		select {
		case <-w.clk.After(cost):
		case <-w.exited:
			return Admission{}, errBrokenPipe
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.resident[rung] = true
	if w.omitCounts {
		return Admission{}, nil
	}
	layers, zero := 22, 0
	if w.cacheHits {
		return Admission{CacheHitLayers: &layers, CompiledLayers: &zero}, nil
	}
	return Admission{CacheHitLayers: &zero, CompiledLayers: &layers}, nil
}

func (w *fakeWorker) Evict(ctx context.Context, rung int) error {
	w.record("evict %d", rung)
	if err := w.takeErr(&w.nextEvictErr); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.resident, rung)
	w.evictedAt[rung] = w.clk.Now()
	return nil
}

func (w *fakeWorker) Exchange(ctx context.Context, rung int, payload []byte) ([]byte, error) {
	w.record("exchange %d", rung)
	w.mu.Lock()
	gate := w.exchangeGate
	w.exchanging++
	w.mu.Unlock()
	defer func() { w.mu.Lock(); w.exchanging--; w.mu.Unlock() }()
	if gate != nil {
		select {
		case <-gate:
		case <-w.exited:
			return nil, errBrokenPipe
		}
	}
	if err := w.takeErr(&w.nextExchangeErr); err != nil {
		return nil, err
	}
	return append([]byte(fmt.Sprintf("%s/%d:", w.lane, rung)), payload...), nil
}

func (w *fakeWorker) Inventory(ctx context.Context) ([]int, error) {
	if err := w.takeErr(&w.nextInventoryErr); err != nil {
		return nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []int
	for r := range w.resident {
		out = append(out, r)
	}
	return out, nil
}

func (w *fakeWorker) Probe(ctx context.Context, rung int) (time.Duration, time.Duration, error) {
	w.record("probe %d", rung)
	w.mu.Lock()
	gate := w.probeGate
	w.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if err := w.takeErr(&w.nextProbeErr); err != nil {
		return 0, 0, err
	}
	return time.Millisecond, 2500 * time.Microsecond, nil
}

func (w *fakeWorker) Close() error {
	w.record("close")
	w.mu.Lock()
	w.closed = true
	gate := w.exitGate
	w.mu.Unlock()
	if gate == nil {
		w.exit()
		return nil
	}
	go func() { <-gate; w.exit() }()
	return nil
}

func (w *fakeWorker) Kill() error {
	w.record("kill")
	w.mu.Lock()
	wedged := w.unkillable
	w.mu.Unlock()
	if !wedged {
		w.exit()
	}
	return nil
}

func (w *fakeWorker) exit()                   { w.exitOnce.Do(func() { close(w.exited) }) }
func (w *fakeWorker) Exited() <-chan struct{} { return w.exited }

// fakeSpawner starts fakeWorkers and remembers them.
type fakeSpawner struct {
	clk *clocktesting.FakeClock

	mu      sync.Mutex
	workers []*fakeWorker
	// configure, if set, adjusts each new worker before it is returned.
	configure func(*fakeWorker)
	// gate, when set, holds every spawn until it is closed.
	gate         chan struct{}
	nextSpawnErr error
	cached       []int
	// calls are every worker's calls, machine-wide, in order, as "lane: call".
	calls []string
}

// machineCalls returns every worker's calls in the order they happened.
func (f *fakeSpawner) machineCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// find returns the gen-th worker spawned for lane, or nil.
func (f *fakeSpawner) find(lane string, gen int64) *fakeWorker {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.workers {
		if w.lane == lane && w.gen == gen {
			return w
		}
	}
	return nil
}

func (f *fakeSpawner) Spawn(ctx context.Context, spec ModelSpec, gen int64) (Worker, []int, error) {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		<-gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.nextSpawnErr; err != nil {
		f.nextSpawnErr = nil
		return nil, nil, err
	}
	w := &fakeWorker{clk: f.clk, spawner: f, lane: spec.Lane, gen: gen, resident: map[int]bool{}, admitCost: map[int]time.Duration{},
		evictedAt: map[int]time.Time{}, exited: make(chan struct{})}
	if f.configure != nil {
		f.configure(w)
	}
	f.workers = append(f.workers, w)
	return w, f.cached, nil
}

// worker returns the gen-th worker spawned for lane.
func (f *fakeSpawner) worker(t testing.TB, lane string, gen int64) *fakeWorker {
	t.Helper()
	w := f.find(lane, gen)
	if w == nil {
		t.Fatalf("no worker generation %d of %s was spawned", gen, lane)
	}
	return w
}

func (f *fakeSpawner) spawned(lane string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.workers {
		if w.lane == lane {
			n++
		}
	}
	return n
}

// harness runs a supervisor on a fake clock.
type harness struct {
	t       testing.TB
	clk     *clocktesting.FakeClock
	s       *Supervisor
	spawner *fakeSpawner
	ctx     context.Context
}

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newHarness(t testing.TB, budget int) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	sp := &fakeSpawner{clk: clk}
	log := logr.Discard()
	if tt, ok := t.(*testing.T); ok {
		log = testr.New(tt)
	}
	s := New(Config{Clock: clk, Spawner: sp, Log: log, Budget: budget, CertifyObservation: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &harness{t: t, clk: clk, s: s, spawner: sp, ctx: ctx}
}

// load loads a 22-layer model with rungs 128..1024 under lane, of identity gte.
func (h *harness) load(lane string, opts ...func(*ModelSpec)) {
	h.t.Helper()
	spec := ModelSpec{Lane: lane, Identity: "gte", Layers: 22, Rungs: []int{128, 256, 512, 1024},
		MaxResidentShapes: 4, AdmissionBound: 600 * time.Second}
	for _, o := range opts {
		o(&spec)
	}
	if err := h.s.LoadModel(h.ctx, spec); err != nil {
		h.t.Fatal(err)
	}
}

type acquired struct {
	lease *Lease
	err   error
}

// acquire starts a request in the background.
func (h *harness) acquire(lane string, rung int) <-chan acquired {
	out := make(chan acquired, 1)
	go func() {
		l, err := h.s.Acquire(h.ctx, lane, rung, time.Time{})
		if err != nil {
			out <- acquired{nil, err}
			return
		}
		out <- acquired{&l, nil}
	}()
	return out
}

// eventually polls cond until it holds; it fails the test after 10 s of real time. It waits
// for goroutines to reach a state, never for time to pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	gomega.NewWithT(t).Eventually(cond).WithTimeout(10*time.Second).WithPolling(time.Millisecond).
		Should(gomega.BeTrue(), "waiting until %s", what)
}

// step advances the fake clock once something waits on it.
func (h *harness) step(d time.Duration) {
	h.t.Helper()
	eventually(h.t, "something waits on the clock", h.clk.HasWaiters)
	h.clk.Step(d)
}

// got waits for a request's answer.
func (h *harness) got(c <-chan acquired) acquired {
	h.t.Helper()
	select {
	case a := <-c:
		return a
	case <-time.After(10 * time.Second):
		h.t.Fatalf("the request was never answered: %s", h.dump())
		return acquired{}
	}
}

// pending reports whether a request is still unanswered.
func pending(c <-chan acquired) bool { return len(c) == 0 }

// inspection copies the core's state on the owner goroutine, between two steps.
func (h *harness) inspection() residency.Inspection {
	h.t.Helper()
	c := make(chan residency.Inspection, 1)
	select {
	case h.s.in <- input{fn: func(core *residency.Core) { c <- core.Inspect() }}:
	case <-h.s.done:
		h.t.Fatal("the supervisor stopped")
	}
	return <-c
}

// state returns a condition on the core's state, for eventually.
func (h *harness) state(f func(i residency.Inspection) bool) func() bool {
	return func() bool { return f(h.inspection()) }
}

// admitWaiting waits until the compile queue holds a job, then steps past its start hold.
func (h *harness) admitWaiting() {
	h.t.Helper()
	eventually(h.t, "a compile is queued", h.state(func(i residency.Inspection) bool { return len(i.Queued) > 0 }))
	h.step(50 * time.Millisecond)
}

// dump describes the supervisor's state, for failure messages.
func (h *harness) dump() string { return h.inspection().String() }

// leases counts the leases held on lane's shapes.
func leases(i residency.Inspection, lane string) int {
	n := 0
	for _, sh := range i.Models[lane].Shapes {
		n += sh.Leases
	}
	return n
}
