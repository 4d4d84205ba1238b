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

package residency

import (
	"testing"
	"time"
)

// TestEvictionPrefersAShapeWithNoQueuedDemand: between two idle, non-smallest candidates, the
// one a request is waiting for stays, even when it is the least recently used.
func TestEvictionPrefersAShapeWithNoQueuedDemand(t *testing.T) {
	d := newDriver(t, 66)
	d.load(spec("a"))
	d.load(spec("b"))
	d.load(spec("c"))
	la := d.lease("a", 256)
	lb := d.lease("b", 256)
	lc := d.lease("c", 128)
	// c/256's admission finds every shape leased: a starved head.
	d.acquire("c", 256, time.Time{})
	d.advance(50 * time.Millisecond)
	if !d.c.Inspect().Starved {
		t.Fatal("the head is not starved")
	}
	// A request for the resident a/256 waits behind it: queued demand for a/256.
	wanted := d.acquire("a", 256, time.Time{})
	if d.c.Inspect().Blocked != 1 {
		t.Fatal("the request for a/256 is not blocked behind the head")
	}
	// Both leases go in the same moment; a/256 is as old as b/256 and first by name, so the
	// least-recently-used order alone would evict it.
	la.Release()
	lb.Release()
	d.step(Tick{})
	ev := take(d, "an eviction", func(Evict) bool { return true })
	if ev.Gen.Lane != "b" || ev.Rung != 256 {
		t.Fatalf("evicted %s/%d, want b/256: a/256 has a request waiting for it", ev.Gen.Lane, ev.Rung)
	}
	if a := d.answer(wanted); a.Cell == nil || a.Cell.Lane != "a" {
		t.Fatalf("the request for a/256 got %+v, want its lease", a)
	}
	d.release(lc, nil)
}

// TestPrewarmRunsOnlyWhileTheLaneIsQuiet: a lane's prewarm admission waits while a shape of
// the lane is leased, while a request is on its way from a handoff to its lease, and while its
// worker's stream is busy.
func TestPrewarmRunsOnlyWhileTheLaneIsQuiet(t *testing.T) {
	t.Run("a shape of the lane is leased", func(t *testing.T) {
		d := newDriver(t, 100)
		d.load(spec("a"))
		held := d.lease("a", 128)
		d.step(Prewarm{Lane: "a", Rungs: []int{256}})
		none(d, "a prewarm admission while a/128 is leased", func(Admit) bool { return true })
		d.release(held, nil)
		d.admit("a", 256)
	})

	t.Run("a request is on its way from a handoff to its lease", func(t *testing.T) {
		d := newDriver(t, 100)
		a := d.load(spec("a"))
		tk := d.acquire("a", 128, time.Time{})
		d.advance(50 * time.Millisecond)
		adm := d.admit("a", 128)
		d.step(Prewarm{Lane: "a", Rungs: []int{256}})
		d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Admission: counts(), Took: time.Second})
		if !d.answer(tk).Handoff {
			t.Fatal("no handoff")
		}
		none(d, "a prewarm admission while the handed-off request has not leased", func(Admit) bool { return true })
		d.step(Acquire{Ticket: tk, Lane: "a", Rung: 128, Member: true})
		lease := d.answer(tk).Cell
		d.release(lease, nil)
		d.admit("a", 256)
	})

	t.Run("its worker's stream is busy", func(t *testing.T) {
		d := newDriver(t, 100)
		a := d.load(spec("a"))
		d.release(d.lease("a", 128), nil)
		a.Enter() // an exchange holds or waits for the stream
		d.step(Prewarm{Lane: "a", Rungs: []int{256}})
		none(d, "a prewarm admission while the stream is busy", func(Admit) bool { return true })
		a.Exit()
		d.step(Tick{})
		d.admit("a", 256)
	})
}

// TestTheLastLeaseOfALaneWhosePrewarmWaitsWakesTheOwner: a prewarm that waits for its lane to
// be quiet is started by the release that makes it quiet, with no other event to step the core.
func TestTheLastLeaseOfALaneWhosePrewarmWaitsWakesTheOwner(t *testing.T) {
	d := newDriver(t, 100)
	d.load(spec("a"))
	held := d.lease("a", 128)
	d.step(Prewarm{Lane: "a", Rungs: []int{256}})
	none(d, "a prewarm admission while a/128 is leased", func(Admit) bool { return true })
	if !held.Release() {
		t.Fatal("the release that made the lane quiet did not ask to wake the owner: the prewarm would wait for an unrelated event")
	}
	d.step(Tick{}) // what the woken owner does
	d.admit("a", 256)
}

// TestOnlyTheHeadsLaneYieldsWhenItLacksOnlyAShapeSlot: a head that lacks a shape slot of its
// own model waits for that model's leases; other lanes' resident traffic does not yield to it.
func TestOnlyTheHeadsLaneYieldsWhenItLacksOnlyAShapeSlot(t *testing.T) {
	d := newDriver(t, 100)
	one := spec("a")
	one.MaxResidentShapes = 1
	d.load(one)
	d.load(spec("b"))
	d.release(d.lease("b", 128), nil)
	heldA := d.lease("a", 128)
	d.acquire("a", 256, time.Time{}) // needs a/128's slot, which is leased
	d.advance(50 * time.Millisecond)
	if i := d.c.Inspect(); !i.Starved || i.StarvedLane != "a" {
		t.Fatalf("starved %v for %q, want only lane a to yield", i.Starved, i.StarvedLane)
	}
	if c, _ := d.c.Ready().View.TryLease("b", 128); c == nil {
		t.Fatal("b's resident shape was not leased on the fast path: b yields to a head it cannot help")
	} else {
		c.Release()
	}
	if c, _ := d.c.Ready().View.TryLease("a", 128); c != nil {
		t.Fatal("a's own resident traffic did not yield to its starved head")
	}
	d.release(heldA, nil)
	ev := take(d, "the eviction of a/128", func(e Evict) bool { return e.Gen.Lane == "a" })
	d.step(Evicted{Gen: ev.Gen, Load: ev.Load, Attempt: ev.Attempt})
	d.advance(time.Millisecond)
	d.admit("a", 256)
}

// TestResidentTrafficDoesNotYieldToAHeadNoReleaseCouldServe: when the budget a head lacks is
// held by a worker whose exit is not confirmed, releasing leases cannot help it, and resident
// traffic goes on.
func TestResidentTrafficDoesNotYieldToAHeadNoReleaseCouldServe(t *testing.T) {
	d := newDriver(t, 88)
	x := d.load(spec("x"))
	for _, r := range []int{128, 256, 512} {
		d.release(d.lease("x", r), nil)
	}
	d.load(spec("b"))
	held := d.lease("b", 128)
	// x's worker faults; its exit stays unconfirmed: its 66 executables stay charged.
	lx := d.lease("x", 128)
	d.release(lx, errBrokenPipe)
	take(d, "ConfirmExit x", func(c ConfirmExit) bool { return c.Gen == x })
	wide := spec("c")
	wide.Layers = 44
	d.load(wide)
	d.acquire("c", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	if d.c.Inspect().Starved {
		t.Fatal("resident traffic yields to a head that no release could make room for")
	}
	if c, _ := d.c.Ready().View.TryLease("b", 128); c == nil {
		t.Fatal("b's resident shape is not leased on the fast path")
	} else {
		c.Release()
	}
	d.release(held, nil)
}
