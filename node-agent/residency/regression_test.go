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
	"slices"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// Regression tests for the defects the core's review found: each drives the exact
// interleaving by hand.

func TestAnExpiredUnknownOutcomeHoldIsNotFreedAgainWhenTheExitIsConfirmed(t *testing.T) {
	d := newDriver(t, 100)
	a := d.load(spec("a"))
	d.load(spec("b"))
	d.load(spec("c"))
	ta := d.acquire("a", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	adm := d.admit("a", 128)
	// a's admission fails with an unknown outcome: it holds the gate; a's exit is confirmed late.
	d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Err: errBrokenPipe})
	if code(d.answer(ta).Err) != refusal.EngineCrashed {
		t.Fatal("the failed admission's request was not answered engine_crashed")
	}
	take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })

	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	none(d, "an admission while the unknown outcome holds the gate", func(Admit) bool { return true })
	// After 35 s the hold ends: b's admission starts.
	d.advance(UnknownOutcomeGateHold)
	d.admit("b", 128)
	d.acquire("c", 128, time.Time{})
	d.advance(50 * time.Millisecond)

	// Now a's exit is confirmed. The gate it once held was freed at its hold's end; freeing it
	// again would start c's compile beside b's: two compiles on the device.
	d.step(Exited{Gen: a})
	d.advance(time.Millisecond)
	none(d, "c's admission while b's still runs", func(a Admit) bool { return a.Gen.Lane == "c" })
	if r := d.c.Inspect().Running; r == nil || r.Owner != "b" {
		t.Fatalf("the gate is held by %+v, want b's running admission", r)
	}
}

func TestAnAdmissionResultAfterItsWorkersConfirmedExitIsDiscarded(t *testing.T) {
	for _, order := range []string{"exit confirmed first", "result first"} {
		t.Run(order, func(t *testing.T) {
			d := newDriver(t, 100)
			a := d.load(spec("a"))
			held := d.lease("a", 128)
			waiting := d.acquire("a", 256, time.Time{})
			d.advance(50 * time.Millisecond)
			adm := d.admit("a", 256)
			// Another lease of the same worker faults: its exit is confirmed while the
			// admission of 256 is in flight.
			d.release(held, errBrokenPipe)
			take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })
			if used := d.c.Used(); used != 44 {
				t.Fatalf("charged %d before the exit is confirmed, want 44", used)
			}
			result := Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Admission: counts(), Took: time.Second}
			if order == "result first" {
				result.Err = errBrokenPipe // the closed channel fails the admission
				d.step(result)
				d.step(Exited{Gen: a})
			} else {
				d.step(Exited{Gen: a})
				d.step(result) // a success the worker sent just before it went
			}
			if ans := d.answer(waiting); code(ans.Err) != refusal.EngineCrashed {
				t.Fatalf("the admission's request got %+v, want engine_crashed once", ans)
			}
			none(d, "a second answer or a handoff", func(Answer) bool { return true })
			if used := d.c.Used(); used != 0 {
				t.Fatalf("charged %d after the exit, want 0: every shape refunded exactly once", used)
			}
			if sh := d.c.Inspect().Models["a"].Shapes; len(sh) != 0 {
				t.Fatalf("shapes %+v survive the exit", sh)
			}
			// The replacement serves, and the gate is free for its admission.
			sp := take(d, "Spawn a#2", func(s Spawn) bool { return s.Gen.N == 2 })
			d.step(Spawned{Gen: sp.Gen, Conn: "a2"})
			d.acquire("a", 512, time.Time{})
			d.advance(50 * time.Millisecond)
			if adm := d.admit("a", 512); adm.Gen != sp.Gen {
				t.Fatalf("admitted on %d, want the replacement", adm.Gen.N)
			}
		})
	}
}

