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

package hollow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

// spawner is the agent's worker host as a hollow Mac has it, its workers in process.
func spawner(clk *clocktesting.FakeClock, faults string) *workerhost.Host {
	return host(clk, workers(clk, faults))
}

// workers are a hollow Mac's workers, on a Neural Engine of their own.
func workers(clk *clocktesting.FakeClock, faults string) *Workers {
	return &Workers{Machine: simane.New(simane.Config{Clock: clk, Scale: 1}), SigningID: SigningID, BinaryDigest: "sha256:ab",
		Clock: clk, Faults: faults}
}

// host is the agent's worker host launching ws.
func host(clk *clocktesting.FakeClock, ws *Workers) *workerhost.Host {
	return workerhost.New(workerhost.Config{Backend: "sim", BinaryDigest: "sha256:ab", Log: logr.Discard(), Clock: clk,
		CallTimeout: time.Minute, AdmitTimeout: admitTimeout, Launch: ws.Launch})
}

var spec = supervisor.ModelSpec{Lane: "ns/lane", Identity: "gte", Model: "gte", Dimensions: 8, Layers: 3, Rungs: []int{128, 256}}

// admitTimeout is far past what stepUntil can reach (at most one simulated second per real
// millisecond for 10 s): the call's own timer is on the fake clock too, and a worker goroutine
// slow to reach its next timer on a loaded machine must fail the test by its real deadline,
// never by a simulated timeout the stepping raced to.
const admitTimeout = 1000 * time.Hour

// stepUntil steps the fake clock until done is closed, each time the worker waits on it: the
// simulated compiles take their seed-scale time on the fake clock and no longer in real time.
// The poll only lets the worker goroutine reach its next timer; nothing is timed by it.
func stepUntil(t *testing.T, clk *clocktesting.FakeClock, done <-chan struct{}) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		select {
		case <-done:
			return true, nil
		default:
		}
		if clk.HasWaiters() {
			clk.Step(time.Second)
		}
		return false, nil
	})
	if err != nil {
		t.Fatal("the hollow worker did not finish")
	}
}

// waitForWaiter returns once a goroutine waits on the fake clock.
func waitForWaiter(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true,
		func(context.Context) (bool, error) { return clk.HasWaiters(), nil }); err != nil {
		t.Fatal("nothing came to wait on the clock")
	}
}

