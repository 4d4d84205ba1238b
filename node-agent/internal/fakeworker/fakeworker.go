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

// Package fakeworker is a hand-written residency.Worker and Spawner for tests: it records every
// call, takes its time on a fake clock, and has one-shot failure knobs and gates that hold a
// call until the test opens them. Set knobs under the worker's lock (w.Lock(); ...; w.Unlock())
// or in the spawner's Configure, which runs before a worker is handed out.
package fakeworker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// ErrBrokenPipe stands for an I/O fault on a worker's stream.
var ErrBrokenPipe = errors.New("write |1: broken pipe")

// ProgressReporter, if set, receives an admission's progress (the supervisor's ReportProgress).
type ProgressReporter func(ctx context.Context, layersDone int)

// Worker is one fake worker process.
type Worker struct {
	sync.Mutex
	Lane string
	Gen  int64

	clk     *clocktesting.FakeClock
	spawner *Spawner

	calls    []string
	resident map[int]bool
	// AdmitCost is how long an admission of a rung takes on the fake clock.
	AdmitCost map[int]time.Duration
	// CacheHits: admissions report every layer loaded from aned's cache.
	CacheHits bool
	// OmitCounts: an older worker that omits cache_hit_layers and compiled_layers.
	OmitCounts bool
	// ExchangeGate, when set, holds every exchange until it is closed.
	ExchangeGate chan struct{}
	// ExitGate, when set, holds the process's exit after Close until it is closed.
	ExitGate chan struct{}
	// Unkillable: a process wedged in the driver, which not even a kill ends.
	Unkillable bool
	// One-shot errors of the next call of each kind.
	NextAdmitErr, NextEvictErr, NextExchangeErr, NextInventoryErr, NextProbeErr error
	// AdmitErrs answer the next admissions, in order.
	AdmitErrs []error
	// ProbeGate, when set, holds every probe until it is closed.
	ProbeGate chan struct{}
	// InventoryGate, when set, holds every inventory until it is closed.
	InventoryGate chan struct{}
	// ExchangeCost is how long an exchange takes on the fake clock.
	ExchangeCost time.Duration
	// Reply, if set, makes an exchange's reply from its payload (the default echoes it after
	// "<lane>/<rung>:").
	Reply func(rung int, payload []byte) ([]byte, error)

	evictedAt        map[int]time.Time
	inventoryWaiting bool
	inventoryCtxErr  error
	exited           chan struct{}
	exitOnce         sync.Once
	exchanging       int
}

func (w *Worker) record(format string, args ...any) {
	call := fmt.Sprintf(format, args...)
	w.Lock()
	w.calls = append(w.calls, call)
	w.Unlock()
	if w.spawner != nil {
		w.spawner.mu.Lock()
		w.spawner.calls = append(w.spawner.calls, w.Lane+": "+call)
		w.spawner.mu.Unlock()
	}
}

// Calls returns the worker's calls, in order.
func (w *Worker) Calls() []string {
	w.Lock()
	defer w.Unlock()
	return slices.Clone(w.calls)
}

// SetAdmitCost sets how long admitting rung takes.
func (w *Worker) SetAdmitCost(rung int, d time.Duration) {
	w.Lock()
	defer w.Unlock()
	w.AdmitCost[rung] = d
}

// EvictedAt is when rung's release was acknowledged (zero if never).
func (w *Worker) EvictedAt(rung int) time.Time {
	w.Lock()
	defer w.Unlock()
	return w.evictedAt[rung]
}

// Exchanging counts the exchanges in progress.
func (w *Worker) Exchanging() int {
	w.Lock()
	defer w.Unlock()
	return w.exchanging
}

func (w *Worker) take(p *error) error {
	w.Lock()
	defer w.Unlock()
	err := *p
	*p = nil
	return err
}