func TestAResourceRetryWhoseShapeBecameResidentDoesNotWedgeTheQueue(t *testing.T) {
	setup := func(t *testing.T) (*driver, *Gen, *Gen, Ticket, Evict) {
		d := newDriver(t, 66)
		a := d.load(spec("a"))
		b := d.load(spec("b"))
		d.load(spec("c"))
		d.release(d.lease("a", 128), nil) // the victim
		first := d.acquire("b", 128, time.Time{})
		d.advance(50 * time.Millisecond)
		adm := d.admit("b", 128)
		d.step(Admitted{Gen: b, Job: adm.Job, Load: adm.Load, Err: &WorkerError{Code: string(refusal.ResourcesExhausted), Message: "0x20004"}})
		ev := take(d, "the eviction for the retry", func(e Evict) bool { return e.Gen == a && e.Rung == 128 })
		return d, a, b, first, ev
	}

	t.Run("a request for the parked shape joins it", func(t *testing.T) {
		d, a, b, first, ev := setup(t)
		second := d.acquire("b", 128, time.Time{})
		d.advance(50 * time.Millisecond)
		insp := d.c.Inspect()
		if len(insp.Queued) != 1 || !insp.Queued[0].Parked || !slices.Equal(insp.Queued[0].Waiters, []Ticket{first, second}) {
			t.Fatalf("queue %+v: want one parked job for b/128 holding both requests", insp.Queued)
		}
		none(d, "a second admission of b/128", func(a Admit) bool { return a.Gen.Lane == "b" })
		d.step(Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt})
		d.advance(time.Millisecond)
		retry := d.admit("b", 128)
		d.step(Admitted{Gen: b, Job: retry.Job, Load: retry.Load, Admission: counts(), Took: time.Second})
		for _, tk := range []Ticket{first, second} {
			if !d.answer(tk).Handoff {
				t.Fatalf("ticket %d was not handed the shape", tk)
			}
		}
		// Other lanes' cold admissions are not wedged behind a job for a resident shape.
		d.acquire("c", 256, time.Time{})
		d.advance(50 * time.Millisecond)
		d.admit("c", 256)
	})

	t.Run("its lane retires while it is parked", func(t *testing.T) {
		d, a, _, first, ev := setup(t)
		d.step(Retire{Lane: "b"})
		if code(d.answer(first).Err) != refusal.LaneRetired {
			t.Fatal("the parked job's request was not answered lane_retired")
		}
		if q := d.c.Inspect().Queued; len(q) != 0 {
			t.Fatalf("queue %+v after the lane retired, want it empty", q)
		}
		d.step(Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt})
		d.acquire("c", 256, time.Time{})
		d.advance(50 * time.Millisecond)
		d.admit("c", 256)
	})
}

func TestRequestsJoinedToAPrewarmAreAnsweredWhenItIsRecycledOrRefused(t *testing.T) {
	// setup starts a's prewarm admission of 128 and joins a request to it; b's shape is resident
	// (a victim for an eviction), loaded before the prewarm ran.
	setup := func(t *testing.T) (*driver, *Gen, *Gen, Admit, Ticket) {
		d := newDriver(t, 66)
		a := d.load(spec("a"))
		b := d.load(spec("b"))
		d.release(d.lease("b", 128), nil)
		d.step(Prewarm{Lane: "a", Rungs: []int{128, 256}})
		pre := d.admit("a", 128)
		joined := d.acquire("a", 128, time.Time{})
		if r := d.c.Inspect().Running; r == nil || !slices.Equal(r.Waiters, []Ticket{joined}) {
			t.Fatalf("running %+v: the request did not join the prewarm admission", r)
		}
		return d, a, b, pre, joined
	}

	t.Run("recycled", func(t *testing.T) {
		d, a, _, pre, joined := setup(t)
		d.step(Admitted{Gen: a, Job: pre.Job, Load: pre.Load, Err: &WorkerError{Code: protocol.CodeRecycle, Message: "no compiles left"}})
		take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })
		none(d, "an answer before the replacement ran the admission", func(Answer) bool { return true })
		d.step(Exited{Gen: a})
		sp := take[Spawn](d, "Spawn a#2", nil)
		d.step(Spawned{Gen: sp.Gen, Conn: "a2"})
		d.advance(50 * time.Millisecond)
		again := d.admit("a", 128)
		d.step(Admitted{Gen: sp.Gen, Job: again.Job, Load: again.Load, Admission: counts(), Took: time.Second})
		if !d.answer(joined).Handoff {
			t.Fatal("the joined request was not handed the shape the replacement admitted")
		}
	})

	t.Run("refused for resources", func(t *testing.T) {
		d, a, b, pre, joined := setup(t)
		d.step(Admitted{Gen: a, Job: pre.Job, Load: pre.Load, Err: &WorkerError{Code: string(refusal.ResourcesExhausted), Message: "full"}})
		// A request waits: the device is made room for and the admission retried, as for any
		// admission a request waits for.
		ev := take(d, "the eviction for the retry", func(e Evict) bool { return e.Gen == b })
		none(d, "a refusal of the joined request", func(a Answer) bool { return a.Ticket == joined })
		d.step(Evicted{Gen: b, Load: ev.Load, Attempt: ev.Attempt})
		d.advance(time.Millisecond)
		retry := d.admit("a", 128)
		d.step(Admitted{Gen: a, Job: retry.Job, Load: retry.Load, Admission: counts(), Took: time.Second})
		if !d.answer(joined).Handoff {
			t.Fatal("the joined request was not served by the retry")
		}
	})

	t.Run("refused", func(t *testing.T) {
		d, a, _, pre, joined := setup(t)
		d.step(Admitted{Gen: a, Job: pre.Job, Load: pre.Load, Err: &WorkerError{Code: "compile_failed", Message: "ANECCompile() FAILED"}})
		if code(d.answer(joined).Err) != refusal.WorkerRefused {
			t.Fatal("the joined request was not answered worker_refused")
		}
		if p, _ := d.c.Ready().View.Prewarm("a"); p.State != "Finished" || p.Failed != 1 {
			t.Fatalf("prewarm %+v, want finished with one failure", p)
		}
		if len(d.warns) != 1 {
			t.Fatalf("warnings %v, want the refused prewarm admission's one", d.warns)
		}
		none(d, "a restart", func(ConfirmExit) bool { return true })
	})
}