// spawnOne starts generation 1 of spec's worker, faults injected, on a hollow Mac of its own.
func spawnOne(t *testing.T, faults string) (*clocktesting.FakeClock, supervisor.Worker) {
	t.Helper()
	clk := clocktesting.NewFakeClock(time.Now())
	w, _, err := spawner(clk, faults).Spawn(context.Background(), spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	return clk, w
}

// exitConfirmed fails the test unless w's exit is confirmed within a bound.
func exitConfirmed(t *testing.T, w supervisor.Worker, what string) {
	t.Helper()
	select {
	case <-w.Exited():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s's exit was never confirmed", what)
	}
}

func TestAHollowWorkerCompilesLayerByLayerAndReportsProgress(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	s := spawner(clk, "")
	w, cached, err := s.Spawn(context.Background(), spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(cached) != 0 {
		t.Fatalf("a fresh machine's aned holds %v", cached)
	}
	var adm supervisor.Admission
	done := make(chan struct{})
	go func() {
		defer close(done)
		adm, err = w.Admit(context.Background(), 128)
	}()
	start := clk.Now()
	stepUntil(t, clk, done)
	if err != nil {
		t.Fatal(err)
	}
	if adm.CompiledLayers == nil || *adm.CompiledLayers != 3 || *adm.CacheHitLayers != 0 {
		t.Errorf("admission %+v, want 3 layers compiled", adm)
	}
	if took := clk.Since(start); took < 3*simane.LayerCompileTime(128) {
		t.Errorf("3 layers compiled in %s of simulated time, want at least %s", took, 3*simane.LayerCompileTime(128))
	}
	if got, _ := w.Inventory(context.Background()); !slices.Equal(got, []int{128}) {
		t.Errorf("inventory %v", got)
	}
	payload, _ := proto.Marshal(&pb.Execute{Task: "embed", Sequences: []*pb.Sequence{{TokenIds: []uint32{1, 2, 3}}}})
	raw, err := w.Exchange(context.Background(), 128, payload)
	if err != nil {
		t.Fatal(err)
	}
	reply := &pb.Reply{}
	if err := proto.Unmarshal(raw, reply); err != nil || len(reply.Vectors) != 1 ||
		!slices.Equal(reply.Vectors[0].Values, worker.Embed("gte", 8, []uint32{1, 2, 3})) {
		t.Errorf("reply %v (%v), want the sim model's embedding", reply, err)
	}

	// A second generation on the same machine finds the rung in aned's cache.
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	<-w.Exited()
	w2, cached, err := s.Spawn(context.Background(), spec, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cached, []int{128}) {
		t.Errorf("the second generation sees %v cached, want [128]", cached)
	}
	_ = w2.Kill()
	<-w2.Exited()
}

func TestAHollowWorkerRefusesAndCrashesAsTheSimWorkerDoes(t *testing.T) {
	_, w := spawnOne(t, "crash:admit:2")
	// A refusal: the worker answered, its stream is healthy.
	_, err := w.Admit(context.Background(), 4096)
	var we *supervisor.WorkerError
	if !errors.As(err, &we) || we.Code != "unsupported_shape" {
		t.Fatalf("admitting a rung off the ladder: %v, want the worker's unsupported_shape", err)
	}
	// The injected crash: a fault, and the generation's exit is confirmed.
	_, err = w.Admit(context.Background(), 128)
	if err == nil || errors.As(err, &we) {
		t.Fatalf("the crashed admission answered %v, want a fault", err)
	}
	exitConfirmed(t, w, "the crashed generation")
}

func TestKillingAHollowWorkerEndsItsCompile(t *testing.T) {
	clk, w := spawnOne(t, "")
	done := make(chan error, 1)
	go func() { _, err := w.Admit(context.Background(), 256); done <- err }()
	waitForWaiter(t, clk) // the compile waits on the clock
	_ = w.Kill()
	if err := <-done; err == nil {
		t.Error("an admission whose worker was killed succeeded")
	}
	<-w.Exited()
}

func TestAHungHollowWorkerIsBoundedByTheHostsCallTimeoutAndItsExitConfirmed(t *testing.T) {
	clk, w := spawnOne(t, "hang:evict:1")
	done := make(chan error, 1)
	go func() { done <- w.Evict(context.Background(), 128) }()
	waitForWaiter(t, clk) // the host's bound on the call, on the fake clock: the hang waits on nothing
	clk.Step(time.Minute)
	err := <-done
	var we *supervisor.WorkerError
	if err == nil || errors.As(err, &we) || !strings.Contains(err.Error(), "no answer within 1m0s") {
		t.Fatalf("the hung eviction answered %v, want the host's timeout fault", err)
	}
	exitConfirmed(t, w, "the hung generation")
}

func TestAHollowWorkersStderrLinesReachTheHostsOnStderr(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	h := spawner(clk, "")
	var (
		mu    sync.Mutex
		lines []string
	)
	h.OnStderr(func(lane string, gen int64, line string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf("%s/%d: %s", lane, gen, line))
	})
	w, _, err := h.Spawn(context.Background(), spec, 7)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err = w.Admit(context.Background(), 128)
	}()
	stepUntil(t, clk, done)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	<-w.Exited() // confirmed once every line the worker wrote was read
	mu.Lock()
	defer mu.Unlock()
	want := "ns/lane/7: ane-direct shape admission: shape=128 layers_loaded=3 cache_hit=0 compiled=3 "
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, want) }) {
		t.Errorf("the host passed on %q, want a line starting %q", lines, want)
	}
}

// A hollow worker's programs are given back when its generation ends, however it ends, as the
// device frees a process's: an agent restarted in the same process re-adopts its lanes on the
// same Machine, and programs counted held for good made its loads fail ane_resources_exhausted.
func TestAHollowWorkerGivesBackItsProgramsWhenItExits(t *testing.T) {
	for _, c := range []struct {
		name, faults string
		end          func(supervisor.Worker, *Workers)
	}{
		{"closed by the agent", "", func(w supervisor.Worker, _ *Workers) { _ = w.Close() }},
		{"killed", "", func(w supervisor.Worker, _ *Workers) { _ = w.Kill() }},
		{"crashed", "crash:evict:1", func(w supervisor.Worker, _ *Workers) { _ = w.Evict(context.Background(), 256) }},
		// The agent exited without closing it (its shutdown's time ran out): its process's
		// exit ends it.
		{"left running by an agent that exited", "", func(_ supervisor.Worker, ws *Workers) { ws.ExitAll() }},
	} {
		t.Run(c.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Now())
			ws := workers(clk, c.faults)
			m, s := ws.Machine, host(clk, ws)
			for gen := int64(1); gen <= 2; gen++ {
				w, _, err := s.Spawn(context.Background(), spec, gen)
				if err != nil {
					t.Fatal(err)
				}
				done := make(chan struct{})
				go func() {
					defer close(done)
					_, err = w.Admit(context.Background(), 128)
				}()
				stepUntil(t, clk, done)
				if err != nil {
					t.Fatalf("generation %d: %v", gen, err)
				}
				if _, _, held := m.Stats(); held != spec.Layers {
					t.Fatalf("generation %d loaded rung 128; the machine holds %d programs, want %d", gen, held, spec.Layers)
				}
				c.end(w, ws)
				exitConfirmed(t, w, fmt.Sprintf("generation %d", gen))
				if _, _, held := m.Stats(); held != 0 {
					t.Fatalf("generation %d exited; the machine still holds %d programs", gen, held)
				}
			}
		})
	}
}
