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

package workerhost

import (
	"context"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/workertest"
	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// workerBinary is synapse-ane-worker, built once for the package's tests.
var workerBinary string

func TestMain(m *testing.M) { os.Exit(workertest.Main(m, &workerBinary)) }

var spec = supervisor.ModelSpec{Lane: "default/gte-search", Identity: "gte-modernbert-base-25b78-w1", Model: "gte-modernbert-base",
	Dimensions: 768, Layers: 22, Rungs: []int{128, 256, 512}, MaxResidentShapes: 3, AdmissionBound: 600 * time.Second}

func newHost(t *testing.T, mutate ...func(*Config)) *Host {
	cfg := Config{Binary: workerBinary, Backend: "sim", StateDir: t.TempDir(), SimScale: 0.0001, Log: testr.New(t),
		CallTimeout: 10 * time.Second}
	for _, f := range mutate {
		f(&cfg)
	}
	return New(cfg)
}

// faults injects env into every worker.
func faults(env string) func(string, int64) []string {
	return func(string, int64) []string { return []string{env} }
}

func spawn(t *testing.T, h *Host) supervisor.Worker {
	t.Helper()
	w, _, err := h.Spawn(context.Background(), spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Kill(); <-w.Exited() })
	return w
}

func execute(t *testing.T, w supervisor.Worker, rung int, task string, seqs ...[]uint32) (*pb.Reply, error) {
	t.Helper()
	e := &pb.Execute{Task: task}
	for _, s := range seqs {
		e.Sequences = append(e.Sequences, &pb.Sequence{TokenIds: s})
	}
	payload, _ := proto.Marshal(e)
	raw, err := w.Exchange(context.Background(), rung, payload)
	if err != nil {
		return nil, err
	}
	reply := &pb.Reply{}
	if err := proto.Unmarshal(raw, reply); err != nil {
		t.Fatal(err)
	}
	return reply, nil
}

func TestAWorkerProcessAdmitsExecutesAndEvicts(t *testing.T) {
	w := spawn(t, newHost(t))
	a, err := w.Admit(context.Background(), 128)
	if err != nil {
		t.Fatal(err)
	}
	if a.CompiledLayers == nil || *a.CompiledLayers != 22 || *a.CacheHitLayers != 0 {
		t.Fatalf("a cold admission reported %v compiled, %v cached", a.CompiledLayers, a.CacheHitLayers)
	}
	reply, err := execute(t, w, 128, "embed", []uint32{101, 2023, 102}, []uint32{101, 7592, 102})
	if err != nil {
		t.Fatal(err)
	}
	if len(reply.Vectors) != 2 {
		t.Fatalf("%d vectors for 2 inputs", len(reply.Vectors))
	}
	for i, v := range reply.Vectors {
		want := worker.Embed(spec.Identity, spec.Dimensions, [][]uint32{{101, 2023, 102}, {101, 7592, 102}}[i])
		var norm float64
		for d := range v.Values {
			if v.Values[d] != want[d] {
				t.Fatalf("vector %d differs from the sim model's embedding at %d", i, d)
			}
			norm += float64(v.Values[d]) * float64(v.Values[d])
		}
		if len(v.Values) != 768 || math.Abs(norm-1) > 1e-4 {
			t.Fatalf("vector %d: %d dimensions, norm %v", i, len(v.Values), norm)
		}
	}
	// Too long for the rung: refused by the worker, which stays healthy.
	long := make([]uint32, 129)
	for i := range long {
		long[i] = 5
	}
	var we *supervisor.WorkerError
	if _, err := execute(t, w, 128, "embed", long); !errors.As(err, &we) || we.Code != "unsupported_shape" {
		t.Fatalf("an over-long sequence answered %v, want unsupported_shape", err)
	}
	inv, err := w.Inventory(context.Background())
	if err != nil || len(inv) != 1 || inv[0] != 128 {
		t.Fatalf("inventory %v, %v", inv, err)
	}
	if err := w.Evict(context.Background(), 128); err != nil {
		t.Fatal(err)
	}
	if inv, _ := w.Inventory(context.Background()); len(inv) != 0 {
		t.Fatalf("inventory after eviction %v", inv)
	}
	w.Close()
	<-w.Exited()
}

