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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
	"github.com/go-logr/logr/testr"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestRetirementBetweenPrecheckAndGrantLeavesNoPhantomReservation(t *testing.T) {
	h := newHarness(t, 100)
	exit := make(chan struct{})
	h.spawner.Configure = func(w *fakeworker.Worker) { w.ExitGate = exit }
	h.load("a")
	retired := make(chan error, 1)
	var once sync.Once
	// The request's fast path found nothing to lease; before its slow path reaches the owner,
	// the lane starts retiring (its worker's exit is held, so it stays retiring).
	h.s.testHookAfterPrecheck = func() {
		once.Do(func() {
			go func() { retired <- h.s.Retire(h.ctx, "a") }()
			eventually(t, "the lane is retiring", h.state(func(i residency.Inspection) bool { return i.Models["a"].State == "retiring" }))
		})
	}
	_, err := h.s.Acquire(h.ctx, "a", 128, time.Time{})
	if code := refusal.CodeOf(err); code != refusal.LaneRetired {
		t.Fatalf("got %v, want lane_retired", err)
	}
	if used, idle := h.s.Used(), h.state(func(i residency.Inspection) bool {
		return i.Running == nil && len(i.Queued) == 0 && i.Waiting == 0
	})(); used != 0 || !idle {
		t.Fatalf("a phantom reservation remains: used %d, queue and waiters empty %v", used, idle)
	}
	close(exit)
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	if slices.Contains(h.spawner.Get(t, "a", 1).Calls(), "admit 128") {
		t.Fatal("the retired lane's worker was asked to admit")
	}
}

// faultOnNextExchange makes the lane's current worker fail its next exchange with an I/O error
// and runs one, returning the lease's error.
func (h *harness) faultAnExchange(lane string, gen int64) error {
	h.t.Helper()
	w := h.spawner.Get(h.t, lane, gen)
	w.Lock()
	w.NextExchangeErr = fakeworker.ErrBrokenPipe
	w.Unlock()
	l, err := h.s.Acquire(h.ctx, lane, 128, time.Time{})
	if err != nil {
		h.t.Fatal(err)
	}
	_, err = l.Exchange(context.Background(), []byte("q"))
	l.Release()
	return err
}

func TestRetirementDuringExitConfirmationNeverConnectsReplacement(t *testing.T) {
	t.Run("retired while the old process's exit is unconfirmed", func(t *testing.T) {
		h := newHarness(t, 100)
		exit := make(chan struct{})
		h.spawner.Configure = func(w *fakeworker.Worker) { w.ExitGate = exit }
		h.load("a")
		h.resident("a", 128).Release()
		if err := h.faultAnExchange("a", 1); refusal.CodeOf(err) != refusal.EngineCrashed {
			t.Fatalf("faulted exchange: %v", err)
		}
		eventually(t, "recovery closed the worker", func() bool { return slices.Contains(h.spawner.Get(t, "a", 1).Calls(), "close") })

		retired := make(chan error, 1)
		go func() { retired <- h.s.Retire(h.ctx, "a") }()
		eventually(t, "the lane is retiring", h.state(func(i residency.Inspection) bool { return i.Models["a"].State == "retiring" }))
		// Unconfirmed exit: everything stays charged.
		if used := h.s.Used(); used != 22 {
			t.Fatalf("charged %d before the exit is confirmed, want 22", used)
		}
		close(exit)
		if err := <-retired; err != nil {
			t.Fatal(err)
		}
		if n := h.spawner.Spawned("a"); n != 1 {
			t.Fatalf("%d workers spawned, want no replacement", n)
		}
		if used := h.s.Used(); used != 0 {
			t.Fatalf("charged %d after retirement, want 0", used)
		}
	})

	t.Run("retired while the replacement starts", func(t *testing.T) {
		h := newHarness(t, 100)
		h.load("a")
		h.resident("a", 128).Release()
		spawnGate := h.spawner.HoldSpawns()
		h.faultAnExchange("a", 1)
		eventually(t, "the replacement is starting", h.state(func(i residency.Inspection) bool { return i.Models["a"].Spawning }))

		retired := make(chan error, 1)
		go func() { retired <- h.s.Retire(h.ctx, "a") }()
		eventually(t, "the lane is retiring", h.state(func(i residency.Inspection) bool { return i.Models["a"].State == "retiring" }))
		close(spawnGate)
		if err := <-retired; err != nil {
			t.Fatal(err)
		}
		// The replacement was closed without ever serving anything.
		if calls := h.spawner.Get(t, "a", 2).Calls(); !slices.Equal(calls, []string{"close"}) {
			t.Fatalf("replacement calls %v, want only close", calls)
		}
	})
}

