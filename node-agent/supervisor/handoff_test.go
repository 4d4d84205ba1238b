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

// starvedHeadSetup leaves budget 44 full: a/128 resident and leased (returned), b/128 admitting
// for 10 s with its first request, and a/256 queued as a starved head behind them.
func starvedHeadSetup(t *testing.T) (h *harness, leaseA *Lease, first <-chan acquired, head <-chan acquired) {
	h = newHarness(t, 44)
	h.spawner.Configure = func(w *fakeworker.Worker) {
		if w.Lane == "b" {
			w.AdmitCost[128] = 10 * time.Second
		}
	}
	h.load("a")
	h.load("b")
	ra := h.acquire("a", 128)
	h.admitWaiting()
	a := h.got(ra)
	if a.err != nil {
		t.Fatal(a.err)
	}
	first = h.acquire("b", 128)
	h.admitWaiting()
	eventually(t, "b/128 is admitting", h.state(func(i residency.Inspection) bool { return i.Running != nil }))
	// The admission's 10 s run on the worker's clock: a test that steps the clock before it
	// started would step past nothing of it.
	wb := h.spawner.Get(t, "b", 1)
	eventually(t, "b/128's admission reached its worker", func() bool { return slices.Contains(wb.Calls(), "admit 128") })
	return h, a.lease, first, nil
}

func TestJoinedAdmissionHandsOffBeforeAStarvedHeadAndExcludesNewcomers(t *testing.T) {
	h, leaseA, first, _ := starvedHeadSetup(t)
	joiner := h.acquire("b", 128)
	eventually(t, "the joiner joined the running admission", h.state(func(i residency.Inspection) bool {
		return i.Running != nil && len(i.Running.Waiters) == 2
	}))
	head := h.acquire("a", 256)
	eventually(t, "a/256 is a starved head", h.state(func(i residency.Inspection) bool { return i.Starved }))

	h.step(10 * time.Second) // b/128's admission completes
	f, j := h.got(first), h.got(joiner)
	if f.err != nil || j.err != nil {
		t.Fatalf("cohort: %v, %v", f.err, j.err)
	}
	if !pending(head) {
		t.Fatal("the starved head was served before the cohort")
	}

	// A request arriving after completion cannot join the cohort: it yields to the head.
	newcomer := h.acquire("b", 128)
	eventually(t, "the newcomer is blocked behind the head", h.state(func(i residency.Inspection) bool { return i.Blocked == 1 }))
	if !pending(newcomer) {
		t.Fatal("a newcomer leased ahead of the starved head")
	}

	// Once the cohort is done the head evicts b/128. The newcomer's request is then an
	// ordinary admission: a cached reload, cheaper than the head's compile, so it starts first
	// by start key; the head follows once the budget frees again.
	f.lease.Release()
	j.lease.Release()
	eventually(t, "b/128 was evicted for the head", func() bool {
		return slices.Contains(h.spawner.Get(t, "b", 1).Calls(), "evict 128")
	})
	h.spawner.Get(t, "b", 1).SetAdmitCost(128, 0)
	eventually(t, "the newcomer's admission is queued", h.state(func(i residency.Inspection) bool {
		return slices.ContainsFunc(i.Queued, func(j residency.JobInfo) bool { return j.Owner == "b" && j.Rung == 128 })
	}))
	h.step(50 * time.Millisecond)
	n := h.got(newcomer)
	if n.err != nil {
		t.Fatal(n.err)
	}
	n.lease.Release()
	hd := h.got(head)
	if hd.err != nil {
		t.Fatal(hd.err)
	}
	hd.lease.Release()
	leaseA.Release()
}

func TestSuspendedJoinerHandoffExpiresWithoutAnExternalWakeup(t *testing.T) {
	h, leaseA, first, _ := starvedHeadSetup(t)
	defer leaseA.Release()

	// A joiner that will never come back for its lease: its answer sits unread.
	ticket := residency.Ticket(h.s.tickets.Add(1))
	suspended := &request{ticket: ticket, lane: "b", reply: make(chan residency.Answer, 1)}
	h.s.in <- input{in: residency.Acquire{Ticket: ticket, Lane: "b", Rung: 128, Since: h.clk.Now()}, req: suspended}
	eventually(t, "the suspended joiner joined", h.state(func(i residency.Inspection) bool { return i.Running != nil && len(i.Running.Waiters) == 2 }))
	head := h.acquire("a", 256)
	eventually(t, "a/256 is a starved head", h.state(func(i residency.Inspection) bool { return i.Starved }))

	h.step(10 * time.Second)
	completed := h.clk.Now()
	f := h.got(first)
	if f.err != nil {
		t.Fatal(f.err)
	}
	f.lease.Release()
	if g := <-suspended.reply; !g.Handoff {
		t.Fatalf("the suspended joiner was answered %+v, want a handoff", g)
	}
	// The cohort still protects b/128 for the suspended member.
	eventually(t, "the release was seen", h.state(func(i residency.Inspection) bool { sh, _ := i.Shape("b", 128); return sh.Leases == 0 }))
	if !h.state(func(i residency.Inspection) bool {
		sh, ok := i.Shape("b", 128)
		return ok && sh.State == "resident" && sh.Cohort
	})() {
		t.Fatal("b/128 lost its handoff protection before the window closed")
	}
	if !pending(head) {
		t.Fatal("the head was served while the cohort protected the shape")
	}

	// Only the clock moves: the window's expiry itself wakes the budget queue.
	h.clk.Step(completed.Add(HandoffWindow).Sub(h.clk.Now()))
	hd := h.got(head)
	if hd.err != nil {
		t.Fatal(hd.err)
	}
	hd.lease.Release()
	if at := h.spawner.Get(t, "b", 1).EvictedAt(128); at.Before(completed.Add(HandoffWindow)) {
		t.Fatalf("b/128 evicted at %v, inside the handoff window", at.Sub(completed))
	}
}