func TestRetiringALaneWhileItsFirstWorkerLoadsConfirmsExitWithoutPanic(t *testing.T) {
	d := newDriver(t, 100)
	d.step(Load{Spec: spec("a")})
	sp := take[Spawn](d, "Spawn a", nil)
	d.step(Retire{Lane: "a"})
	d.step(Spawned{Gen: sp.Gen, Conn: "a1"})
	if l := take[Loaded](d, "Loaded a", nil); l.Err == nil {
		t.Fatal("the load succeeded though the lane was retired while it loaded")
	}
	take(d, "ConfirmExit of the unconnected worker", func(c ConfirmExit) bool { return c.Gen == sp.Gen })
	none(d, "Retired before the exit is confirmed", func(Retired) bool { return true })
	d.step(Exited{Gen: sp.Gen})
	take[Retired](d, "Retired a", nil)
	if lanes := d.c.Ready().View.Lanes(); len(lanes) != 0 {
		t.Fatalf("lanes %v after the retirement", lanes)
	}
	// The core is alive: another lane loads and serves.
	d.load(spec("b"))
	d.release(d.lease("b", 128), nil)
}

func TestARungFromAWorkerThatSendsNoCountsIsAlwaysPredictedAsACompile(t *testing.T) {
	for _, tc := range []struct {
		name     string
		adm      Admission
		wantKind string
	}{
		{"an older worker sends no counts", Admission{}, "compile"},
		{"a worker that sends counts", counts(), "load"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDriver(t, 22) // one shape at a time: 256 evicts 128
			a := d.load(spec("a"))
			first := d.acquire("a", 128, time.Time{})
			d.advance(50 * time.Millisecond)
			adm := d.admit("a", 128)
			d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Admission: tc.adm, Took: 8 * time.Second})
			if !d.answer(first).Handoff {
				t.Fatal("no handoff")
			}
			d.step(Acquire{Ticket: first, Lane: "a", Rung: 128, Member: true})
			lease := d.answer(first).Cell
			d.release(lease, nil)
			if snap, _ := d.c.Ready().View.Lane("a"); tc.wantKind == "compile" && len(snap.Cached) != 0 {
				t.Fatalf("cached %v: a worker that sent no counts had its rung marked cached", snap.Cached)
			}
			// 256 evicts 128; asking for 128 again predicts a compile unless aned was said to hold it.
			d.release(d.lease("a", 256), nil)
			d.acquire("a", 128, time.Time{})
			var job JobInfo
			if q := d.c.Inspect().Queued; len(q) == 1 {
				job = q[0]
			} else if r := d.c.Inspect().Running; r != nil {
				job = *r
			}
			if job.Kind != tc.wantKind {
				t.Fatalf("the readmission of 128 is predicted as a %q, want %q", job.Kind, tc.wantKind)
			}
		})
	}
}