func TestRetirementDrainsInFlightWorkAndRefundsOnlyAfterExit(t *testing.T) {
	h := newHarness(t, 100)
	exit := make(chan struct{})
	h.spawner.Configure = func(w *fakeworker.Worker) { w.ExitGate = exit }
	h.load("a")
	l := h.resident("a", 128)

	retired := make(chan error, 1)
	go func() { retired <- h.s.Retire(h.ctx, "a") }()
	eventually(t, "the lane is retiring", h.state(func(i residency.Inspection) bool { return i.Models["a"].State == "retiring" }))
	// No new leases, not even of a resident shape.
	if _, err := h.s.Acquire(h.ctx, "a", 128, time.Time{}); refusal.CodeOf(err) != refusal.LaneRetired {
		t.Fatalf("a new lease on a retiring lane: %v", err)
	}
	// In-flight work finishes on the still-open channel.
	if _, err := l.Exchange(context.Background(), []byte("q")); err != nil {
		t.Fatalf("in-flight exchange during retirement: %v", err)
	}
	w := h.spawner.Get(t, "a", 1)
	if slices.Contains(w.Calls(), "close") {
		t.Fatal("the channel was closed before in-flight work drained")
	}
	l.Release()
	eventually(t, "the drained worker was closed", func() bool { return slices.Contains(w.Calls(), "close") })
	if used := h.s.Used(); used != 22 {
		t.Fatalf("charged %d before the exit is confirmed, want 22", used)
	}
	close(exit)
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	if used := h.s.Used(); used != 0 {
		t.Fatalf("charged %d after the confirmed exit, want 0", used)
	}
}

func TestOneFaultRestartsItsGenerationExactlyOnce(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	h.resident("a", 128).Release()
	// Two leases fail on the same broken worker: one restart.
	l1, _ := h.s.Acquire(h.ctx, "a", 128, time.Time{})
	l2, _ := h.s.Acquire(h.ctx, "a", 128, time.Time{})
	w := h.spawner.Get(t, "a", 1)
	w.Lock()
	w.NextExchangeErr = fakeworker.ErrBrokenPipe
	w.Unlock()
	_, err1 := l1.Exchange(context.Background(), nil)
	w.Exit() // the process died: the second exchange fails too
	w.Lock()
	w.NextExchangeErr = fakeworker.ErrBrokenPipe
	w.Unlock()
	_, err2 := l2.Exchange(context.Background(), nil)
	if refusal.CodeOf(err1) != refusal.EngineCrashed || refusal.CodeOf(err2) != refusal.EngineCrashed {
		t.Fatalf("faulted exchanges answered %v and %v, want engine_crashed (never replayed)", err1, err2)
	}
	if n := len(slices.DeleteFunc(w.Calls(), func(c string) bool { return c != "exchange 128" })); n != 2 {
		t.Fatalf("%d exchanges reached the worker, want each exactly once", n)
	}
	l1.Release()
	l2.Release()
	eventually(t, "generation 2 is connected", h.state(func(i residency.Inspection) bool { return i.Models["a"].Gen == 2 && i.Models["a"].State == "running" }))
	if n := h.spawner.Spawned("a"); n != 2 {
		t.Fatalf("%d workers spawned, want the first and one replacement", n)
	}
	// Every slot of the old process was released.
	if used := h.s.Used(); used != 0 {
		t.Fatalf("charged %d after recovery, want 0", used)
	}
}

