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
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onsi/gomega"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func tokens(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(1000 + i)
	}
	return out
}

func newFake(t *testing.T) (*Server, *fakeAcquirer) {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	a := &fakeAcquirer{clk: clk}
	s := New(a, clk)
	s.AddLane(Lane{Name: "gte", Task: "embed", Rungs: []int{128, 256, 512}, Ceiling: 512, Dimensions: 8, MaxInflight: 1})
	return s, a
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	gomega.NewWithT(t).Eventually(cond).WithTimeout(10*time.Second).WithPolling(time.Millisecond).
		Should(gomega.BeTrue(), "waiting until %s", what)
}

func TestComposedSequencesUseTheSmallestBucketThatFitsAndKeepInputOrder(t *testing.T) {
	s, a := newFake(t)
	inputs := [][]uint32{tokens(300), tokens(5), tokens(128), tokens(129), tokens(512)}
	res, err := s.Run(context.Background(), "gte", "embed", inputs, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Buckets, []int{128, 256, 512}) {
		t.Fatalf("buckets %v", res.Buckets)
	}
	for i, in := range inputs {
		if !slices.Equal(res.Vectors[i], worker.Embed("gte", 8, in)) {
			t.Fatalf("output %d is not input %d's embedding", i, i)
		}
	}
	if a.maxHeld != 1 {
		t.Fatalf("%d leases were held at once, want one at a time", a.maxHeld)
	}
}

func TestPackedCancelledMixedCallDrainsWithOneLeaseAtATime(t *testing.T) {
	s, a := newFake(t)
	a.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Run(ctx, "gte", "embed", [][]uint32{tokens(500), tokens(10), tokens(200)}, time.Time{})
		errc <- err
	}()
	eventually(t, "the first bucket's exchange runs", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.exchanges == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller got %v", err)
	}
	// The caller is gone; the task still owns the lease until the reply drains.
	if s.Inflight("gte") != 1 || a.held != 1 {
		t.Fatalf("after the cancel: inflight %d, %s", s.Inflight("gte"), a.snapshot())
	}
	close(a.gate)
	eventually(t, "the task let go", func() bool { return s.Inflight("gte") == 0 })
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.maxHeld != 1 || a.released != 1 || !slices.Equal(a.acquired, []int{128}) || a.exchanges != 1 {
		t.Fatalf("%s: want one lease, drained and released, and no later bucket", a.snapshotLocked())
	}
}

func TestServingCallerCancellationDrainsReplyWithoutRestart(t *testing.T) {
	s, a := newFake(t)
	a.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx, "gte", "embed", [][]uint32{tokens(10)}, time.Time{})
	eventually(t, "the exchange runs", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.exchanges == 1 })
	cancel()
	a.mu.Lock()
	exCtx := a.exchangeCtxs[0]
	a.mu.Unlock()
	if exCtx.Err() != nil {
		t.Fatal("the caller's cancellation reached the exchange: a healthy worker would be restarted")
	}
	close(a.gate)
	eventually(t, "the task let go", func() bool { return s.Inflight("gte") == 0 })
	if len(a.faults) != 0 {
		t.Fatalf("faults %v after a cancellation", a.faults)
	}
}

func TestCancelledDirectAneKeepsModulePermitAndInflightUntilReplyDrains(t *testing.T) {
	s, a := newFake(t) // one execution permit
	a.gate = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	go s.Run(ctx, "gte", "embed", [][]uint32{tokens(10)}, time.Time{})
	eventually(t, "the exchange runs", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.exchanges == 1 })
	cancel()

	// A second call cannot get the permit while the cancelled one's reply is outstanding.
	second, cancelSecond := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := s.Run(second, "gte", "embed", [][]uint32{tokens(10)}, time.Time{})
		errc <- err
	}()
	if s.Inflight("gte") != 1 {
		t.Fatalf("inflight %d, want the cancelled call still counted", s.Inflight("gte"))
	}
	select {
	case err := <-errc:
		t.Fatalf("the second call ran (%v) while the permit was owned", err)
	default:
	}
	close(a.gate)
	if err := <-errc; err != nil {
		t.Fatalf("the second call, once the permit was free: %v", err)
	}
	cancelSecond()
}

