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
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// batching is a lane "a" whose first worker is warm and holds its exchanges at a gate, and
// records the token counts of every exchange's sequences.
type batching struct {
	*live
	w    *fakeworker.Worker
	gate chan struct{}

	mu        sync.Mutex
	exchanges [][]int
	// rpcs are the request ids the timeline names on each exchange's start: its leader's, then
	// its riders'.
	rpcs [][]string
	// faultShared makes an exchange of more than one sequence fail as a broken pipe does;
	// refuseShared makes the worker refuse one with that code.
	faultShared  bool
	refuseShared string
	// faultAt makes an exchange of these lengths fail as a broken pipe does.
	faultAt []int
	// malformShared drops the last vector of a shared exchange's reply.
	malformShared bool
	// holdAt, when set, is a gate an exchange of these lengths waits at before it answers.
	holdAt   []int
	holdGate chan struct{}
}

func newBatching(t *testing.T, opts ...func(*supervisor.ModelSpec, *Lane)) *batching {
	t.Helper()
	b := &batching{}
	b.live = newTracedLive(t, 100, func(ev supervisor.Event) {
		if ev.Kind == residency.EventRPCStart && ev.RPC == "exchange" {
			b.mu.Lock()
			b.rpcs = append(b.rpcs, append([]string{ev.RequestID}, ev.Riders...))
			b.mu.Unlock()
		}
	})
	b.w, b.gate = b.gated(opts...)
	b.w.Lock()
	embed := b.w.Reply
	b.w.Reply = func(rung int, payload []byte) ([]byte, error) {
		e := &pb.Execute{}
		if err := proto.Unmarshal(payload, e); err != nil {
			return nil, err
		}
		var lens []int
		for _, s := range e.Sequences {
			lens = append(lens, len(s.TokenIds))
		}
		b.mu.Lock()
		b.exchanges = append(b.exchanges, lens)
		fault, refuse := b.faultShared && len(lens) > 1 || b.faultAt != nil && slices.Equal(lens, b.faultAt), ""
		if len(lens) > 1 {
			refuse = b.refuseShared
		}
		var hold chan struct{}
		if b.holdGate != nil && slices.Equal(lens, b.holdAt) {
			hold = b.holdGate
		}
		b.mu.Unlock()
		if hold != nil {
			<-hold
		}
		switch {
		case fault:
			return nil, fakeworker.ErrBrokenPipe
		case refuse != "":
			return nil, &residency.WorkerError{Code: refuse, Message: "the device failed"}
		case slices.Contains(lens, refusedLength):
			// As a worker does, every sequence is checked before any runs.
			return nil, &residency.WorkerError{Code: protocol.CodeInvalidInput, Message: "a sequence of 13 tokens is refused"}
		}
		reply, err := embed(rung, payload)
		b.mu.Lock()
		malform := b.malformShared && len(lens) > 1
		b.mu.Unlock()
		if err == nil && malform {
			r := &pb.Reply{}
			if err = proto.Unmarshal(reply, r); err == nil {
				r.Vectors = r.Vectors[:len(r.Vectors)-1]
				reply, err = proto.Marshal(r)
			}
		}
		return reply, err
	}
	b.w.Unlock()
	return b
}

// refusedLength is the length of a sequence the batching worker refuses.
const refusedLength = 13

// waiting is how many parts wait for the next exchange of lane a's shapes.
func (b *batching) waiting() int {
	b.srv.mu.Lock()
	ln := b.srv.lanes["a"]
	b.srv.mu.Unlock()
	ln.cmu.Lock()
	defer ln.cmu.Unlock()
	n := 0
	for _, c := range ln.shapes {
		n += len(c.queue)
	}
	return n
}

// hold starts a call of 10 tokens whose exchange waits at the gate, then calls of lengths,
// each waiting for the next exchange, and returns their answers in order.
func (b *batching) hold(deadline time.Time, lengths ...int) (held <-chan outcome, waiting []<-chan outcome) {
	b.t.Helper()
	held = b.call("a", 10, time.Time{})
	eventually(b.t, "the first call's exchange runs", func() bool { return b.w.Exchanging() == 1 })
	for i, n := range lengths {
		waiting = append(waiting, b.call("a", n, deadline))
		eventually(b.t, "the call waits for the next exchange", func() bool { return b.waiting() == i+1 })
	}
	return held, waiting
}

func (b *batching) recorded() [][]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.exchanges)
}

