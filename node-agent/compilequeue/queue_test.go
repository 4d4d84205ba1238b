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

package compilequeue

import (
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

const bound = 600 * time.Second

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// req asks for a rung of a 22-layer model on worker "w1", with no deadline of its own.
func req(ticket Ticket, rung int) Request {
	return Request{Ticket: ticket, Owner: "w1", Shape: Shape{"gte", rung}, Layers: 22, Bound: bound}
}

func mustAccept(t *testing.T, a Answer) {
	t.Helper()
	if !a.Accepted {
		t.Fatalf("refused with retry after %v, want accepted", a.RetryAfter)
	}
}

// electAndRun elects the head at now, starts it and returns it.
func electAndRun(t *testing.T, q *Queue, now time.Time) *Job {
	t.Helper()
	j, _, wake := q.Elect(now)
	if j == nil {
		t.Fatalf("nothing elected at +%v (wake at +%v)", now.Sub(t0), wake.Sub(t0))
	}
	q.Start(now, j)
	return j
}

func TestCompilesRequestedTogetherStartCheapestFirst(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 4096)))
	mustAccept(t, q.Submit(t0.Add(ms(10)), req(2, 2048)))
	mustAccept(t, q.Submit(t0.Add(ms(20)), req(3, 128)))

	// The first arrival is held, so the later, cheaper ones are in the race.
	if j, _, wake := q.Elect(t0.Add(ms(20))); j != nil || !wake.Equal(t0.Add(ms(70))) {
		t.Fatalf("elected %v during the hold (wake %v)", j, wake)
	}
	var order []int
	now := t0.Add(ms(70))
	for q.Len() > 0 {
		j := electAndRun(t, q, now)
		order = append(order, j.Shape.Rung)
		now = now.Add(j.Prediction.Cost)
		q.Finish(j)
	}
	if want := []int{128, 2048, 4096}; !equalInts(order, want) {
		t.Fatalf("started %v, want %v", order, want)
	}
}

func TestAKnownCostCompileWaitsFiftyMillisecondsAfterArrival(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	if j, _, wake := q.Elect(t0.Add(ms(49))); j != nil || !wake.Equal(t0.Add(StartHold)) {
		t.Fatalf("at +49ms: elected %v, wake %v; want nothing until +50ms", j, wake)
	}
	if j, _, _ := q.Elect(t0.Add(StartHold)); j == nil {
		t.Fatal("not elected at +50ms")
	}
}

func TestAWideCompileIsPassedOnlyByCompilesThatArriveLessThanItsCostAfterIt(t *testing.T) {
	costs := NewCostModel()
	wide := 22 * SeedLayerCompile(4096) // about 348 s
	for _, tc := range []struct {
		name      string
		after     time.Duration
		wantFirst int
	}{
		{"arriving well within the wide cost", 100 * time.Second, 128},
		{"arriving after the wide cost has passed", wide, 4096},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := New(costs)
			mustAccept(t, q.Submit(t0, req(1, 4096)))
			// Something else holds the gate meanwhile.
			q.Submit(t0, Request{Ticket: 9, Owner: "w2", Shape: Shape{"qwen3", 8192}, Layers: 28, Bound: bound})
			other := q.Find("w2", Shape{"qwen3", 8192})
			q.Start(t0, other)
			small := req(2, 128)
			small.Bound = 2 * time.Hour
			q.Submit(t0.Add(tc.after), small)
			q.Finish(other)
			j, _, _ := q.Elect(t0.Add(tc.after + time.Second))
			if j == nil || j.Shape.Rung != tc.wantFirst {
				t.Fatalf("elected %+v, want rung %d first", j, tc.wantFirst)
			}
		})
	}
}

func TestAtMostOneCompileRunsAtATime(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	mustAccept(t, q.Submit(t0, req(2, 256)))
	first := electAndRun(t, q, t0.Add(StartHold))
	if j, _, _ := q.Elect(t0.Add(time.Hour)); j != nil {
		t.Fatalf("elected %v while another compile holds the gate", j.Shape)
	}
	q.Finish(first)
	if j, _, _ := q.Elect(t0.Add(time.Hour)); j == nil {
		t.Fatal("nothing elected after the gate was freed")
	}
}

