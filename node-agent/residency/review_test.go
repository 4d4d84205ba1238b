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

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// Regression tests from the adversarial review of the promises change: interleavings that
// broke a rule it claimed to keep. Each failed before its fix.

// TestARepeatedEvictionRefusalNeverSettlesALaterEvictionOfTheSameLoad: an eviction names the
// shape's load, not the attempt. A worker's refusal of a first eviction, delivered again while
// a second eviction of the same load is on the wire, is taken for the second's outcome: the
// shape is reopened as resident, and the second's acknowledgement is then ignored, so the core
// keeps charging and leasing a shape the worker has released.
func TestARepeatedEvictionRefusalNeverSettlesALaterEvictionOfTheSameLoad(t *testing.T) {
	d := newDriver(t, 44)
	a := d.load(spec("a"))
	d.load(spec("b"))
	d.release(d.lease("a", 128), nil)
	d.release(d.lease("a", 256), nil)
	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	first := take(d, "the first eviction", func(e Evict) bool { return e.Gen == a })
	refused := Evicted{Gen: a, Load: first.Load, Attempt: first.Attempt, Err: &WorkerError{Code: "busy", Message: "the shape is in use"}}
	d.step(refused)
	second := take(d, "the second eviction", func(e Evict) bool { return e.Gen == a })
	if second.Load != first.Load {
		t.Skipf("the second eviction is of another load (%d, first %d)", second.Load, first.Load)
	}
	// Nothing needs the room any more: b retires, its queued admission is dropped.
	d.step(Retire{Lane: "b"})
	d.step(refused) // the first eviction's refusal, delivered again
	d.step(Evicted{Gen: a, Load: second.Load, Attempt: second.Attempt})
	if sh, ok := d.c.Inspect().Shape("a", second.Rung); ok {
		t.Fatalf("the worker acknowledged the release of a/%d, but the core keeps it %s (used %d): a repeated refusal of the first eviction settled the second",
			second.Rung, sh.State, d.c.Used())
	}
}

// TestALateReportOfAFirstAttemptNeverFreesTheGateItsRetryHolds: once the worker's exit is
// confirmed while a retried admission's call is still out, the retry keeps the compile gate
// until that call returns. The outstanding hold is matched by job only, so the first
// attempt's resource refusal, delivered again, frees the gate the retry holds.
func TestALateReportOfAFirstAttemptNeverFreesTheGateItsRetryHolds(t *testing.T) {
	d := newDriver(t, 66)
	a := d.load(spec("a"))
	b := d.load(spec("b"))
	d.release(d.lease("a", 128), nil)
	held := d.lease("b", 256)
	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	first := d.admit("b", 128)
	refused := Admitted{Gen: b, Job: first.Job, Load: first.Load, Err: &WorkerError{Code: string(refusal.ResourcesExhausted), Message: "0x20004"}}
	d.step(refused)
	ev := take(d, "the eviction for the retry", func(e Evict) bool { return e.Gen == a })
	d.step(Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt})
	d.advance(time.Millisecond)
	retry := d.admit("b", 128)
	if retry.Load == first.Load {
		t.Fatal("the retry has the first attempt's load")
	}
	d.release(held, errBrokenPipe) // b's stream breaks while the retry is on the wire
	take(d, "ConfirmExit b", func(c ConfirmExit) bool { return c.Gen == b })
	d.step(Exited{Gen: b})
	if i := d.c.Inspect(); i.Running == nil || !i.Held {
		t.Fatalf("the retry's call is still out after b's exit, but the gate is %+v (held %v)", i.Running, i.Held)
	}
	d.step(refused) // the first attempt's refusal, delivered again
	if i := d.c.Inspect(); i.Running == nil || !i.Held {
		t.Fatalf("a repeated report of the first attempt freed the gate the retry's outstanding call holds: %s", i)
	}
}

