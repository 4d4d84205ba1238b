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
	"slices"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// resident makes rung of lane resident through one request and returns its lease.
func (h *harness) resident(lane string, rung int) *Lease {
	h.t.Helper()
	r := h.acquire(lane, rung)
	h.admitWaiting()
	a := h.got(r)
	if a.err != nil {
		h.t.Fatal(a.err)
	}
	return a.lease
}

func TestEvictionPrefersAnIdleStreamAndEvictsBeforeTheLongCompileEnds(t *testing.T) {
	h := newHarness(t, 66)
	h.spawner.Configure = func(w *fakeworker.Worker) {
		if w.Lane == "a" {
			w.AdmitCost[1024] = 300 * time.Second
		}
	}
	h.load("a")
	h.load("b")
	h.load("c")
	// a/128 is the least recently used; by LRU alone it would go first.
	h.resident("a", 128).Release()
	h.clk.Step(time.Second)
	h.resident("c", 128).Release()

	// A long compile on a keeps a's stream busy and fills the budget.
	long := h.acquire("a", 1024)
	h.admitWaiting()
	eventually(t, "a/1024 is compiling", h.state(func(i residency.Inspection) bool { return i.Running != nil }))
	compileEnds := h.clk.Now().Add(300 * time.Second)

	// The next head needs 22 executables: the idle stream's shape goes, right away.
	head := h.acquire("b", 128)
	eventually(t, "c/128 was evicted", func() bool { return slices.Contains(h.spawner.Get(t, "c", 1).Calls(), "evict 128") })
	if calls := h.spawner.Get(t, "a", 1).Calls(); slices.Contains(calls, "evict 128") {
		t.Fatalf("a's shape was evicted from its busy stream: %v", calls)
	}
	if at := h.spawner.Get(t, "c", 1).EvictedAt(128); !at.Before(compileEnds) {
		t.Fatalf("the eviction was acknowledged at %v, not before the long compile ends at %v", at, compileEnds)
	}
	eventually(t, "the eviction was refunded while the compile runs", h.state(func(i residency.Inspection) bool {
		return i.Used == 44 && i.Running != nil
	}))

	// The head's admission starts as soon as the gate frees.
	h.clk.Step(300 * time.Second)
	if l := h.got(long); l.err != nil {
		t.Fatal(l.err)
	} else {
		l.lease.Release()
	}
	if hd := h.got(head); hd.err != nil {
		t.Fatal(hd.err)
	} else {
		hd.lease.Release()
	}
}

func TestEvictionUsesABusyStreamWhenItIsTheOnlyOption(t *testing.T) {
	h := newHarness(t, 44)
	gate := make(chan struct{})
	h.load("a")
	h.load("b")
	h.resident("a", 256).Release()
	inFlight := h.resident("a", 128)

	// An exchange on a/128 holds a's stream.
	a := h.spawner.Get(t, "a", 1)
	a.Lock()
	a.ExchangeGate = gate
	a.Unlock()
	replied := make(chan error, 1)
	go func() {
		_, err := inFlight.Exchange(context.Background(), []byte("q"))
		replied <- err
	}()
	eventually(t, "the exchange holds a's stream", func() bool { return a.Exchanging() == 1 })

	// b needs 22: a/128 is leased, so a/256 on the busy stream is the only candidate.
	head := h.acquire("b", 128)
	h.admitWaiting()
	eventually(t, "a/256 is being evicted", h.state(func(i residency.Inspection) bool { sh, _ := i.Shape("a", 256); return sh.State == "evicting" }))

	// The release waits for the stream; nothing is refunded early and the head waits.
	if got := h.s.Used(); got != 44 {
		t.Fatalf("charged %d while the eviction waits for the stream, want 44", got)
	}
	if !pending(head) || slices.Contains(a.Calls(), "evict 256") {
		t.Fatal("the eviction overtook the exchange holding the stream")
	}

	close(gate)
	if err := <-replied; err != nil {
		t.Fatal(err)
	}
	inFlight.Release()
	hd := h.got(head)
	if hd.err != nil {
		t.Fatal(hd.err)
	}
	hd.lease.Release()
	calls := a.Calls()
	if i, j := slices.Index(calls, "exchange 128"), slices.Index(calls, "evict 256"); i < 0 || j < i {
		t.Fatalf("a's calls %v, want the exchange's reply before the eviction", calls)
	}
	if slices.Contains(calls, "evict 128") {
		t.Fatal("the leased shape was evicted")
	}
}

func TestALeasedShapeIsNeverEvicted(t *testing.T) {
	h := newHarness(t, 22)
	h.load("a")
	h.load("b")
	l := h.resident("a", 128)
	head := h.acquire("b", 128)
	h.admitWaiting()
	eventually(t, "b/128 is a starved head", h.state(func(i residency.Inspection) bool { return i.Starved }))
	if slices.Contains(h.spawner.Get(t, "a", 1).Calls(), "evict 128") || !pending(head) {
		t.Fatal("a leased shape was evicted")
	}
	l.Release()
	if hd := h.got(head); hd.err != nil {
		t.Fatal(hd.err)
	} else {
		hd.lease.Release()
	}
}

func TestAModelAtItsShapeLimitEvictsOneOfItsOwnShapes(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a", func(s *ModelSpec) { s.MaxResidentShapes = 2 })
	h.load("b")
	h.resident("b", 128).Release()
	h.clk.Step(time.Second)
	h.resident("a", 128).Release()
	h.resident("a", 256).Release()

	// Budget is free, but a holds its two slots: its third rung evicts one of its own shapes,
	// never b's (older) one.
	third := h.acquire("a", 512)
	h.admitWaiting()
	if l := h.got(third); l.err != nil {
		t.Fatal(l.err)
	} else {
		l.lease.Release()
	}
	if slices.Contains(h.spawner.Get(t, "b", 1).Calls(), "evict 128") {
		t.Fatal("another model's shape was evicted for a model at its shape limit")
	}
	// a/128 is its smallest rung, so the non-smallest a/256 goes.
	if calls := h.spawner.Get(t, "a", 1).Calls(); !slices.Contains(calls, "evict 256") {
		t.Fatalf("a's calls %v, want a/256 evicted", calls)
	}
}