func TestRequestsForTheSameShapeJoinOneAdmission(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	mustAccept(t, q.Submit(t0.Add(ms(5)), req(2, 128)))
	if q.Len() != 1 {
		t.Fatalf("%d jobs, want one", q.Len())
	}
	j := q.Find("w1", Shape{"gte", 128})
	if got := j.Waiters(); len(got) != 2 {
		t.Fatalf("waiters %v, want both tickets", got)
	}
	// Another worker of the same model admits its own shape.
	mustAccept(t, q.Submit(t0, Request{Ticket: 3, Owner: "w2", Shape: Shape{"gte", 128}, Layers: 22, Bound: bound}))
	if q.Len() != 2 {
		t.Fatalf("%d jobs, want one per owning worker", q.Len())
	}
}

func TestARequestPredictedReadyAfterItsDeadlineIsAnsweredShapeCompilingAndItsCompileStaysQueued(t *testing.T) {
	q := New(NewCostModel())
	r := req(1, 4096)
	r.Deadline = t0.Add(30 * time.Second)
	a := q.Submit(t0, r)
	cost := q.Find("w1", r.Shape).Prediction.Cost
	if a.Accepted || a.RetryAfter != cost+StartHold {
		t.Fatalf("got %+v, want shape_compiling with retry after %v", a, cost+StartHold)
	}
	if q.Len() != 1 {
		t.Fatal("the compile did not stay queued")
	}
}

func TestARequestPredictedReadyAfterItsAdmissionBoundIsAnsweredShapeCompiling(t *testing.T) {
	q := New(NewCostModel())
	r := Request{Ticket: 1, Owner: "w1", Shape: Shape{"qwen3", 8192}, Layers: 28, Bound: bound}
	if a := q.Submit(t0, r); a.Accepted || a.RetryAfter <= bound {
		t.Fatalf("got %+v, want shape_compiling beyond the 600s bound", a)
	}
}

func TestAnUnwantedCompileIsDroppedAfterTwiceTheDelayItLastPromised(t *testing.T) {
	q := New(NewCostModel())
	r := req(1, 4096)
	r.Deadline = t0.Add(time.Second)
	a := q.Submit(t0, r)
	if a.Accepted {
		t.Fatal("accepted")
	}
	// Keep the gate busy so the job stays queued.
	q.Submit(t0, Request{Ticket: 2, Owner: "w2", Shape: Shape{"qwen3", 8192}, Layers: 28, Bound: 2 * time.Hour})
	q.Start(t0, q.Find("w2", Shape{"qwen3", 8192}))
	q.Leave(q.Running(), 2)

	dropped, _, next := q.Expire(t0.Add(2*a.RetryAfter - time.Millisecond))
	if len(dropped) != 0 || !next.Equal(t0.Add(2*a.RetryAfter)) {
		t.Fatalf("dropped %d early (next %v)", len(dropped), next)
	}
	dropped, _, _ = q.Expire(t0.Add(2 * a.RetryAfter))
	if len(dropped) != 1 || dropped[0].Shape.Rung != 4096 {
		t.Fatalf("dropped %v, want the 4096 compile", dropped)
	}
}

func TestACompileSomeoneWaitsForIsNeverDropped(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	if dropped, _, _ := q.Expire(t0.Add(time.Minute)); len(dropped) != 0 {
		t.Fatalf("dropped %v", dropped)
	}
}

func TestCompilesOfARetiredWorkerAreDroppedAtOnce(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	mustAccept(t, q.Submit(t0, Request{Ticket: 2, Owner: "w2", Shape: Shape{"gte", 128}, Layers: 22, Bound: bound}))
	dropped := q.DropOwner("w1")
	if len(dropped) != 1 || dropped[0].Owner != "w1" || q.Len() != 1 {
		t.Fatalf("dropped %v, %d left", dropped, q.Len())
	}
}

func TestANewCompileIsNotOrderedAheadIfThatWouldMakeAnAcceptedRequestMissItsBound(t *testing.T) {
	q := New(NewCostModel())
	// A wide compile with a request whose deadline leaves a little slack.
	wide := req(1, 2048)
	wideCost := q.Costs().Predict(wide.Shape, 22, false).Cost
	wide.Deadline = t0.Add(StartHold + wideCost + 2*time.Second)
	mustAccept(t, q.Submit(t0, wide))

	// A cheaper compile arriving right after would go first by start key, but would push the
	// wide one past its request's deadline.
	small := req(2, 512)
	mustAccept(t, q.Submit(t0.Add(ms(10)), small))
	if first := q.Queued()[0]; first.Shape.Rung != 2048 {
		t.Fatalf("queue starts with %d, want the wide compile kept ahead", first.Shape.Rung)
	}

	// Without the deadline, the cheaper one goes first.
	q2 := New(NewCostModel())
	wide.Deadline = time.Time{}
	mustAccept(t, q2.Submit(t0, wide))
	mustAccept(t, q2.Submit(t0.Add(ms(10)), small))
	if first := q2.Queued()[0]; first.Shape.Rung != 512 {
		t.Fatalf("queue starts with %d, want the cheaper compile first", first.Shape.Rung)
	}
}