func TestDirectAneWarmReplyAfterAbsoluteDeadlineIsDiscarded(t *testing.T) {
	l := newLive(t, 100)
	l.lane("a")
	if o := l.settle(l.call("a", 10, time.Time{}), time.Second); o.err != nil {
		t.Fatal(o.err)
	}
	w := l.sp.Get(t, "a", 1)
	w.Lock()
	w.ExchangeCost = 2 * time.Second // the reply comes after the deadline
	w.Unlock()
	c := l.call("a", 10, l.clk.Now().Add(time.Second))
	eventually(t, "the exchange runs", func() bool { return w.Exchanging() == 1 && l.clk.HasWaiters() })
	l.clk.Step(2 * time.Second)
	o := waitAnswer(t, c)
	if refusal.CodeOf(o.err) != refusal.DeadlineExceeded || !strings.Contains(o.err.Error(), "discarded") {
		t.Fatalf("got %v, want the late reply discarded", o.err)
	}
	// The lease was released after the reply drained, and the healthy worker was not faulted.
	eventually(t, "the call let go", func() bool { return l.srv.Inflight("a") == 0 })
	if n := l.sp.Spawned("a"); n != 1 || !slices.Contains(w.Calls(), "exchange 128") {
		t.Fatalf("%d workers spawned, calls %v: want the exchange drained on the one worker", n, w.Calls())
	}
	if o := l.settle(l.call("a", 10, time.Time{}), 3*time.Second); o.err != nil {
		t.Fatalf("the shape is not leased free again: %v", o.err)
	}
}

func TestDirectAneColdAdmissionAfterAbsoluteDeadlineIsDrainedWithoutInference(t *testing.T) {
	l := newLive(t, 100)
	l.sp.ReportCached([]int{128}) // predicted a quick load from aned's cache...
	l.sp.Configure = func(w *fakeworker.Worker) {
		w.Reply = embedReply(w.Lane)
		w.AdmitCost[128] = 5 * time.Second // ...which the device has to compile after all
	}
	l.lane("a")
	c := l.call("a", 10, l.clk.Now().Add(time.Second))
	eventually(t, "the admission is queued", func() bool { return l.sup.Node().QueueLength == 1 })
	l.step(50 * time.Millisecond)
	w := l.sp.Get(t, "a", 1)
	eventually(t, "the admission runs", func() bool { return slices.Equal(w.Calls(), []string{"admit 128"}) })
	l.clk.Step(time.Second)
	if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.DeadlineExceeded {
		t.Fatalf("got %v, want deadline_exceeded", o.err)
	}
	// The admission is not abandoned: it finishes, and its shape stays resident for the next
	// request; but no inference runs for the call that gave up, and no later bucket starts.
	l.clk.Step(5 * time.Second)
	eventually(t, "the admission finished", func() bool {
		snap, _ := l.sup.Snapshot("a")
		return slices.Equal(snap.Resident, []int{128})
	})
	if calls := w.Calls(); !slices.Equal(calls, []string{"admit 128"}) {
		t.Fatalf("worker calls %v: want the admission drained and nothing run", calls)
	}
	if l.srv.Inflight("a") != 0 {
		t.Fatal("the call still holds something")
	}
}

func TestAMalformedReplyIsAFaultThatRecoversTheWorker(t *testing.T) {
	s, a := newFake(t)
	a.reply = func(*pb.Execute) *pb.Reply { return &pb.Reply{} } // no vectors
	_, err := s.Run(context.Background(), "gte", "embed", [][]uint32{tokens(10)}, time.Time{})
	if refusal.CodeOf(err) != refusal.EngineCrashed || len(a.faults) != 1 {
		t.Fatalf("got %v with faults %v, want engine_crashed and the lease faulted", err, a.faults)
	}
}

