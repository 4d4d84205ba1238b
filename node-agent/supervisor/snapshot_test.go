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
	"sync/atomic"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

func TestSnapshotReportsAdmissionProgressResidencyAndFaults(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) { w.SetAdmitCost(256, 2*time.Minute) }
	h.load("a")
	if _, ok := h.s.Snapshot("b"); ok {
		t.Fatal("a lane that is not loaded has a snapshot")
	}

	h.resident("a", 128).Release()
	slow := h.acquire("a", 256)
	h.admitWaiting()
	eventually(t, "the worker reported half its layers", func() bool {
		snap, _ := h.s.Snapshot("a")
		return snap.Admitting != nil && snap.Admitting.LayersDone == 11
	})
	snap, _ := h.s.Snapshot("a")
	a := snap.Admitting
	want := compilequeue.NewCostModel().Predict(compilequeue.Shape{Model: "gte", Rung: 256}, 22, false).Cost
	if a.Rung != 256 || a.LayersTotal != 22 || a.PredictedDone.Sub(a.Started) != want {
		t.Fatalf("admitting %+v, want rung 256 of 22 layers predicted %s", a, want)
	}
	if !slices.Equal(snap.Resident, []int{128}) || !snap.Running || snap.Generation != 1 {
		t.Fatalf("snapshot %+v, want generation 1 running with 128 resident", snap)
	}
	node := h.s.Node()
	if node.QueueLength != 1 || node.Running != "a@256" || !node.PredictedDrain.Equal(a.PredictedDone) || node.Used != 44 {
		t.Fatalf("node %+v, want one running admission a@256 draining at %s with 44 used", node, a.PredictedDone)
	}

	h.step(2 * time.Minute)
	h.got(slow).lease.Release()
	snap, _ = h.s.Snapshot("a")
	if snap.Admitting != nil || !slices.Equal(snap.Resident, []int{128, 256}) || !slices.Equal(snap.Cached, []int{128, 256}) {
		t.Fatalf("after the admission: %+v", snap)
	}

	if err := h.faultAnExchange("a", 1); refusal.CodeOf(err) != refusal.EngineCrashed {
		t.Fatalf("faulted exchange: %v", err)
	}
	eventually(t, "the replacement is connected", func() bool {
		snap, _ := h.s.Snapshot("a")
		return snap.Generation == 2 && snap.Running
	})
	snap, _ = h.s.Snapshot("a")
	if snap.Restarts != 1 || snap.LastFault == nil || snap.LastFault.Code != string(refusal.EngineCrashed) || len(snap.Resident) != 0 {
		t.Fatalf("after the fault: %+v (fault %+v)", snap, snap.LastFault)
	}
	if c := h.s.Node().Counts; c != (Counts{Compiles: 2, Restarts: 1}) {
		t.Fatalf("counts %+v, want 2 compiles and 1 restart", c)
	}
	if lanes := h.s.Lanes(); !slices.Equal(lanes, []string{"a"}) {
		t.Fatalf("lanes %v", lanes)
	}
}

// TestWithoutCacheReportsEveryRungIsPredictedAndLearnedAsACompile drives a worker that sends
// neither ane_cached_shapes nor cache_hit_layers/compiled_layers: no rung is marked cached,
// every admission is predicted as a compile, and its time is learned as one.
func TestWithoutCacheReportsEveryRungIsPredictedAndLearnedAsACompile(t *testing.T) {
	h := newHarness(t, 100)
	h.spawner.Configure = func(w *fakeworker.Worker) {
		w.OmitCounts = true
		w.AdmitCost[128] = 3 * time.Second
	}
	h.load("a", func(s *ModelSpec) { s.MaxResidentShapes = 1 })
	queued := func(rung int) residency.JobInfo {
		t.Helper()
		var job residency.JobInfo
		eventually(t, "the admission is queued", h.state(func(i residency.Inspection) bool {
			for _, j := range i.Queued {
				if j.Owner == "a" && j.Rung == rung {
					job = j
					return true
				}
			}
			return false
		}))
		return job
	}
	admitFor := func(n int) {
		t.Helper()
		h.step(50 * time.Millisecond)
		eventually(t, "the admission reached the worker", func() bool { return len(admissions(h.spawner.Get(t, "a", 1))) == n })
		h.clk.Step(3 * time.Second)
	}
	first := h.acquire("a", 128)
	if j := queued(128); j.Kind != "compile" {
		t.Fatalf("the first admission of 128 is predicted as a %s", j.Kind)
	}
	admitFor(1)
	h.got(first).lease.Release()
	if snap, _ := h.s.Snapshot("a"); len(snap.Cached) != 0 {
		t.Fatalf("cached %v from a worker that reported nothing", snap.Cached)
	}
	// 256 takes 128's one slot; 128 asked again is predicted as a compile of the learned 3 s.
	second := h.acquire("a", 256)
	if j := queued(256); j.Kind != "compile" {
		t.Fatalf("256 is predicted as a %s", j.Kind)
	}
	h.step(50 * time.Millisecond)
	h.got(second).lease.Release()
	third := h.acquire("a", 128)
	if j := queued(128); j.Kind != "compile" || j.Cost != 3*time.Second {
		t.Fatalf("128 again is predicted as a %s of %s, want a compile of the learned 3s", j.Kind, j.Cost)
	}
	admitFor(3)
	h.got(third).lease.Release()
}

// TestAnIdleNodeNeitherStepsNorWakesItsWatchers: asking whether a probed, resident rung is
// probed is answered from the published view, and a step that changes nothing wakes no watcher,
// so the agent's probe loop and status writer cannot drive each other round on an idle node.
func TestAnIdleNodeNeitherStepsNorWakesItsWatchers(t *testing.T) {
	h := newHarness(t, 100)
	var changes atomic.Int64
	h.s.cfg.OnChange = func() { changes.Add(1) }
	h.load("a", func(s *ModelSpec) { s.Probe = func(int, int64, time.Duration, time.Duration) error { return nil } })
	h.resident("a", 128).Release()
	eventually(t, "the probe passed", h.state(func(i residency.Inspection) bool { sh, _ := i.Shape("a", 128); return sh.Probed }))
	h.inspection() // every step so far is done
	before := changes.Load()
	for range 100 {
		if probed, err := h.s.ProbeResident(h.ctx, "a", 128); !probed || err != nil {
			t.Fatalf("ProbeResident: %v, %v", probed, err)
		}
	}
	h.s.wake() // a step with nothing to do
	h.inspection()
	if n := changes.Load() - before; n != 0 {
		t.Fatalf("%d wake-ups of the watchers on an idle node, want none", n)
	}
}