func TestARestartedWorkerReportsItsPredecessorsCompiledRungsAndLoadsThemFromCache(t *testing.T) {
	h := newHost(t)
	first := spawn(t, h)
	if _, err := first.Admit(context.Background(), 256); err != nil {
		t.Fatal(err)
	}
	first.Close()
	<-first.Exited()
	second, cached, err := h.Spawn(context.Background(), spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { second.Kill(); <-second.Exited() }()
	if len(cached) != 1 || cached[0] != 256 {
		t.Fatalf("LOADED reported %v cached, want [256]", cached)
	}
	a, err := second.Admit(context.Background(), 256)
	if err != nil {
		t.Fatal(err)
	}
	if *a.CacheHitLayers != 22 || *a.CompiledLayers != 0 {
		t.Fatalf("reported %d cached, %d compiled; want every layer from cache", *a.CacheHitLayers, *a.CompiledLayers)
	}
}

func TestAskingForTheAneBackendWhereItCannotRunIsAnErrorNeverTheStandIn(t *testing.T) {
	h := newHost(t, func(c *Config) { c.Backend = "ane" })
	_, _, err := h.Spawn(context.Background(), spec, 1)
	if err == nil || !strings.Contains(err.Error(), "requires macOS on Apple silicon") {
		t.Fatalf("got %v, want a refusal that names the platform", err)
	}
}

func TestACrashedWorkerIsAFaultAndItsExitIsConfirmed(t *testing.T) {
	w := spawn(t, newHost(t, func(c *Config) { c.Env = faults("SYNAPSE_WORKER_FAULTS=crash:admit:1") }))
	_, err := w.Admit(context.Background(), 128)
	var we *supervisor.WorkerError
	if err == nil || errors.As(err, &we) {
		t.Fatalf("got %v, want a fault", err)
	}
	<-w.Exited()
}

func TestAMalformedReplyIsAFault(t *testing.T) {
	w := spawn(t, newHost(t, func(c *Config) { c.Env = faults("SYNAPSE_WORKER_FAULTS=malformed:inventory:1") }))
	_, err := w.Inventory(context.Background())
	var we *supervisor.WorkerError
	if err == nil || errors.As(err, &we) || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("got %v, want a malformed-frame fault", err)
	}
}

func TestAHungCallIsBoundedAndItsWorkerKilled(t *testing.T) {
	// The bound is on a fake clock: a loaded machine starting the worker slowly is not a hang.
	clk := clocktesting.NewFakeClock(time.Now())
	w := spawn(t, newHost(t, func(c *Config) {
		c.Env = faults("SYNAPSE_WORKER_FAULTS=hang:evict:1")
		c.Clock = clk
		c.CallTimeout = 30 * time.Second
	}))
	if _, err := w.Admit(context.Background(), 128); err != nil {
		t.Fatal(err)
	}
	evicted := make(chan error, 1)
	go func() { evicted <- w.Evict(context.Background(), 128) }()
	// The earlier calls stopped their timers: the one waiter is the eviction's bound.
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return clk.HasWaiters(), nil }); err != nil {
		t.Fatal("the eviction never came to wait on its bound")
	}
	select {
	case err := <-evicted:
		t.Fatalf("the hung eviction returned before its bound: %v", err)
	default:
	}
	clk.Step(30 * time.Second)
	err := <-evicted
	if err == nil || !strings.Contains(err.Error(), "worker killed") {
		t.Fatalf("got %v, want a bounded call that killed the worker", err)
	}
	<-w.Exited()
}

func TestWorkersKeepTheLaneLockHeldAfterTheAgentLetsGo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ane-lane.lock")
	lock, err := lanelock.Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	w := spawn(t, newHost(t, func(c *Config) { c.Lock = lock.File() }))
	lock.Release() // the agent dies or lets go: the worker still holds the device
	if _, err := lanelock.Acquire(path); !errors.Is(err, lanelock.ErrHeld) {
		t.Fatalf("the lock was free while a worker could use the device: %v", err)
	}
	w.Close()
	<-w.Exited()
	again, err := lanelock.Acquire(path)
	if err != nil {
		t.Fatalf("the lock stayed held after every worker exited: %v", err)
	}
	again.Release()
}

func TestAWorkerWhoseBinaryIsNotTheOneTheNodeReportsIsRefused(t *testing.T) {
	h := newHost(t, func(c *Config) { c.BinaryDigest = "sha256:" + strings.Repeat("0", 64) })
	_, _, err := h.Spawn(context.Background(), spec, 1)
	if err == nil || !strings.Contains(err.Error(), "not the sha256:000") {
		t.Fatalf("spawn: %v, want a refusal naming both digests", err)
	}
}
