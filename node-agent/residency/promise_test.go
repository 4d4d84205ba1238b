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
	"errors"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// Regression tests for promises the core told a client and did not keep, and for outcome
// reports that arrive twice: each drives the interleaving the review found by hand.

// firstProbe loads lane with a placement probe, admits its rung 128 for a request and brings
// the request back from its handoff: it returns the request and the probe that now runs.
func (d *driver) firstProbe(lane string) (Ticket, ProbeShape) {
	d.t.Helper()
	sp := spec(lane)
	sp.Probe = func(int, int64, time.Duration, time.Duration) error { return nil }
	d.load(sp)
	tk := d.acquire(lane, 128, time.Time{})
	d.advance(50 * time.Millisecond)
	adm := d.admit(lane, 128)
	d.step(Admitted{Gen: adm.Gen, Job: adm.Job, Load: adm.Load, Admission: counts(), Took: time.Second})
	if !d.answer(tk).Handoff {
		d.t.Fatal("no handoff")
	}
	d.step(Acquire{Ticket: tk, Lane: lane, Rung: 128, Member: true})
	return tk, take(d, "the first probe of "+lane+"/128", func(ProbeShape) bool { return true })
}

// queued reports whether a job admitting lane's rung is queued (not running).
func (d *driver) queued(lane string, rung int) bool {
	for _, j := range d.c.Inspect().Queued {
		if j.Owner == lane && j.Rung == rung {
			return true
		}
	}
	return false
}

func shapeCompiling(t *testing.T, a Answer) time.Duration {
	t.Helper()
	var r *refusal.Error
	if !errors.As(a.Err, &r) || r.Code != refusal.ShapeCompiling {
		t.Fatalf("answered %+v, want shape_compiling", a)
	}
	return r.RetryAfter
}

// TestACompileRefusedAtTheAdmissionBoundStaysQueuedForTwiceItsNewPromise: a request accepted
// early waits until its bound passes (the compile ahead of it overran); it is answered
// shape_compiling with a fresh retry time, and the compile must then stay queued for twice
// that: the seed drops a compile nobody waits for after twice the delay it *last* promised,
// not the first.
func TestACompileRefusedAtTheAdmissionBoundStaysQueuedForTwiceItsNewPromise(t *testing.T) {
	d := newDriver(t, 100)
	short := spec("a")
	short.AdmissionBound = 40 * time.Second
	d.load(short)
	d.load(spec("b"))
	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	d.admit("b", 128) // b's compile runs, and overruns its prediction: it is never answered
	ta := d.acquire("a", 128, time.Time{})
	if !d.queued("a", 128) {
		t.Fatal("a's compile is not queued")
	}
	d.advance(short.AdmissionBound)
	retry := shapeCompiling(t, d.answer(ta))
	if !d.queued("a", 128) {
		t.Fatalf("a's compile was dropped in the pass that told its client to retry in %s", retry)
	}
	d.advance(2*retry - time.Millisecond)
	if !d.queued("a", 128) {
		t.Fatalf("a's compile was dropped before twice its last promise (%s)", retry)
	}
	d.advance(time.Millisecond)
	if d.queued("a", 128) {
		t.Fatalf("a's compile is still queued twice its last promise (%s) after it, with nobody waiting", retry)
	}
}

// TestASubSecondPromiseKeepsTheCompileForTwiceWhatTheClientWasTold: the client is told at
// least MinRetryAfter, so the compile must stay queued for twice that, not twice the raw
// (sub-second) prediction, or the retry finds nothing.
func TestASubSecondPromiseKeepsTheCompileForTwiceWhatTheClientWasTold(t *testing.T) {
	d := newDriver(t, 100)
	d.load(spec("a"), 128) // aned holds a's rung 128: it loads in a fraction of a second
	d.load(spec("b"))
	d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	d.admit("b", 128)
	d.advance(time.Minute) // b's compile overran: the gate's end is predicted "now"
	ta := d.acquire("a", 128, d.now.Add(10*time.Millisecond))
	if retry := shapeCompiling(t, d.answer(ta)); retry != MinRetryAfter {
		t.Fatalf("told to retry after %s, want the floor %s", retry, MinRetryAfter)
	}
	d.advance(2*MinRetryAfter - time.Millisecond)
	if !d.queued("a", 128) {
		t.Fatal("a's compile was dropped before its client, told to retry after a second, could")
	}
}

// TestARequestDuringAnUnknownOutcomeHoldIsPredictedAfterTheHold: while a failed admission
// holds the gate for its unknown outcome (its worker's exit is not confirmed), the gate is
// predicted busy until the hold's end. A request that cannot be served before its deadline is
// answered shape_compiling at once, not accepted and failed at its deadline.
func TestARequestDuringAnUnknownOutcomeHoldIsPredictedAfterTheHold(t *testing.T) {
	d := newDriver(t, 100)
	a := d.load(spec("a"))
	d.load(spec("b"))
	d.acquire("a", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	adm := d.admit("a", 128)
	d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Err: errBrokenPipe})
	take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })
	tb := d.acquire("b", 128, d.now.Add(20*time.Second))
	if retry := shapeCompiling(t, d.answer(tb)); retry < UnknownOutcomeGateHold {
		t.Fatalf("told to retry after %s, but the gate is held for %s", retry, UnknownOutcomeGateHold)
	}
}