// Admit implements residency.Worker. An admission with a cost starts its timer before it is
// recorded, so a test that has seen the call may step the clock past it.
func (w *Worker) Admit(ctx context.Context, rung int) (residency.Admission, error) {
	w.Lock()
	cost := w.AdmitCost[rung]
	reporter := w.spawner.Progress
	var done <-chan time.Time
	if cost > 0 && len(w.AdmitErrs) == 0 && w.NextAdmitErr == nil {
		done = w.clk.After(cost)
	}
	w.Unlock()
	w.record("admit %d", rung)
	w.Lock()
	if len(w.AdmitErrs) > 0 {
		err := w.AdmitErrs[0]
		w.AdmitErrs = w.AdmitErrs[1:]
		w.Unlock()
		return residency.Admission{}, err
	}
	w.Unlock()
	if err := w.take(&w.NextAdmitErr); err != nil {
		return residency.Admission{}, err
	}
	if done != nil {
		if reporter != nil {
			reporter(ctx, 11) // half the layers, as a worker reporting progress does
		}
		select {
		case <-done:
		case <-w.exited:
			return residency.Admission{}, ErrBrokenPipe
		}
	}
	w.Lock()
	defer w.Unlock()
	w.resident[rung] = true
	if w.OmitCounts {
		return residency.Admission{}, nil
	}
	layers, zero := 22, 0
	if w.CacheHits {
		return residency.Admission{CacheHitLayers: &layers, CompiledLayers: &zero}, nil
	}
	return residency.Admission{CacheHitLayers: &zero, CompiledLayers: &layers}, nil
}

// Evict implements residency.Worker.
func (w *Worker) Evict(ctx context.Context, rung int) error {
	w.record("evict %d", rung)
	if err := w.take(&w.NextEvictErr); err != nil {
		return err
	}
	w.Lock()
	defer w.Unlock()
	delete(w.resident, rung)
	w.evictedAt[rung] = w.clk.Now()
	return nil
}

// Exchange implements residency.Worker: the reply is "<lane>/<rung>:" and the payload.
func (w *Worker) Exchange(ctx context.Context, rung int, payload []byte) ([]byte, error) {
	w.record("exchange %d", rung)
	w.Lock()
	gate, cost, reply := w.ExchangeGate, w.ExchangeCost, w.Reply
	var done <-chan time.Time
	if cost > 0 && gate == nil {
		done = w.clk.After(cost) // before it counts as exchanging: a test that saw it may step
	}
	w.exchanging++
	w.Unlock()
	defer func() { w.Lock(); w.exchanging--; w.Unlock() }()
	if gate != nil {
		select {
		case <-gate:
		case <-w.exited:
			return nil, ErrBrokenPipe
		}
		if cost > 0 {
			done = w.clk.After(cost)
		}
	}
	if done != nil {
		select {
		case <-done:
		case <-w.exited:
			return nil, ErrBrokenPipe
		}
	}
	if err := w.take(&w.NextExchangeErr); err != nil {
		return nil, err
	}
	if reply != nil {
		return reply(rung, payload)
	}
	return append([]byte(fmt.Sprintf("%s/%d:", w.Lane, rung)), payload...), nil
}

// Inventory implements residency.Worker.
func (w *Worker) Inventory(ctx context.Context) ([]int, error) {
	w.Lock()
	gate := w.InventoryGate
	w.inventoryWaiting = gate != nil
	w.Unlock()
	if gate != nil {
		<-gate
	}
	w.Lock()
	w.inventoryWaiting, w.inventoryCtxErr = false, ctx.Err()
	w.Unlock()
	if err := w.take(&w.NextInventoryErr); err != nil {
		return nil, err
	}
	return w.Resident(), nil
}

// InventoryWaiting reports whether an inventory call waits at InventoryGate.
func (w *Worker) InventoryWaiting() bool {
	w.Lock()
	defer w.Unlock()
	return w.inventoryWaiting
}

// LastInventoryCtxErr is the error of the last inventory call's context when it answered: a
// call cut short by its caller sees it cancelled.
func (w *Worker) LastInventoryCtxErr() error {
	w.Lock()
	defer w.Unlock()
	return w.inventoryCtxErr
}

