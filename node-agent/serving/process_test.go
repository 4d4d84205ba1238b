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

package serving

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/workertest"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

var workerBinary string

func TestMain(m *testing.M) { os.Exit(workertest.Main(m, &workerBinary)) }

// fleet is one lane served by real sim worker processes under the supervisor.
type fleet struct {
	sup     *supervisor.Supervisor
	srv     *Server
	mu      sync.Mutex
	spawned map[int64]int
}

const laneName = "default/gte-search"

// newFleet starts the supervisor over real workers; faults(gen) injects faults per generation.
func newFleet(t *testing.T, faults func(gen int64) string) *fleet {
	f := &fleet{spawned: map[int64]int{}}
	host := workerhost.New(workerhost.Config{Binary: workerBinary, Backend: "sim", StateDir: t.TempDir(), SimScale: 0.0001,
		Log: testr.New(t), CallTimeout: 10 * time.Second,
		Env: func(lane string, gen int64) []string {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.spawned[gen]++
			if spec := faults(gen); spec != "" {
				return []string{"SYNAPSE_WORKER_FAULTS=" + spec}
			}
			return nil
		}})
	f.sup = supervisor.New(supervisor.Config{Clock: clock.RealClock{}, Spawner: host, Log: testr.New(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.sup.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	spec := supervisor.ModelSpec{Lane: laneName, Identity: "gte-modernbert-base-25b78-w1", Model: "gte-modernbert-base",
		Dimensions: 768, Layers: 22, Rungs: []int{128, 256}, MaxResidentShapes: 2, AdmissionBound: 600 * time.Second}
	if err := f.sup.LoadModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	f.srv = New(Supervised(f.sup), clock.RealClock{})
	f.srv.AddLane(Lane{Name: laneName, Task: "embed", Rungs: spec.Rungs, Ceiling: 256, Dimensions: 768})
	return f
}

func (f *fleet) run(t *testing.T) (*Result, error) {
	t.Helper()
	return f.srv.Run(context.Background(), laneName, "embed", [][]uint32{tokens(20), tokens(200)}, time.Time{})
}

func (f *fleet) spawns() map[int64]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[int64]int{}
	for k, v := range f.spawned {
		out[k] = v
	}
	return out
}

// served runs calls until one succeeds (engine_crashed answers are retried, as a client does).
func (f *fleet) served(t *testing.T) *Result {
	t.Helper()
	for range 100 {
		res, err := f.run(t)
		if err == nil {
			return res
		}
		if refusal.CodeOf(err) != refusal.EngineCrashed {
			t.Fatal(err)
		}
	}
	t.Fatal("never served")
	return nil
}

func TestServingAdmissionChannelFaultRestartsExactlyOnce(t *testing.T) {
	f := newFleet(t, func(gen int64) string {
		if gen == 1 {
			return "crash:admit:1"
		}
		return ""
	})
	if _, err := f.run(t); refusal.CodeOf(err) != refusal.EngineCrashed {
		t.Fatalf("got %v, want engine_crashed", err)
	}
	res := f.served(t)
	if res.Generations[0] != 2 {
		t.Fatalf("served by generation %v, want the replacement", res.Generations)
	}
	if got := f.spawns(); got[1] != 1 || got[2] != 1 || len(got) != 2 {
		t.Fatalf("spawned %v, want exactly one restart", got)
	}
}

func TestStaleServingFaultAfterRecoveryDoesNotRestartRestoredOwner(t *testing.T) {
	f := newFleet(t, func(gen int64) string {
		if gen == 1 {
			return "malformed:execute:3"
		}
		return ""
	})
	f.served(t) // 128 and 256 resident on generation 1: executes 1 and 2
	// A lease of generation 1 that will fault only after the recovery.
	stale, err := f.sup.Acquire(context.Background(), laneName, 128, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// Another call hits the malformed reply: generation 1 is recovered.
	if _, err := f.srv.Run(context.Background(), laneName, "embed", [][]uint32{tokens(200)}, time.Time{}); refusal.CodeOf(err) != refusal.EngineCrashed {
		t.Fatalf("got %v, want engine_crashed", err)
	}
	res := f.served(t)
	if res.Generations[0] != 2 {
		t.Fatalf("served by %v, want generation 2", res.Generations)
	}
	// The stale lease's exchange fails on the dead process; its fault is stale.
	if _, err := stale.Exchange(context.Background(), nil); err == nil {
		t.Fatal("an exchange on the exited generation succeeded")
	}
	stale.Release()
	res = f.served(t)
	if res.Generations[0] != 2 {
		t.Fatalf("served by %v after the stale fault, want generation 2 still", res.Generations)
	}
	if got := f.spawns(); len(got) != 2 {
		t.Fatalf("spawned %v: the stale fault restarted the restored owner", got)
	}
}

func TestRerankOverARealWorkerOrdersScoresByInputAndMatchesTheModel(t *testing.T) {
	f := newFleet(t, func(int64) string { return "" })
	spec := supervisor.ModelSpec{Lane: "default/bge-rerank", Identity: "bge-reranker", Model: "bge-reranker",
		Dimensions: 64, Layers: 12, Rungs: []int{128}, MaxResidentShapes: 1, AdmissionBound: 600 * time.Second}
	if err := f.sup.LoadModel(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	f.srv.AddLane(Lane{Name: spec.Lane, Task: "rerank", Rungs: spec.Rungs, Ceiling: 128, Dimensions: 64})
	query := []uint32{11, 12, 13}
	docs := [][]uint32{{11, 12, 13}, {90, 91}, {11, 95, 96, 97}}
	var seqs [][]uint32
	for _, d := range docs {
		seqs = append(seqs, append(append(append([]uint32{}, query...), worker.Separator), d...))
	}
	res, err := f.srv.Run(context.Background(), spec.Lane, "rerank", seqs, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range docs {
		if want := worker.Score(spec.Identity, 64, query, d); res.Scores[i] != want {
			t.Fatalf("score %d is %v, want the model's %v", i, res.Scores[i], want)
		}
	}
	if res.Scores[0] <= res.Scores[1] {
		t.Fatalf("the query itself scored %v, below an unrelated document's %v", res.Scores[0], res.Scores[1])
	}
}