// TestRequestsQueuedForAReplacementThatFailsToStartFailLoudly: every request of a lane whose
// dead worker's replacement failed to start fails backend_unavailable, those already queued for
// it too, rather than wait to their bound for a worker that may never come.
func TestRequestsQueuedForAReplacementThatFailsToStartFailLoudly(t *testing.T) {
	d := newDriver(t, 100)
	a := d.load(spec("a"))
	d.release(d.lease("a", 128), errBrokenPipe)
	take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })
	queued := d.acquire("a", 256, time.Time{}) // waits for the replacement
	d.step(Exited{Gen: a})
	sp := take(d, "Spawn a#2", func(s Spawn) bool { return s.Gen.N == 2 })
	d.step(Spawned{Gen: sp.Gen, Err: errors.New("exec: the worker did not start")})
	if got := code(d.answer(queued).Err); got != refusal.BackendUnavailable {
		t.Fatalf("a request queued for the replacement got %s, want backend_unavailable", got)
	}
}

// TestALateOrRepeatedOutcomeReportChangesNothing: every outcome a worker call reports may
// reach the owner twice (a retried delivery, a reply and its channel's failure); the second
// must change nothing. The driver checks the core's invariants after every step.
func TestALateOrRepeatedOutcomeReportChangesNothing(t *testing.T) {
	t.Run("Probed", func(t *testing.T) {
		d := newDriver(t, 100)
		ta, pr := d.firstProbe("a")
		outcome := Probed{Gen: pr.Gen, Load: pr.Load, Attempt: pr.Attempt, Cell: pr.Cell, Device: time.Millisecond, CPU: 3 * time.Millisecond}
		d.step(outcome)
		cell := d.answer(ta).Cell
		if cell == nil || cell.Leases() != 1 {
			t.Fatalf("the request holds %+v after the probe passed", cell)
		}
		d.step(outcome)
		if n := cell.Leases(); n != 1 {
			t.Fatalf("a repeated probe outcome left %d leases counted while the request holds one", n)
		}
	})
	t.Run("Admitted of unknown outcome", func(t *testing.T) {
		d := newDriver(t, 100)
		a := d.load(spec("a"))
		d.load(spec("b"))
		d.acquire("a", 128, time.Time{})
		d.advance(50 * time.Millisecond)
		adm := d.admit("a", 128)
		failed := Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Err: errBrokenPipe}
		d.step(failed)
		d.step(failed)
		// Its success, reported late, must not free the gate the unknown outcome holds.
		d.step(Admitted{Gen: a, Job: adm.Job, Load: adm.Load, Admission: counts(), Took: time.Second})
		if i := d.c.Inspect(); i.Running == nil || !i.Held || i.Used != 22 {
			t.Fatalf("after repeated reports the gate is %+v (held %v) with %d charged; want held by a's failed admission, 22 charged", i.Running, i.Held, i.Used)
		}
		d.acquire("b", 128, time.Time{})
		d.advance(50 * time.Millisecond)
		none(d, "a second compile while the unknown outcome holds the gate", func(Admit) bool { return true })
	})
	t.Run("Evicted of unknown outcome", func(t *testing.T) {
		d := newDriver(t, 44)
		a := d.load(spec("a"))
		d.load(spec("b"))
		d.release(d.lease("a", 128), nil)
		d.release(d.lease("a", 256), nil)
		d.acquire("b", 128, time.Time{})
		d.advance(50 * time.Millisecond)
		ev := take(d, "Evict a", func(e Evict) bool { return e.Gen == a })
		failed := Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt, Err: errBrokenPipe}
		d.step(failed)
		d.step(failed)
		// A release acknowledged late must not refund a charge whose process may still hold it.
		d.step(Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt})
		if used := d.c.Used(); used != 44 {
			t.Fatalf("%d executables charged after repeated eviction reports, want 44 until a's exit is confirmed", used)
		}
	})
}

// TestAnAdmissionHeldBackByAnObservationStartsWhenItEnds: a certify observation holds every
// admission back while the workers' inventories are asked. When the last inventory ends it,
// the queue's head must start (or the core ask to be stepped at once), not wait for some
// unrelated event. The simulator found it waiting.
func TestAnAdmissionHeldBackByAnObservationStartsWhenItEnds(t *testing.T) {
	d := newDriver(t, 100)
	a := d.load(spec("a"))
	d.step(Observe{ID: 1})
	inv := take(d, "Inventory a", func(i Inventory) bool { return i.Gen == a })
	d.acquire("a", 128, time.Time{})
	d.advance(time.Second)
	none(d, "an admission during the observation", func(Admit) bool { return true })
	d.step(Inventoried{Observation: inv.Observation, Gen: a, Rungs: []int{}})
	take(d, "Observed 1", func(o Observed) bool { return o.ID == 1 })
	if next := d.c.Ready().Next; next.IsZero() || next.After(d.now) {
		t.Fatalf("the observation ended, but the core did not ask to be stepped again at once for a's admission (next %v)", next)
	}
}