// Resident lists the rungs the worker holds.
func (w *Worker) Resident() []int {
	w.Lock()
	defer w.Unlock()
	var out []int
	for r := range w.resident {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// Probe implements residency.Worker: 1 ms on the device, 2.5 ms on the CPU.
func (w *Worker) Probe(ctx context.Context, rung int) (time.Duration, time.Duration, error) {
	w.record("probe %d", rung)
	w.Lock()
	gate := w.ProbeGate
	w.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-w.exited:
			return 0, 0, ErrBrokenPipe
		}
	}
	if err := w.take(&w.NextProbeErr); err != nil {
		return 0, 0, err
	}
	return time.Millisecond, 2500 * time.Microsecond, nil
}

// Close implements residency.Worker: the process exits, at once or when ExitGate opens.
func (w *Worker) Close() error {
	w.record("close")
	w.Lock()
	gate := w.ExitGate
	w.Unlock()
	if gate == nil {
		w.Exit()
		return nil
	}
	go func() { <-gate; w.Exit() }()
	return nil
}

// Kill implements residency.Worker: the process exits, unless it is Unkillable.
func (w *Worker) Kill() error {
	w.record("kill")
	w.Lock()
	wedged := w.Unkillable
	w.Unlock()
	if !wedged {
		w.Exit()
	}
	return nil
}

// Exit ends the process (as a crash does).
func (w *Worker) Exit() { w.exitOnce.Do(func() { close(w.exited) }) }

// Exited implements residency.Worker.
func (w *Worker) Exited() <-chan struct{} { return w.exited }

// Spawner starts fake Workers and remembers them.
type Spawner struct {
	Clk *clocktesting.FakeClock
	// Configure, if set, adjusts each new worker before it is handed out.
	Configure func(*Worker)
	// Progress, if set, receives the admissions' progress reports.
	Progress ProgressReporter

	mu      sync.Mutex
	workers []*Worker
	// gate, when set, holds every spawn until it is closed.
	gate         chan struct{}
	nextSpawnErr error
	cached       []int
	calls        []string
}

// New returns a spawner on clk.
func New(clk *clocktesting.FakeClock) *Spawner { return &Spawner{Clk: clk} }

// HoldSpawns holds every spawn until the returned channel is closed.
func (f *Spawner) HoldSpawns() chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
	return f.gate
}

// FailNextSpawn makes the next spawn fail with err.
func (f *Spawner) FailNextSpawn(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextSpawnErr = err
}

// ReportCached makes new workers report rungs held by aned (LOADED's ane_cached_shapes).
func (f *Spawner) ReportCached(rungs []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cached = rungs
}

// MachineCalls returns every worker's calls in the order they happened, as "lane: call".
func (f *Spawner) MachineCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// Find returns the gen-th worker spawned for lane, or nil.
func (f *Spawner) Find(lane string, gen int64) *Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.workers {
		if w.Lane == lane && w.Gen == gen {
			return w
		}
	}
	return nil
}

// Get returns the gen-th worker spawned for lane, failing the test if there is none.
func (f *Spawner) Get(t testing.TB, lane string, gen int64) *Worker {
	t.Helper()
	w := f.Find(lane, gen)
	if w == nil {
		t.Fatalf("no worker generation %d of %s was spawned", gen, lane)
	}
	return w
}

// Spawned counts the workers spawned for lane.
func (f *Spawner) Spawned(lane string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.workers {
		if w.Lane == lane {
			n++
		}
	}
	return n
}

// Workers returns every worker spawned, in order.
func (f *Spawner) Workers() []*Worker {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.workers)
}

// Spawn implements residency.Spawner.
func (f *Spawner) Spawn(ctx context.Context, spec residency.ModelSpec, gen int64) (residency.Worker, []int, error) {
	f.mu.Lock()
	gate := f.gate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.nextSpawnErr; err != nil {
		f.nextSpawnErr = nil
		return nil, nil, err
	}
	w := &Worker{clk: f.Clk, spawner: f, Lane: spec.Lane, Gen: gen, resident: map[int]bool{}, AdmitCost: map[int]time.Duration{},
		evictedAt: map[int]time.Time{}, exited: make(chan struct{})}
	if f.Configure != nil {
		f.Configure(w)
	}
	f.workers = append(f.workers, w)
	return w, f.cached, nil
}