func TestARecoveringWorkersQueuedCompilesAreNotElected(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	mustAccept(t, q.Submit(t0, Request{Ticket: 2, Owner: "w2", Shape: Shape{"qwen3", 256}, Layers: 28, Bound: bound}))
	q.SetRecovering("w1", true)
	j, _, _ := q.Elect(t0.Add(StartHold))
	if j == nil || j.Owner != "w2" {
		t.Fatalf("elected %+v, want w2's compile", j)
	}
	q.Start(t0.Add(StartHold), j)
	q.Finish(j)
	q.SetRecovering("w1", false)
	if j, _, _ := q.Elect(t0.Add(time.Minute)); j == nil || j.Owner != "w1" {
		t.Fatalf("elected %+v after recovery, want w1's compile", j)
	}
}

func TestTheHeadsPredictionIsCheckedAgainstItsBoundBeforeItStarts(t *testing.T) {
	q := New(NewCostModel())
	r := req(1, 1024)
	cost := q.Costs().Predict(r.Shape, 22, false).Cost
	r.Deadline = t0.Add(cost + time.Second)
	mustAccept(t, q.Submit(t0, r))
	// The gate was busy longer than predicted; by the time the head may start, its request
	// can no longer be served in time.
	j, refused, _ := q.Elect(t0.Add(5 * time.Second))
	if j == nil || len(refused) != 1 || refused[0].Ticket != 1 {
		t.Fatalf("elected %v, refused %+v; want the head elected and its request refused first", j, refused)
	}
}

func TestAWaitThatReachesTheAdmissionBoundIsAnsweredShapeCompilingWithAFreshPrediction(t *testing.T) {
	q := New(NewCostModel())
	r := req(1, 128)
	r.Bound = 10 * time.Second
	mustAccept(t, q.Submit(t0, r))
	j := electAndRun(t, q, t0.Add(StartHold))
	// The compile overruns its prediction; at the bound the request is answered.
	_, refused, _ := q.Expire(t0.Add(10 * time.Second))
	if len(refused) != 1 || refused[0].DeadlineExceeded || refused[0].RetryAfter < 0 || refused[0].Job != j {
		t.Fatalf("refused %+v, want one shape_compiling answer", refused)
	}
}

func TestAWaitPastTheRequestsDeadlineIsAnsweredWithADeadlineError(t *testing.T) {
	q := New(NewCostModel())
	r := req(1, 128)
	r.Deadline = t0.Add(20 * time.Second)
	mustAccept(t, q.Submit(t0, r))
	electAndRun(t, q, t0.Add(StartHold))
	_, refused, _ := q.Expire(t0.Add(20 * time.Second))
	if len(refused) != 1 || !refused[0].DeadlineExceeded {
		t.Fatalf("refused %+v, want a deadline answer", refused)
	}
}

func TestAPredictedLoadRunningPastTwiceItsPredictionPlusOneSecondIsRepricedAsACompile(t *testing.T) {
	q := New(NewCostModel())
	r := req(1, 512)
	r.Cached = true
	mustAccept(t, q.Submit(t0, r))
	j := electAndRun(t, q, t0.Add(StartHold))
	load := j.Prediction.Cost
	ok, at := q.Reprice(t0.Add(StartHold))
	if ok || !at.Equal(t0.Add(StartHold+2*load+time.Second)) {
		t.Fatalf("repriced %v, at %v; want at start + 2 x %v + 1s", ok, at, load)
	}
	if ok, _ := q.Reprice(at); !ok || j.Prediction.Kind != Compile {
		t.Fatalf("not repriced at %v: %+v", at, j.Prediction)
	}
	if q.ReadyAt(at, j).Sub(t0.Add(StartHold)) != j.Prediction.Cost {
		t.Fatal("the running job's prediction does not use the compile cost")
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestARequestNeverJoinsAFailedAdmissionThatStillHoldsTheGate(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	failed := electAndRun(t, q, t0.Add(StartHold))
	q.Fail(failed, t0.Add(time.Minute)) // its worker's exit is not confirmed yet
	mustAccept(t, q.Submit(t0.Add(time.Second), req(2, 128)))
	if j := q.Find("w1", Shape{"gte", 128}); j == nil || j == failed {
		t.Fatal("the retry joined the failed admission")
	}
	if j, _, _ := q.Elect(t0.Add(time.Minute)); j != nil {
		t.Fatal("a new admission started while the failed one holds the gate")
	}
	q.Finish(failed)
	if j, _, _ := q.Elect(t0.Add(time.Minute)); j == nil || j.Waiters()[0] != 2 {
		t.Fatal("the retry's admission did not start once the gate was freed")
	}
}

func TestFinishFreesTheGateOnlyForTheJobThatHoldsIt(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128)))
	first := electAndRun(t, q, t0.Add(StartHold))
	q.Fail(first, t0.Add(time.Minute))
	if !q.Finish(first) {
		t.Fatal("the job holding the gate did not free it")
	}
	mustAccept(t, q.Submit(t0.Add(time.Second), req(2, 256)))
	second := electAndRun(t, q, t0.Add(time.Minute))
	// The first job's second release (say, its worker's exit confirmed after its hold expired)
	// must not free the gate the second job now holds.
	if q.Finish(first) || q.Running() != second {
		t.Fatal("a stale Finish freed the gate of the job that runs now")
	}
	mustAccept(t, q.Submit(t0.Add(time.Minute), req(3, 512)))
	if j, _, _ := q.Elect(t0.Add(time.Hour)); j != nil {
		t.Fatalf("elected %v while the second job holds the gate", j.Shape)
	}
}