// TestAHeadDroppedByStartOrResolveLetsTheNextJobStart: a request for a shape being evicted
// queues a job for it; the worker refuses the release, so the shape is resident again. When
// that job reaches the gate, startOrResolve drops it (its waiters lease), and the pass ends
// without electing the next job, though the gate is free and it fits: nothing steps the core
// again until an unrelated event.
func TestAHeadDroppedByStartOrResolveLetsTheNextJobStart(t *testing.T) {
	d := newDriver(t, 66)
	a := d.load(spec("a"), 128) // aned holds a/128: its admission is predicted a short load
	b := d.load(spec("b"))
	d.load(spec("c"))
	d.release(d.lease("a", 128), nil)
	d.lease("a", 256) // held
	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	bAdm := d.admit("b", 128) // the gate is busy; 66 of 66 charged
	d.acquire("c", 128, time.Time{})
	d.advance(50 * time.Millisecond) // c/128 is the head: a/128 is evicted for it
	ev := take(d, "the eviction of a/128 for c", func(e Evict) bool { return e.Gen == a && e.Rung == 128 })
	ta := d.acquire("a", 128, time.Time{}) // a/128 is being evicted: a (cheap) job is queued for it
	d.advance(50 * time.Millisecond)
	if j := d.c.queue.Head(); j == nil || j.Owner != "a" {
		t.Skipf("a/128's job is not the head: %s", d.c.Inspect())
	}
	// b's admission is refused by the worker: the gate and 22 executables free.
	d.step(Admitted{Gen: b, Job: bAdm.Job, Load: bAdm.Load, Err: &WorkerError{Code: "bad_shape", Message: "no"}})
	// The worker refuses to release a/128: it stays resident, and a/128's job is dropped at
	// the gate, its request leasing the resident shape.
	d.step(Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt, Err: &WorkerError{Code: "busy", Message: "in use"}})
	if a := d.answer(ta); a.Cell == nil {
		t.Fatalf("a/128's request got %+v, want a lease of the resident shape", a)
	}
	// The owner steps the core again at once when it asks to be: then c/128 must start.
	if next := d.c.Ready().Next; !next.IsZero() && !next.After(d.now) {
		d.step(Tick{})
	}
	take(d, "c/128's admission, with the gate free and room for it", func(adm Admit) bool { return adm.Gen.Lane == "c" })
}

// TestANewJobNeverPassesAnEarlierKeyBehindARecycledHead: insert places a new job before the
// first queued job with a later start key, as if the queue were sorted. A recycled job put
// back at the head (its worker asked to be replaced) has an early arrival and a wide cost, so
// a later, cheap compile lands ahead of it, and so ahead of a cheap compile queued before it
// with an earlier start key: the later one starts first, against the seed's order.
func TestANewJobNeverPassesAnEarlierKeyBehindARecycledHead(t *testing.T) {
	d := newDriver(t, 100)
	wide := spec("a")
	wide.Identity = "wide" // nothing learned: predicted at the seed's compile cost, seconds
	a := d.load(wide)
	d.load(spec("b"), 128) // aned holds b/128 and c/128: each is predicted a short load
	d.load(spec("c"), 128)
	d.acquire("a", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	adm := d.admit("a", 128)
	d.acquire("b", 128, time.Time{}) // start key: now + a load
	d.now = d.now.Add(10 * time.Millisecond)
	d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Err: &WorkerError{Code: "worker_recycle", Message: "compile limit near"}})
	// a's job is back at the head, waiting for a's replacement; b's is behind it, in its hold.
	d.acquire("c", 128, time.Time{}) // a later arrival, the same cost: a later start key than b's
	for _, j := range d.c.Inspect().Queued {
		if j.Owner == "c" {
			t.Fatalf("c/128 was queued ahead of b/128, whose start key is earlier: %s", d.c.Inspect())
		}
		if j.Owner == "b" {
			break
		}
	}
}

// TestAHeadForAShapeResidentAgainNeverEvictsIt: a request for a shape being evicted queues a
// job for it; the worker refuses the release, so the shape is resident again. The job, now the
// queue's head, must not have that very shape evicted to make room for admitting it again:
// its request should lease the resident shape.
func TestAHeadForAShapeResidentAgainNeverEvictsIt(t *testing.T) {
	d := newDriver(t, 66)
	a := d.load(spec("a"), 128) // aned holds a/128: its admission is predicted a short load
	d.load(spec("b"))
	d.load(spec("c"))
	d.release(d.lease("a", 128), nil)
	d.lease("a", 256) // held
	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	d.admit("b", 128) // the gate stays busy; 66 of 66 charged
	d.acquire("c", 128, time.Time{})
	d.advance(50 * time.Millisecond) // c/128 is the head: a/128 is evicted for it
	ev := take(d, "the eviction of a/128 for c", func(e Evict) bool { return e.Gen == a && e.Rung == 128 })
	d.acquire("a", 128, time.Time{}) // a/128 is being evicted: a (cheap) job is queued for it
	d.advance(50 * time.Millisecond)
	if j := d.c.queue.Head(); j == nil || j.Owner != "a" {
		t.Skipf("a/128's job is not the head: %s", d.c.Inspect())
	}
	d.step(Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt, Err: &WorkerError{Code: "busy", Message: "in use"}})
	none(d, "an eviction of a/128 to make room for admitting a/128 again", func(e Evict) bool { return e.Gen == a && e.Rung == 128 })
}