// TestALateReportOfAnEarlierAttemptNeverSettlesItsRetry: the simulator's repeated reports found
// two outcomes of a first attempt taken for its retry's. A resource refusal repeated while the
// retried admission (the same job) is on the wire refunded the retry's charge, and the retry's
// success then left programs on the device uncharged; a failed start repeated while the
// replacement's next start is in flight (the same generation number) failed that start, and
// its worker was never connected.
func TestALateReportOfAnEarlierAttemptNeverSettlesItsRetry(t *testing.T) {
	t.Run("an admission retried after a resource refusal", func(t *testing.T) {
		d := newDriver(t, 66)
		a := d.load(spec("a"))
		b := d.load(spec("b"))
		d.release(d.lease("a", 128), nil)
		d.acquire("b", 128, time.Time{})
		d.advance(50 * time.Millisecond)
		first := d.admit("b", 128)
		refused := Admitted{Gen: b, Job: first.Job, Load: first.Load, Err: &WorkerError{Code: string(refusal.ResourcesExhausted), Message: "0x20004"}}
		d.step(refused)
		ev := take(d, "the eviction for the retry", func(e Evict) bool { return e.Gen == a })
		d.step(Evicted{Gen: a, Load: ev.Load, Attempt: ev.Attempt})
		d.advance(time.Millisecond)
		retry := d.admit("b", 128)
		d.step(refused) // the first attempt's refusal, delivered again
		if used := d.c.Used(); used != 22 {
			t.Fatalf("%d executables charged while the retry is on the wire, want its 22", used)
		}
		d.step(Admitted{Gen: b, Job: retry.Job, Load: retry.Load, Admission: counts(), Took: time.Second})
		if sh, ok := d.c.Inspect().Shape("b", 128); !ok || sh.State != "resident" {
			t.Fatalf("the retry's success left b/128 %+v, want it resident and charged", sh)
		}
	})
	t.Run("a replacement started again after a failed start", func(t *testing.T) {
		d := newDriver(t, 100)
		a := d.load(spec("a"))
		d.release(d.lease("a", 128), errBrokenPipe)
		take(d, "ConfirmExit a", func(c ConfirmExit) bool { return c.Gen == a })
		d.step(Exited{Gen: a})
		sp := take(d, "Spawn a#2", func(s Spawn) bool { return s.Gen.N == 2 })
		failed := Spawned{Gen: sp.Gen, Err: errors.New("exec: the worker did not start")}
		d.step(failed)
		d.advance(time.Second) // the backoff: a#2 is started again
		again := take(d, "Spawn a#2 again", func(s Spawn) bool { return s.Gen.N == 2 })
		d.step(failed) // the first start's failure, delivered again
		d.step(Spawned{Gen: again.Gen, Conn: "a2"})
		if m := d.c.Inspect().Models["a"]; m.State != "running" || m.Gen != 2 {
			t.Fatalf("a is %s at generation %d, want its second start of generation 2 running", m.State, m.Gen)
		}
	})
}

// TestANewcomerNeverLeasesAheadOfAStarvedHeadThroughAnOpenCohort: while a finished admission's
// cohort still protects its shape (one member has not come back yet), a request that arrived
// after the admission completed is no member: it yields to the starved budget head like any
// other resident traffic.
func TestANewcomerNeverLeasesAheadOfAStarvedHeadThroughAnOpenCohort(t *testing.T) {
	d := newDriver(t, 44)
	d.load(spec("a"))
	b := d.load(spec("b"))
	d.lease("a", 128) // held: a/128 cannot be evicted
	t1 := d.acquire("b", 128, time.Time{})
	d.advance(50 * time.Millisecond)
	adm := d.admit("b", 128)
	t2 := d.acquire("b", 128, time.Time{}) // joins the running admission
	d.acquire("a", 256, time.Time{})       // the head: no budget until a lease is released
	d.advance(50 * time.Millisecond)
	d.step(Admitted{Gen: b, Job: adm.Job, Load: adm.Load, Admission: counts(), Took: time.Second})
	for _, tk := range []Ticket{t1, t2} {
		if !d.answer(tk).Handoff {
			t.Fatalf("ticket %d was not handed the shape", tk)
		}
	}
	if !d.c.Inspect().Starved {
		t.Fatal("a/256 is not a starved head")
	}
	d.step(Acquire{Ticket: t1, Lane: "b", Rung: 128, Member: true})
	if d.answer(t1).Cell == nil {
		t.Fatal("the cohort member did not lease ahead of the head")
	}
	// t2 has not come back: the cohort still protects b/128. A newcomer is not a member.
	newcomer := d.acquire("b", 128, time.Time{})
	none(d, "a lease for the newcomer ahead of the starved head", func(a Answer) bool { return a.Ticket == newcomer })
	if d.c.Inspect().Blocked != 1 {
		t.Fatalf("the newcomer is not blocked behind the head: %s", d.c.Inspect())
	}
}