func TestAStaleFaultAfterRecoveryDoesNotRestartTheRestoredOwner(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	stale := h.resident("a", 128) // a lease of generation 1, faulted below but released late
	w := h.spawner.Get(t, "a", 1)
	w.Lock()
	w.NextExchangeErr = fakeworker.ErrBrokenPipe
	w.Unlock()
	if _, err := stale.Exchange(context.Background(), nil); err == nil {
		t.Fatal("the exchange did not fail")
	}
	// Another lease of generation 1 reports the fault first and recovery completes.
	if err := h.faultAnExchange("a", 1); err == nil {
		t.Fatal("no fault")
	}
	eventually(t, "generation 2 is connected", h.state(func(i residency.Inspection) bool { return i.Models["a"].Gen == 2 && i.Models["a"].State == "running" }))
	stale.Release()
	h.resident("a", 128).Release() // the restored owner serves
	if n := h.spawner.Spawned("a"); n != 2 {
		t.Fatalf("%d workers spawned: the stale fault restarted the restored owner", n)
	}
	if calls := h.spawner.Get(t, "a", 2).Calls(); slices.Contains(calls, "close") {
		t.Fatalf("generation 2 was closed: %v", calls)
	}
}

func TestAFailedAdmissionKeepsTheCompileGateAndBudgetUntilTheOldProcessExitIsConfirmed(t *testing.T) {
	h := newHarness(t, 100)
	exit := make(chan struct{})
	h.spawner.Configure = func(w *fakeworker.Worker) {
		if w.Gen == 1 && w.Lane == "a" {
			w.ExitGate = exit
			w.NextAdmitErr = fakeworker.ErrBrokenPipe
		}
	}
	h.load("a")
	h.load("b")
	ra := h.acquire("a", 128)
	h.admitWaiting()
	if a := h.got(ra); refusal.CodeOf(a.err) != refusal.EngineCrashed {
		t.Fatalf("failed admission answered %v", a.err)
	}
	rb := h.acquire("b", 128)
	h.admitWaiting()
	if !pending(rb) || h.s.Used() != 22 {
		t.Fatalf("b was admitted (used %d) while a's failed admission should hold the gate", h.s.Used())
	}
	// Released at the confirmed exit, even though the replacement fails to start.
	h.spawner.FailNextSpawn(errors.New("exec: no such file"))
	close(exit)
	if b := h.got(rb); b.err != nil {
		t.Fatal(b.err)
	} else {
		b.lease.Release()
	}
	if used := h.s.Used(); used != 22 {
		t.Fatalf("charged %d, want only b's 22", used)
	}
}

func TestAnUnknownOutcomeHoldsTheCompileGateAtMost35SecondsAfterItsRestartBegan(t *testing.T) {
	h := newHarness(t, 100)
	exit := make(chan struct{}) // never opened: the exit is never confirmed
	h.spawner.Configure = func(w *fakeworker.Worker) {
		if w.Lane == "a" {
			w.ExitGate = exit
			w.Unkillable = true
			w.NextAdmitErr = fakeworker.ErrBrokenPipe
		}
	}
	h.load("a")
	h.load("b")
	ra := h.acquire("a", 128)
	h.admitWaiting()
	h.got(ra)
	began := h.clk.Now()
	rb := h.acquire("b", 128)
	h.admitWaiting()

	// After ExitGrace the wedged worker is killed, which does not confirm its exit either:
	// the gate stays held.
	eventually(t, "recovery closed the worker", func() bool { return slices.Contains(h.spawner.Get(t, "a", 1).Calls(), "close") })
	// Two things wait on the clock now: the scheduler (the 35 s gate hold) and the exit
	// watcher (its grace).
	eventually(t, "the exit watcher waits out its grace", func() bool { return h.clk.Waiters() >= 2 })
	h.clk.Step(ExitGrace)
	eventually(t, "the worker was killed after its exit grace", func() bool { return slices.Contains(h.spawner.Get(t, "a", 1).Calls(), "kill") })
	almost := began.Add(UnknownOutcomeGateHold - time.Millisecond)
	h.clk.Step(almost.Sub(h.clk.Now()))
	if h.state(func(i residency.Inspection) bool { return i.Running == nil || !i.Held })() {
		t.Fatal("the gate was freed before 35 s")
	}
	h.clk.Step(time.Millisecond)
	if b := h.got(rb); b.err != nil {
		t.Fatal(b.err)
	} else {
		b.lease.Release()
	}
	// The budget of the unconfirmed process stays charged.
	if used := h.s.Used(); used != 44 {
		t.Fatalf("charged %d, want a's unconfirmed 22 plus b's 22", used)
	}
}