// TestARepeatedProbeRefusalNeverSettlesALaterProbeOfTheSameLoad: a probe names the shape's
// load, not the attempt. After a worker refused a placement probe, a new request probes the
// same load again; the first probe's refusal, delivered again while the second is on the wire,
// is taken for the second's outcome: its request is refused, and the second probe's pass is
// then ignored.
func TestARepeatedProbeRefusalNeverSettlesALaterProbeOfTheSameLoad(t *testing.T) {
	d := newDriver(t, 100)
	t1, first := d.firstProbe("a")
	refused := Probed{Gen: first.Gen, Load: first.Load, Attempt: first.Attempt, Cell: first.Cell, Err: &WorkerError{Code: "busy", Message: "try later"}}
	d.step(refused)
	if got := code(d.answer(t1).Err); got != refusal.WorkerRefused {
		t.Fatalf("the first probe's request got %s, want worker_refused", got)
	}
	t2 := d.acquire("a", 128, time.Time{})
	second := take(d, "the second probe", func(ProbeShape) bool { return true })
	d.step(refused) // the first probe's refusal, delivered again
	none(d, "an answer to the second probe's request from the first probe's repeated refusal", func(a Answer) bool { return a.Ticket == t2 })
	d.step(Probed{Gen: second.Gen, Load: second.Load, Attempt: second.Attempt, Cell: second.Cell, Device: time.Millisecond, CPU: 3 * time.Millisecond})
	if a := d.answer(t2); a.Cell == nil {
		t.Fatalf("the second probe passed, but its request got %+v", a)
	}
}

// TestAnAdmissionRefusedForResourcesIsRetriedOnlyOnce: the device refusing an admission for
// resources evicts one shape and retries once; a second refusal answers its requests, however
// many idle shapes could still be evicted.
func TestAnAdmissionRefusedForResourcesIsRetriedOnlyOnce(t *testing.T) {
	d := newDriver(t, 88)
	d.load(spec("a"))
	b := d.load(spec("b"))
	d.load(spec("c"))
	d.release(d.lease("a", 128), nil) // two idle victims
	d.release(d.lease("c", 128), nil)
	tb := d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	full := func(adm Admit) Admitted {
		return Admitted{Gen: b, Job: adm.Job, Load: adm.Load, Err: &WorkerError{Code: string(refusal.ResourcesExhausted), Message: "0x20004"}}
	}
	d.step(full(d.admit("b", 128)))
	ev := take(d, "the eviction for the retry", func(Evict) bool { return true })
	d.step(Evicted{Gen: ev.Gen, Load: ev.Load, Attempt: ev.Attempt})
	d.advance(time.Millisecond)
	d.step(full(d.admit("b", 128)))
	none(d, "a second eviction for a second retry", func(Evict) bool { return true })
	if got := code(d.answer(tb).Err); got != refusal.ResourcesExhausted {
		t.Fatalf("after a second refusal the request got %s, want ane_resources_exhausted", got)
	}
}

// TestARequestBehindAStarvedHeadAtItsBoundIsToldTheHeadsPrediction: a request for a resident
// shape that waits behind a starved budget head and reaches its admission bound is answered
// shape_compiling with the head's fresh prediction, not the one-second floor.
func TestARequestBehindAStarvedHeadAtItsBoundIsToldTheHeadsPrediction(t *testing.T) {
	d := newDriver(t, 44)
	short := spec("a")
	short.AdmissionBound = 10 * time.Second
	d.load(short)
	d.load(spec("b"))
	wide := spec("c")
	wide.Identity = "wide" // nothing learned: predicted at the seed's compile cost, seconds
	d.load(wide)
	d.lease("a", 128) // held: a/128 can only be freed by its release
	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	d.admit("b", 128) // the gate is busy and never answers
	d.acquire("c", 1024, time.Time{})
	d.advance(50 * time.Millisecond)
	if !d.c.Inspect().Starved {
		t.Fatalf("c/1024 is not a starved head: %s", d.c.Inspect())
	}
	blocked := d.acquire("a", 128, time.Time{})
	if d.c.Inspect().Blocked != 1 {
		t.Fatalf("the request for a/128 is not blocked behind the head: %s", d.c.Inspect())
	}
	d.advance(short.AdmissionBound)
	head := d.c.queue.ReadyAt(d.now, d.c.queue.Head()).Sub(d.now)
	if retry := shapeCompiling(t, d.answer(blocked)); retry != max(head, MinRetryAfter) || retry <= MinRetryAfter {
		t.Fatalf("told to retry after %s, want the head's fresh prediction %s", retry, head)
	}
}