// wantOwnVector checks that a call of n tokens got its own input's embedding.
func wantOwnVector(t *testing.T, o outcome, n int) {
	t.Helper()
	if o.err != nil {
		t.Fatalf("the call of %d tokens: %v", n, o.err)
	}
	if want := worker.Embed("a", 8, tokens(n)); len(o.res.Vectors) != 1 || !slices.Equal(o.res.Vectors[0], want) {
		t.Fatalf("the call of %d tokens got %v, want its own input's embedding %v", n, o.res.Vectors, want)
	}
}

func TestCallsWaitingOnOneShapeShareItsNextExchange(t *testing.T) {
	b := newBatching(t)
	held, waiting := b.hold(time.Time{}, 11, 12, 14)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, n := range []int{11, 12, 14} {
		wantOwnVector(t, waitAnswer(t, waiting[i]), n)
	}
	if got, want := b.recorded(), [][]int{{10}, {11, 12, 14}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want the held call alone, then the three that waited together", got)
	}
	b.mu.Lock()
	rpcs := slices.Clone(b.rpcs)
	b.mu.Unlock()
	if want := []string{"call-11", "call-12", "call-14"}; len(rpcs) < 3 || !slices.Equal(rpcs[len(rpcs)-1], want) {
		t.Fatalf("the timeline named %v on the exchanges, want the shared one naming its leader and riders %v", rpcs, want)
	}
	eventually(t, "every call let go", func() bool { return b.srv.Inflight("a") == 0 && b.waiting() == 0 })
	// A call that finds the shape idle runs at once, alone.
	wantOwnVector(t, waitAnswer(t, b.call("a", 15, time.Time{})), 15)
	if got := b.recorded(); !slices.Equal(got[len(got)-1], []int{15}) {
		t.Fatalf("the last exchange carried %v, want the lone call", got[len(got)-1])
	}
}

func TestAnExchangeOfWaitingCallsKeepsTheLanesBoundOnOneExchange(t *testing.T) {
	b := newBatching(t, func(_ *supervisor.ModelSpec, ln *Lane) { ln.MaxExchangeSequences = 2 })
	held, waiting := b.hold(time.Time{}, 11, 12, 14, 15, 16)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, n := range []int{11, 12, 14, 15, 16} {
		wantOwnVector(t, waitAnswer(t, waiting[i]), n)
	}
	if got, want := b.recorded(), [][]int{{10}, {11, 12}, {14, 15}, {16}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want at most 2 sequences each, in order of arrival", got)
	}
}

func TestAWorkerRefusalOfASharedExchangeIsAnsweredToEachCallAlone(t *testing.T) {
	b := newBatching(t)
	held, waiting := b.hold(time.Time{}, 11, refusedLength, 14)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	wantOwnVector(t, waitAnswer(t, waiting[0]), 11)
	if o := waitAnswer(t, waiting[1]); refusal.CodeOf(o.err) != refusal.InvalidRequest {
		t.Fatalf("the refused input's call got %+v, want invalid_request, the worker's refusal of its input", o)
	}
	wantOwnVector(t, waitAnswer(t, waiting[2]), 14)
	if got, want := b.recorded(), [][]int{{10}, {11, refusedLength, 14}, {11}, {refusedLength}, {14}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want the refused batch sent again call by call", got)
	}
	if n := b.sp.Spawned("a"); n != 1 {
		t.Fatalf("%d workers spawned: a refusal is not a fault", n)
	}
}

func TestAFaultInASharedExchangeFailsEachCallInItAndRecoversTheWorkerOnce(t *testing.T) {
	b := newBatching(t)
	b.mu.Lock()
	b.faultShared = true
	b.mu.Unlock()
	held, waiting := b.hold(time.Time{}, 11, 12)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, c := range waiting {
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.EngineCrashed {
			t.Fatalf("call %d of the faulted exchange got %v, want engine_crashed", i, o.err)
		}
	}
	if got, want := b.recorded(), [][]int{{10}, {11, 12}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want the faulted one never sent again", got)
	}
	// The worker is recovered once: the next call runs on generation 2, and no third is spawned.
	if o := b.settle(b.call("a", 10, time.Time{}), 2*time.Second); o.err != nil || o.res.Generations[0] != 2 {
		t.Fatalf("after the fault: %+v, want the replacement to serve", o)
	}
	if n := b.sp.Spawned("a"); n != 2 {
		t.Fatalf("%d workers spawned, want the faulted one replaced once", n)
	}
}