func TestAParkedHeadKeepsItsPlaceAndItsJoinersUntilUnparked(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 256)))
	j := electAndRun(t, q, t0.Add(StartHold))
	q.Finish(j)
	q.Park(j)
	mustAccept(t, q.Submit(t0.Add(time.Second), req(2, 128)))
	// A request for the parked job's shape joins it rather than making a second job.
	mustAccept(t, q.Submit(t0.Add(time.Second), req(3, 256)))
	if got := q.Find("w1", Shape{"gte", 256}); got != j || !slices.Equal(j.Waiters(), []Ticket{1, 3}) {
		t.Fatalf("the request did not join the parked job: %+v", got)
	}
	if e, _, _ := q.Elect(t0.Add(time.Minute)); e != nil {
		t.Fatalf("elected %v while the head is parked", e.Shape)
	}
	q.Unpark(j)
	if e, _, _ := q.Elect(t0.Add(time.Minute)); e != j || !e.Retried {
		t.Fatalf("elected %+v, want the unparked retry", e)
	}
}

// TestAnAcceptedPredictionIsAPromiseToo: a request accepted with a predicted ready time that
// then leaves (cancelled, say) leaves its compile queued for twice that prediction, as a refused
// one's retry time keeps it.
func TestAnAcceptedPredictionIsAPromiseToo(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 4096)))
	electAndRun(t, q, t0.Add(StartHold)) // the gate is busy for minutes
	a := q.Submit(t0.Add(time.Second), req(2, 128))
	mustAccept(t, a)
	j := q.Find("w1", Shape{"gte", 128})
	q.Leave(j, 2)
	promised := a.ReadyAt.Sub(t0.Add(time.Second))
	if dropped, _, _ := q.Expire(t0.Add(time.Second + 2*promised - time.Millisecond)); len(dropped) != 0 {
		t.Fatalf("the compile was dropped before twice the %s it was predicted in", promised)
	}
	if dropped, _, _ := q.Expire(t0.Add(time.Second + 2*promised)); len(dropped) != 1 {
		t.Fatal("the compile nobody waits for was not dropped at twice its prediction")
	}
}

// TestARecoveringWorkersQueuedCompilesDelayNobodysPrediction: a recovering worker's queued
// compiles are not elected, so they are not counted in another's predicted ready time.
func TestARecoveringWorkersQueuedCompilesDelayNobodysPrediction(t *testing.T) {
	q := New(NewCostModel())
	mustAccept(t, q.Submit(t0, req(1, 128))) // queued first, with the earlier start key
	q.SetRecovering("w1", true)
	at := t0.Add(time.Second)
	other := Request{Ticket: 2, Owner: "w2", Shape: Shape{"gte", 512}, Layers: 22, Bound: bound}
	a := q.Submit(at, other)
	mustAccept(t, a)
	if q.Queued()[0].Owner != "w1" {
		t.Fatal("the recovering worker's compile is not ahead of the other")
	}
	want := at.Add(StartHold).Add(q.Costs().Predict(Shape{"gte", 512}, 22, false).Cost)
	if !a.ReadyAt.Equal(want) {
		t.Fatalf("predicted ready at +%s, want +%s: the recovering worker's compile ahead was counted", a.ReadyAt.Sub(t0), want.Sub(t0))
	}
}