func TestAWorkerAnsweringAnAdmissionWithAnErrorFreesTheGateAtOnceWithoutRestart(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) {
		if w.Lane == "a" {
			w.NextAdmitErr = &WorkerError{Code: "ane_resources_exhausted", Message: "the device address window is full"}
		}
	}
	h.load("a")
	ra := h.acquire("a", 128)
	h.admitWaiting()
	if a := h.got(ra); refusal.CodeOf(a.err) != refusal.ResourcesExhausted {
		t.Fatalf("got %v, want ane_resources_exhausted", a.err)
	}
	if h.s.Used() != 0 || h.state(func(i residency.Inspection) bool { return i.Running != nil })() {
		t.Fatal("the refused admission kept its budget or the gate")
	}
	if n := h.spawner.Spawned("a"); n != 1 {
		t.Fatalf("%d workers spawned, want no restart", n)
	}
}

func TestIfTheSchedulerStopsEveryRequestIsAnsweredEngineCrashedWithTheLaneID(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	waiting := h.acquire("a", 128)
	eventually(t, "the request waits", h.state(func(i residency.Inspection) bool { return i.Waiting == 1 }))
	h.s.in <- input{fn: func(*residency.Core) { panic("scheduler bug") }}
	for _, a := range []acquired{h.got(waiting), func() acquired {
		l, err := h.s.Acquire(context.Background(), "a", 128, time.Time{})
		return acquired{&l, err}
	}()} {
		var r *refusal.Error
		if !errors.As(a.err, &r) || r.Code != refusal.EngineCrashed || r.Lane != "a" {
			t.Fatalf("got %v, want engine_crashed for lane a", a.err)
		}
	}
}

func TestALoadTheDeviceRefusesForResourcesEvictsAndRetriesOnce(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	h.load("b")
	h.resident("a", 128).Release()
	b := h.spawner.Get(t, "b", 1)
	b.Lock()
	b.NextAdmitErr = &WorkerError{Code: "ane_resources_exhausted", Message: "0x20004: the device address window is full"}
	b.Unlock()
	req := h.acquire("b", 128)
	h.admitWaiting()
	r := h.got(req)
	if r.err != nil {
		t.Fatalf("got %v, want the admission retried after an eviction", r.err)
	}
	r.lease.Release()
	if calls := h.spawner.MachineCalls(); !slices.Equal(calls[len(calls)-3:], []string{"b: admit 128", "a: evict 128", "b: admit 128"}) {
		t.Fatalf("machine calls %v, want admit, evict, admit", calls)
	}
	if n := h.spawner.Spawned("b"); n != 1 {
		t.Fatalf("%d workers spawned, want no restart", n)
	}
	// Refused twice: the request is answered with the refusal.
	b.Lock()
	b.AdmitErrs = []error{
		&WorkerError{Code: "ane_resources_exhausted", Message: "full"},
		&WorkerError{Code: "ane_resources_exhausted", Message: "still full"},
	}
	b.Unlock()
	req = h.acquire("b", 256)
	h.admitWaiting()
	if r := h.got(req); refusal.CodeOf(r.err) != refusal.ResourcesExhausted {
		t.Fatalf("got %v, want ane_resources_exhausted after one retry", r.err)
	}
}

