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
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// harness runs a supervisor on a fake clock.
type harness struct {
	t       testing.TB
	clk     *clocktesting.FakeClock
	s       *Supervisor
	spawner *fakeworker.Spawner
	ctx     context.Context
}

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newHarness(t testing.TB, budget int) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	sp := fakeworker.New(clk)
	sp.Progress = ReportProgress
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

// stepWhilePending advances the fake clock 50 ms at a time while the request waits on it, and
// returns once it is answered. A request answered between a look at it and a step (h.step)
// would have that step wait for a waiter on the clock that never comes.
func (h *harness) stepWhilePending(c <-chan acquired) {
	h.t.Helper()
	for {
		eventually(h.t, "the request answered or something waiting on the clock", func() bool { return !pending(c) || h.clk.HasWaiters() })
		if !pending(c) {
			return
		}
		h.clk.Step(50 * time.Millisecond)
	}
}

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