func TestACallWhoseDeadlinePassesWhileItWaitsForTheNextExchangeIsNotSent(t *testing.T) {
	b := newBatching(t)
	held, waiting := b.hold(b.clk.Now().Add(time.Second), 11, 12)
	b.clk.Step(time.Second)
	for i, c := range waiting {
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.DeadlineExceeded {
			t.Fatalf("waiting call %d got %v at its deadline, want deadline_exceeded", i, o.err)
		}
	}
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	eventually(t, "every call let go", func() bool { return b.srv.Inflight("a") == 0 })
	if got, want := b.recorded(), [][]int{{10}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want nothing sent after its deadline", got)
	}
}

// A refusal that is not of the input (the device's) may come after some sequences ran: it is
// answered to every call of the exchange, and nothing is sent again.
func TestADeviceRefusalOfASharedExchangeIsAnsweredToEveryCallAndNothingIsSentAgain(t *testing.T) {
	b := newBatching(t)
	b.mu.Lock()
	b.refuseShared = "ane_failed"
	b.mu.Unlock()
	held, waiting := b.hold(time.Time{}, 11, 12)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, c := range waiting {
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.WorkerRefused {
			t.Fatalf("call %d got %v, want worker_refused", i, o.err)
		}
	}
	if got, want := b.recorded(), [][]int{{10}, {11, 12}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want nothing sent again", got)
	}
	if n := b.sp.Spawned("a"); n != 1 {
		t.Fatalf("%d workers spawned: a refusal is not a fault", n)
	}
}

// The calls of a refused shared exchange go again alone, each checked against its deadline
// before it goes: none starts after it.
func TestACallSentAgainAloneAfterARefusalStillEndsAtItsDeadline(t *testing.T) {
	b := newBatching(t)
	hold := make(chan struct{})
	b.mu.Lock()
	b.holdAt, b.holdGate = []int{11}, hold // the first call sent again alone takes its time
	b.mu.Unlock()
	held, waiting := b.hold(b.clk.Now().Add(time.Second), 11, refusedLength, 14)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	eventually(t, "the first call goes again alone", func() bool {
		got := b.recorded()
		return len(got) == 3 && slices.Equal(got[2], []int{11})
	})
	b.clk.Step(time.Second)
	for i, c := range waiting {
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.DeadlineExceeded {
			t.Fatalf("call %d got %v at its deadline, want deadline_exceeded", i, o.err)
		}
	}
	close(hold)
	eventually(t, "every call let go", func() bool { return b.srv.Inflight("a") == 0 && b.waiting() == 0 })
	if got, want := b.recorded(), [][]int{{10}, {11, refusedLength, 14}, {11}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want none sent again after its deadline", got)
	}
}

// Calls that wait for a shape whose exchange faults are answered engine_crashed without being
// sent to the broken worker.
func TestCallsWaitingBehindAFaultedExchangeAreNotSentToTheBrokenWorker(t *testing.T) {
	b := newBatching(t)
	hold := make(chan struct{})
	b.mu.Lock()
	b.faultShared = true
	b.holdAt, b.holdGate = []int{11, 12}, hold
	b.mu.Unlock()
	held, waiting := b.hold(time.Time{}, 11, 12)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	eventually(t, "the shared exchange runs", func() bool { return len(b.recorded()) == 2 })
	behind := []<-chan outcome{b.call("a", 14, time.Time{}), b.call("a", 15, time.Time{})}
	eventually(t, "two calls wait behind it", func() bool { return b.waiting() == 2 })
	close(hold)
	for i, c := range append(waiting, behind...) {
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.EngineCrashed {
			t.Fatalf("call %d got %v, want engine_crashed", i, o.err)
		}
	}
	if got, want := b.recorded(), [][]int{{10}, {11, 12}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want nothing sent after the fault", got)
	}
	if o := b.settle(b.call("a", 10, time.Time{}), 2*time.Second); o.err != nil || o.res.Generations[0] != 2 {
		t.Fatalf("after the fault: %+v, want the replacement to serve", o)
	}
	if n := b.sp.Spawned("a"); n != 2 {
		t.Fatalf("%d workers spawned, want the faulted one replaced once", n)
	}
}