func TestADeadWorkerWhoseReplacementFailsToStartFailsEveryRequestBackendUnavailable(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	h.resident("a", 128).Release()
	h.spawner.FailNextSpawn(errors.New("the worker binary is gone"))
	if err := h.faultAnExchange("a", 1); refusal.CodeOf(err) != refusal.EngineCrashed {
		t.Fatalf("faulted exchange: %v", err)
	}
	eventually(t, "the replacement failed to start", h.state(func(i residency.Inspection) bool { return i.Models["a"].SpawnFailures > 0 }))

	// Every request now fails at once, loudly; none waits for a worker that is not coming.
	for range 3 {
		_, err := h.s.Acquire(h.ctx, "a", 128, time.Time{})
		if refusal.CodeOf(err) != refusal.BackendUnavailable {
			t.Fatalf("a request while the worker is dead: %v", err)
		}
	}
	// The retry, a second later, spawns a replacement, which serves again. (Fake time moves on
	// until it has: the retry's timer may be set after any one step.)
	eventually(t, "the replacement is connected", func() bool {
		if snap, _ := h.s.Snapshot("a"); snap.Running && snap.Generation == 2 {
			return true
		}
		h.clk.Step(100 * time.Millisecond)
		return false
	})
	// Its admission is timed on the fake clock, as the retry was: a step taken for the retry's
	// timer, set a moment late, would otherwise pass before the admission waits on the clock.
	got := h.acquire("a", 128)
	var a acquired
	eventually(t, "the request after recovery is answered", func() bool {
		select {
		case a = <-got:
			return true
		default:
		}
		h.clk.Step(50 * time.Millisecond)
		return false
	})
	if a.err != nil {
		t.Fatalf("after recovery: %v", a.err)
	}
	a.lease.Release()
}

func TestAWorkerThatAsksToBeReplacedHasItsAdmissionRunByTheReplacement(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	w := h.spawner.Get(t, "a", 1)
	w.Lock()
	w.AdmitErrs = []error{&WorkerError{Code: protocol.CodeRecycle, Message: "rung 128 needs 22 compiles and this worker has made 90 of its 100"}}
	w.Unlock()
	c := h.acquire("a", 128)
	h.admitWaiting()
	// The request is not failed: it waits, with its admission, for the replacement.
	eventually(t, "generation 2 runs", h.state(func(i residency.Inspection) bool { return i.Models["a"].Gen == 2 && i.Models["a"].State == "running" }))
	h.stepWhilePending(c)
	a := h.got(c)
	if a.err != nil || a.lease.Generation() != 2 {
		t.Fatalf("the request: %v, want a lease on the replacement", a.err)
	}
	a.lease.Release()
	if calls := w.Calls(); !slices.Equal(calls, []string{"admit 128", "close"}) {
		t.Fatalf("the first worker's calls %v, want its refused admission and its close", calls)
	}
	if calls := h.spawner.Get(t, "a", 2).Calls(); !slices.Equal(calls, []string{"admit 128"}) {
		t.Fatalf("the replacement's calls %v, want the admission", calls)
	}
	snap, _ := h.s.Snapshot("a")
	if snap.LastFault == nil || snap.LastFault.Code != protocol.CodeRecycle {
		t.Fatalf("last fault %+v, want the recycle said as such", snap.LastFault)
	}
}

func TestAnAdmissionIsRecycledOnceNotForEver(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) {
		w.AdmitErrs = []error{&WorkerError{Code: protocol.CodeRecycle, Message: "no compiles left"}}
	}
	h.load("a")
	c := h.acquire("a", 128)
	h.admitWaiting()
	eventually(t, "generation 2 runs", h.state(func(i residency.Inspection) bool { return i.Models["a"].Gen == 2 && i.Models["a"].State == "running" }))
	h.stepWhilePending(c)
	if a := h.got(c); refusal.CodeOf(a.err) != refusal.WorkerRefused || !strings.Contains(a.err.Error(), "no compiles left") {
		t.Fatalf("a second recycle of the same admission: %v, want worker_refused", a.err)
	}
	if n := h.spawner.Spawned("a"); n != 2 {
		t.Fatalf("%d workers spawned, want the first and one replacement", n)
	}
}

