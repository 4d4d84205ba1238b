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
	"slices"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// admissions lists the rungs a worker admitted, in order.
func admissions(w *fakeworker.Worker) []string {
	return slices.DeleteFunc(w.Calls(), func(c string) bool { return len(c) < 5 || c[:5] != "admit" })
}

func (h *harness) prewarmState(lane string) string {
	s, ok := h.s.Prewarmed(lane)
	if !ok {
		return ""
	}
	return s.State
}

func TestPrewarmLoadsItsRungsInOrderOneAdmissionAtATime(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) { w.AdmitCost[256] = 5 * time.Second }
	h.load("a")
	if err := h.s.Prewarm("a", []int{128, 256, 512}); err != nil {
		t.Fatal(err)
	}
	w := h.spawner.Get(t, "a", 1)
	eventually(t, "256 is being prewarmed", func() bool { return len(admissions(w)) == 2 })
	if got := admissions(w); !slices.Equal(got, []string{"admit 128", "admit 256"}) {
		t.Fatalf("admissions %v: 512 must wait for 256", got)
	}
	h.clk.Step(5 * time.Second)
	eventually(t, "prewarm finished", func() bool { return h.prewarmState("a") == "Finished" })
	sum, _ := h.s.Prewarmed("a")
	if !slices.Equal(sum.Loaded, []int{128, 256, 512}) || sum.Compiled != 3 || sum.Total != 5*time.Second {
		t.Fatalf("summary %+v", sum)
	}
}

func TestPrewarmNeverEvictsAndTheFirstRungThatDoesNotFitEndsIt(t *testing.T) {
	h := newHarness(t, 44)
	h.load("a")
	h.load("b")
	h.resident("b", 128).Release()
	if err := h.s.Prewarm("a", []int{128, 256, 512}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "prewarm finished", func() bool { return h.prewarmState("a") == "Finished" })
	sum, _ := h.s.Prewarmed("a")
	if !slices.Equal(sum.Loaded, []int{128}) || sum.SkippedForBudget != 1 {
		t.Fatalf("summary %+v, want 128 loaded and prewarm ended at 256", sum)
	}
	if slices.Contains(h.spawner.Get(t, "b", 1).Calls(), "evict 128") {
		t.Fatal("prewarm evicted another lane's shape")
	}
	if got := admissions(h.spawner.Get(t, "a", 1)); !slices.Equal(got, []string{"admit 128"}) {
		t.Fatalf("admissions %v: 512 must not be tried after 256 did not fit", got)
	}
}

func TestARequestOutranksPrewarmAndWaitsOnlyForTheRunningPrewarmAdmission(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) {
		w.AdmitCost[128] = 2 * time.Second
		w.AdmitCost[256] = 2 * time.Second
	}
	h.load("a")
	h.load("b")
	if err := h.s.Prewarm("a", []int{128, 256}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a/128 is being prewarmed", func() bool { return len(admissions(h.spawner.Get(t, "a", 1))) == 1 })
	req := h.acquire("b", 512)
	eventually(t, "the request is queued", h.state(func(i residency.Inspection) bool { return len(i.Queued) == 1 }))
	h.clk.Step(2 * time.Second) // the prewarm admission on the wire finishes first
	h.step(50 * time.Millisecond)
	if r := h.got(req); r.err != nil {
		t.Fatal(r.err)
	} else {
		r.lease.Release()
	}
	// The request went before the rest of the prewarm.
	eventually(t, "a/256 is prewarmed after the request", func() bool { return len(admissions(h.spawner.Get(t, "a", 1))) == 2 })
	calls := h.spawner.MachineCalls()
	if i, j := slices.Index(calls, "b: admit 512"), slices.Index(calls, "a: admit 256"); i < 0 || j < i {
		t.Fatalf("machine calls %v: prewarm continued ahead of the request", calls)
	}
}

func TestARefusedPrewarmAdmissionEndsPrewarmWithoutRestart(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) {
		w.NextAdmitErr = &WorkerError{Code: "ane_resources_exhausted", Message: "full"}
	}
	h.load("a")
	if err := h.s.Prewarm("a", []int{128, 256}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "prewarm ended", func() bool { return h.prewarmState("a") == "Finished" })
	sum, _ := h.s.Prewarmed("a")
	if sum.Failed != 1 || len(sum.Loaded) != 0 || h.spawner.Spawned("a") != 1 {
		t.Fatalf("summary %+v, %d workers spawned; want one failure, no restart", sum, h.spawner.Spawned("a"))
	}
	if got := admissions(h.spawner.Get(t, "a", 1)); len(got) != 1 {
		t.Fatalf("admissions %v after the refusal", got)
	}
}

func TestRetirementCancelsTheRestOfPrewarm(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) { w.AdmitCost[128] = time.Second }
	h.load("a")
	if err := h.s.Prewarm("a", []int{128, 256, 512}); err != nil {
		t.Fatal(err)
	}
	w := h.spawner.Get(t, "a", 1)
	eventually(t, "a/128 is being prewarmed", func() bool { return len(admissions(w)) == 1 })
	retired := make(chan error, 1)
	go func() { retired <- h.s.Retire(h.ctx, "a") }()
	eventually(t, "prewarm was cancelled", func() bool {
		return h.prewarmState("a") == "Cancelled"
	})
	// The admission on the wire finishes first; nothing else is sent.
	h.clk.Step(time.Second)
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	if got := admissions(w); !slices.Equal(got, []string{"admit 128"}) {
		t.Fatalf("admissions %v after the cancel", got)
	}
}

func TestEachWorkerIsPrewarmedOnce(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	if err := h.s.Prewarm("a", []int{128}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "prewarm finished", func() bool { return h.prewarmState("a") == "Finished" })
	// Evict and wait: the same worker is not prewarmed again.
	if err := h.s.Prewarm("a", []int{128}); err != nil {
		t.Fatal(err)
	}
	h.resident("a", 256).Release()
	if got := admissions(h.spawner.Get(t, "a", 1)); !slices.Equal(got, []string{"admit 128", "admit 256"}) {
		t.Fatalf("admissions %v", got)
	}
	// A replacement worker is a new worker: it is prewarmed once too.
	h.faultAnExchange("a", 1)
	eventually(t, "generation 2 prewarmed", func() bool {
		w := h.spawner.Find("a", 2)
		return w != nil && slices.Contains(admissions(w), "admit 128")
	})
}