func TestCatalogSemanticRefusalsMatchGoldenAndNeverFetch(t *testing.T) {
	s, a := newFake(t)
	s.AddLane(Lane{Name: "bge-rerank", Task: "rerank", Rungs: []int{256}, Ceiling: 200, Dimensions: 8})
	cases := []struct {
		name, lane, task string
		inputs           [][]uint32
	}{
		{"unknown lane", "nope", "embed", [][]uint32{tokens(1)}},
		{"wrong task", "gte", "rerank", [][]uint32{tokens(1)}},
		{"no input", "gte", "embed", nil},
		{"an empty input", "gte", "embed", [][]uint32{tokens(3), {}}},
		{"over the ceiling", "bge-rerank", "rerank", [][]uint32{tokens(201)}},
		{"longer than the ceiling and the largest rung", "gte", "embed", [][]uint32{tokens(10), tokens(513)}},
	}
	var got strings.Builder
	for _, c := range cases {
		_, err := s.Run(context.Background(), c.lane, c.task, c.inputs, time.Time{})
		fmt.Fprintf(&got, "%s: %s: %v\n", c.name, refusal.CodeOf(err), err)
	}
	golden := filepath.Join("testdata", "catalog_refusals.golden")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, []byte(got.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if got.String() != string(want) {
		t.Fatalf("refusals differ from %s:\n%s", golden, got.String())
	}
	if len(a.acquired) != 0 {
		t.Fatalf("a refused call leased shapes %v", a.acquired)
	}
}

// TestServingIoFaultRecoversAndRetireRefundsOnlyAfterExit: an I/O fault in a call's exchange
// recovers the worker (the call fails, the replacement serves); retiring the lane then drains
// the call in flight, closes the worker and keeps its budget charged until its exit is
// confirmed, after the close as before it.
func TestServingIoFaultRecoversAndRetireRefundsOnlyAfterExit(t *testing.T) {
	l := newLive(t, 100)
	exit := make(chan struct{})
	l.sp.Configure = func(w *fakeworker.Worker) {
		w.Reply = embedReply(w.Lane)
		if w.Gen == 2 {
			w.ExitGate = exit
		}
	}
	l.lane("a")
	if o := l.settle(l.call("a", 10, time.Time{}), time.Second); o.err != nil {
		t.Fatal(o.err)
	}
	w1 := l.sp.Get(t, "a", 1)
	w1.Lock()
	w1.NextExchangeErr = fakeworker.ErrBrokenPipe
	w1.Unlock()
	if o := l.settle(l.call("a", 10, time.Time{}), time.Second); refusal.CodeOf(o.err) != refusal.EngineCrashed {
		t.Fatalf("got %v, want engine_crashed from the I/O fault", o.err)
	}
	if o := l.settle(l.call("a", 10, time.Time{}), 2*time.Second); o.err != nil || o.res.Generations[0] != 2 {
		t.Fatalf("after the fault: %+v, want the replacement to serve", o)
	}

	w2 := l.sp.Get(t, "a", 2)
	gate := make(chan struct{})
	w2.Lock()
	w2.ExchangeGate = gate
	w2.Unlock()
	held := l.call("a", 10, time.Time{})
	eventually(t, "the call's exchange is in flight", func() bool { return w2.Exchanging() == 1 })
	retired := make(chan error, 1)
	go func() { retired <- l.sup.Retire(context.Background(), "a") }()
	eventually(t, "the retirement began", func() bool { snap, _ := l.sup.Snapshot("a"); return snap.Retiring })
	if used := l.sup.Used(); used != 22 {
		t.Fatalf("charged %d while the retirement drains a call, want 22", used)
	}
	close(gate)
	if o := waitAnswer(t, held); o.err != nil {
		t.Fatalf("the call in flight was cut short: %v", o.err)
	}
	eventually(t, "the drained worker was closed", func() bool { return slices.Contains(w2.Calls(), "close") })
	if used := l.sup.Used(); used != 22 {
		t.Fatalf("charged %d after the close but before the exit is confirmed, want 22", used)
	}
	select {
	case err := <-retired:
		t.Fatalf("the retirement ended (%v) before the worker's exit was confirmed", err)
	default:
	}
	close(exit)
	if err := <-retired; err != nil {
		t.Fatal(err)
	}
	if used := l.sup.Used(); used != 0 {
		t.Fatalf("charged %d after the confirmed exit, want 0", used)
	}
}