// TestCallsWaitingForTheOwnerReturnWhenItStops: a LoadModel, Retire or Observe whose input
// the owner never took (it stopped first) returns with the stop, never hangs.
func TestCallsWaitingForTheOwnerReturnWhenItStops(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	s := New(Config{Clock: clk, Spawner: fakeworker.New(clk), Log: testr.New(t), CertifyObservation: true})
	// No owner runs: the inputs stay queued. Then the owner stops.
	errs := make(chan error, 3)
	go func() {
		errs <- s.LoadModel(context.Background(), ModelSpec{Lane: "a", Layers: 22, Rungs: []int{128}, MaxResidentShapes: 1})
	}()
	go func() { errs <- s.Retire(context.Background(), "a") }()
	go func() { _, err := s.Observe(context.Background()); errs <- err }()
	eventually(t, "the three inputs are queued", func() bool { return len(s.in) == 3 })
	s.abort(errors.New("scheduler bug"))
	for range 3 {
		select {
		case err := <-errs:
			if err == nil || !strings.Contains(err.Error(), "the compile scheduler stopped") {
				t.Fatalf("got %v, want the stop", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call still waits for an owner that stopped")
		}
	}
}

// TestASecondLoadOfALaneBeingLoadedIsRefusedAndTheFirstKeepsItsAnswer.
func TestASecondLoadOfALaneBeingLoadedIsRefusedAndTheFirstKeepsItsAnswer(t *testing.T) {
	h := newHarness(t, 100)
	gate := h.spawner.HoldSpawns()
	spec := ModelSpec{Lane: "a", Identity: "gte", Layers: 22, Rungs: []int{128}, MaxResidentShapes: 1, AdmissionBound: time.Minute}
	first := make(chan error, 1)
	go func() { first <- h.s.LoadModel(h.ctx, spec) }()
	eventually(t, "the first load waits for its worker", h.state(func(i residency.Inspection) bool { return i.Models["a"].Spawning }))
	if err := h.s.LoadModel(h.ctx, spec); err == nil || !strings.Contains(err.Error(), "already being loaded") {
		t.Fatalf("the second load: %v", err)
	}
	close(gate)
	if err := <-first; err != nil {
		t.Fatalf("the first load: %v", err)
	}
}

// TestAHandoffAnsweredJustBeforeTheOwnerStopsIsNeverALease: a request whose handoff answer
// the owner sent just before it stopped finds both its reply and the stop ready at once. The
// handoff is not a lease: it must be answered with the stop, never returned as an answer with
// no shape and no error (serving would dereference the missing shape).
func TestAHandoffAnsweredJustBeforeTheOwnerStopsIsNeverALease(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	s := New(Config{Clock: clk, Spawner: fakeworker.New(clk), Log: testr.New(t)})
	s.abort(errors.New("scheduler bug"))
	req := &request{ticket: 7, lane: "a", reply: make(chan residency.Answer, 1)}
	req.reply <- residency.Answer{Ticket: 7, Lane: "a", Handoff: true}
	a, err := s.answerAfterStop(req, residency.Acquire{Ticket: 7, Lane: "a", Rung: 128, Member: true})
	if refusal.CodeOf(err) != refusal.EngineCrashed || a.Cell != nil {
		t.Fatalf("a handoff left before the stop was answered %+v, %v; want engine_crashed", a, err)
	}
	// A final answer left before the stop is still delivered as it was.
	req.reply <- residency.Answer{Ticket: 7, Lane: "a", Err: refusal.New(refusal.ShapeCompiling, "a", "later")}
	if a, err := s.answerAfterStop(req, residency.Acquire{Ticket: 7, Lane: "a"}); err != nil || refusal.CodeOf(a.Err) != refusal.ShapeCompiling {
		t.Fatalf("a final answer left before the stop became %+v, %v", a, err)
	}
}

// TestProbeResidentAfterTheOwnerStopsAnswersTheStop: a stopped core's view holds no lanes, which
// must not read as "not resident".
func TestProbeResidentAfterTheOwnerStopsAnswersTheStop(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	s := New(Config{Clock: clk, Spawner: fakeworker.New(clk), Log: testr.New(t)})
	s.abort(errors.New("scheduler bug"))
	resident, err := s.ProbeResident(context.Background(), "a", 128)
	if resident || refusal.CodeOf(err) != refusal.EngineCrashed {
		t.Fatalf("ProbeResident after the stop: %v, %v; want engine_crashed", resident, err)
	}
}