// When the first of a refused exchange's calls, sent again alone, faults the worker, the
// others are answered engine_crashed without being sent to it, and none is left waiting.
func TestCallsToBeSentAgainAfterARefusalAreNotSentToAWorkerThatFaultedMeanwhile(t *testing.T) {
	b := newBatching(t)
	b.mu.Lock()
	b.faultAt = []int{11}
	b.mu.Unlock()
	held, waiting := b.hold(time.Time{}, 11, refusedLength, 14)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, c := range waiting {
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.EngineCrashed {
			t.Fatalf("call %d got %v, want engine_crashed", i, o.err)
		}
	}
	if got, want := b.recorded(), [][]int{{10}, {11, refusedLength, 14}, {11}}; !slices.EqualFunc(got, want, slices.Equal) {
		t.Fatalf("exchanges carried %v, want nothing sent to the faulted worker", got)
	}
	eventually(t, "every call let go", func() bool { return b.srv.Inflight("a") == 0 && b.waiting() == 0 })
}

// A burst of calls on one shape while its exchange runs: each is answered once, with its own
// input's vector, no sequence is sent twice, and no exchange carries more than the lane's bound.
func TestABurstOfCallsOnOneShapeIsAnsweredOnceEachWithinTheBoundOnOneExchange(t *testing.T) {
	const bound = 8
	b := newBatching(t, func(_ *supervisor.ModelSpec, ln *Lane) { ln.MaxExchangeSequences = bound })
	var lengths []int
	for n := 14; len(lengths) < 50; n++ {
		lengths = append(lengths, n)
	}
	held, waiting := b.hold(time.Time{}, lengths...)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, n := range lengths {
		wantOwnVector(t, waitAnswer(t, waiting[i]), n)
	}
	sent := map[int]int{}
	for _, ex := range b.recorded() {
		if len(ex) > bound {
			t.Fatalf("an exchange carried %d sequences, over the lane's bound of %d", len(ex), bound)
		}
		for _, n := range ex {
			sent[n]++
		}
	}
	for _, n := range append([]int{10}, lengths...) {
		if sent[n] != 1 {
			t.Fatalf("the call of %d tokens was sent %d times, want once", n, sent[n])
		}
	}
	if got, want := len(b.recorded()), 1+(len(lengths)+bound-1)/bound; got != want {
		t.Fatalf("%d exchanges, want %d: the held call's, then the waiting calls %d at a time", got, want, bound)
	}
	eventually(t, "every call let go", func() bool { return b.srv.Inflight("a") == 0 && b.waiting() == 0 })
}

// A shared exchange's malformed reply (a vector short) is a fault: no call of it gets a
// vector, not even those the reply seems to hold, and the worker is replaced once.
func TestAMalformedReplyToASharedExchangeFailsEveryCallOfItAndRecoversTheWorkerOnce(t *testing.T) {
	b := newBatching(t)
	b.mu.Lock()
	b.malformShared = true
	b.mu.Unlock()
	held, waiting := b.hold(time.Time{}, 11, 12, 14)
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, c := range waiting {
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.EngineCrashed || o.res != nil {
			t.Fatalf("call %d got %+v, want engine_crashed and no vector", i, o)
		}
	}
	if o := b.settle(b.call("a", 10, time.Time{}), 2*time.Second); o.err != nil || o.res.Generations[0] != 2 {
		t.Fatalf("after the malformed reply: %+v, want the replacement to serve", o)
	}
	if n := b.sp.Spawned("a"); n != 2 {
		t.Fatalf("%d workers spawned, want the faulted one replaced once", n)
	}
}

// The lane retired while calls wait for the next exchange of its shape: they hold their leases,
// so the retirement drains them; each is answered once with its own vector before the worker
// is closed, and the retirement ends.
func TestRetiringALaneWhileCallsWaitForTheNextExchangeDrainsThem(t *testing.T) {
	b := newBatching(t)
	held, waiting := b.hold(time.Time{}, 11, 12, 14)
	retired := make(chan error, 1)
	go func() { retired <- b.sup.Retire(context.Background(), "a") }()
	eventually(t, "the retirement began", func() bool { snap, _ := b.sup.Snapshot("a"); return snap.Retiring })
	if slices.Contains(b.w.Calls(), "close") {
		t.Fatal("the worker was closed under calls that hold leases")
	}
	close(b.gate)
	wantOwnVector(t, waitAnswer(t, held), 10)
	for i, n := range []int{11, 12, 14} {
		wantOwnVector(t, waitAnswer(t, waiting[i]), n)
	}
	eventually(t, "the drained worker was closed", func() bool { return slices.Contains(b.w.Calls(), "close") })
	b.w.Exit()
	select {
	case err := <-retired:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the retirement never ended")
	}
}