// TestARecycledAdmissionRunsFirstOnTheReplacement: an admission whose worker asked to be
// replaced goes back to the head of the queue; once the replacement runs it starts before the
// compiles queued behind it.
func TestARecycledAdmissionRunsFirstOnTheReplacement(t *testing.T) {
	d := newDriver(t, 100)
	a := d.load(spec("a"))
	b := d.load(spec("b"))
	d.load(spec("c"))
	d.acquire("a", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	adm := d.admit("a", 128)
	d.acquire("b", 128, time.Time{})
	d.acquire("c", 128, time.Time{})
	d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Err: &WorkerError{Code: "worker_recycle", Message: "compile limit near"}})
	take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })
	d.advance(50 * time.Millisecond)
	bAdm := d.admit("b", 128) // a recovers: b's compile goes meanwhile
	d.step(Exited{Gen: a})
	sp := take(d, "Spawn a#2", func(s Spawn) bool { return s.Gen.N == 2 })
	d.step(Spawned{Gen: sp.Gen, Conn: "a2"})
	d.step(Admitted{Gen: b, Job: bAdm.Job, Load: bAdm.Load, Admission: counts(), Took: time.Second})
	none(d, "c/128's admission ahead of the recycled one", func(adm Admit) bool { return adm.Gen.Lane == "c" })
	d.admit("a", 128)
}

// TestACompilePromisedToARefusedClientSurvivesARecycleOrAResourceRefusal: a request refused
// shape_compiling is told its compile stays queued for its retry. The compile starts with
// nobody waiting (the client was sent away); if the worker asks to be replaced, or the device
// refuses it for resources, the admission must be put back as for one a request waits for, or
// the compile the client was promised is gone when it retries.
func TestACompilePromisedToARefusedClientSurvivesARecycleOrAResourceRefusal(t *testing.T) {
	refusedThenStarted := func(t *testing.T, d *driver, lane string) (Admit, time.Duration) {
		t.Helper()
		tk := d.acquire(lane, 128, d.now.Add(time.Second)) // a compile takes seconds: refused at once
		retry := shapeCompiling(t, d.answer(tk))
		d.advance(50 * time.Millisecond)
		return d.admit(lane, 128), retry
	}
	t.Run("recycled", func(t *testing.T) {
		d := newDriver(t, 100)
		a := d.load(spec("a"))
		adm, retry := refusedThenStarted(t, d, "a")
		d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Err: &WorkerError{Code: "worker_recycle", Message: "compile limit near"}})
		if !d.queued("a", 128) {
			t.Fatalf("the worker asked to be replaced, and the compile a client was told to come back for in %s is gone", retry)
		}
	})
	t.Run("refused for resources", func(t *testing.T) {
		d := newDriver(t, 100)
		d.load(spec("b"))
		d.release(d.lease("b", 128), nil) // an idle victim for the retry
		a := d.load(spec("a"))
		adm, retry := refusedThenStarted(t, d, "a")
		d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Err: &WorkerError{Code: string(refusal.ResourcesExhausted), Message: "0x20004"}})
		if !d.queued("a", 128) {
			t.Fatalf("the device refused the admission for resources, and the compile a client was told to come back for in %s is gone (not retried)", retry)
		}
	})
}

// TestAParkedRetryIsUnparkedWhenItsVictimsWorkerExits: an admission refused for resources waits
// at the queue's head for the release of the shape evicted for it. If that shape's worker
// faults and its exit is confirmed before it acknowledges, the exit freed the shape: the retry
// must go then, not wait for an acknowledgement that will never come.
func TestAParkedRetryIsUnparkedWhenItsVictimsWorkerExits(t *testing.T) {
	d := newDriver(t, 66)
	a := d.load(spec("a"))
	b := d.load(spec("b"))
	d.release(d.lease("a", 128), nil) // the victim
	held := d.lease("a", 256)
	tb := d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	adm := d.admit("b", 128)
	d.step(Admitted{Gen: b, Job: adm.Job, Load: adm.Load, Err: &WorkerError{Code: string(refusal.ResourcesExhausted), Message: "0x20004"}})
	take(d, "the eviction for the retry", func(e Evict) bool { return e.Gen == a && e.Rung == 128 })
	// a's other lease faults while the release is on its way; a's exit is confirmed before the
	// release is ever acknowledged.
	d.release(held, errBrokenPipe)
	take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })
	d.step(Exited{Gen: a})
	d.advance(time.Millisecond)
	retry := d.admit("b", 128)
	d.step(Admitted{Gen: b, Job: retry.Job, Load: retry.Load, Admission: counts(), Took: time.Second})
	if !d.answer(tb).Handoff {
		t.Fatal("the request was not served by the retry")
	}
}
