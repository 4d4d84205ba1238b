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
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// A call whose group would pass the per-exchange cap or, with wide vectors, the frame limit in
// its reply is split into exchanges that fit, one lease at a time, in rung order, and its
// answers come back in input order.
func TestACallIsSplitIntoExchangesThatFitTheFrameLimit(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	const dims = 4096 // 16 KiB a vector: 1500 of them are 24 MiB, past the 16 MiB frame
	a := &fakeAcquirer{clk: clk}
	var sizes []int
	var counts []int
	a.reply = func(e *pb.Execute) *pb.Reply {
		r := &pb.Reply{}
		for _, s := range e.Sequences {
			r.Vectors = append(r.Vectors, &pb.Vector{Values: worker.Embed("gte", dims, s.TokenIds)})
		}
		b, _ := proto.Marshal(r)
		sizes, counts = append(sizes, len(b)), append(counts, len(e.Sequences))
		return r
	}
	s := New(a, clk)
	s.AddLane(Lane{Name: "wide", Task: "embed", Rungs: []int{128, 512}, Ceiling: 512, Dimensions: dims, MaxExchangeSequences: 1000})
	var inputs [][]uint32
	for i := range 1500 {
		inputs = append(inputs, tokens(1+i%200)) // both rungs
	}
	res, err := s.Run(context.Background(), "wide", "embed", inputs, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range sizes {
		if n > protocol.DefaultMaxFrame {
			t.Fatalf("an exchange's reply is %d bytes, over the frame limit: %v", n, sizes)
		}
	}
	if len(sizes) < 3 || !slices.IsSorted(res.Buckets) || a.maxHeld != 1 {
		t.Fatalf("%d exchanges on buckets %v, %d leases at once", len(sizes), res.Buckets, a.maxHeld)
	}
	for i, in := range inputs {
		if !slices.Equal(res.Vectors[i], worker.Embed("gte", dims, in)) {
			t.Fatalf("output %d is not input %d's embedding", i, i)
		}
	}

	// The per-exchange cap splits narrow calls too.
	sizes, counts = nil, nil
	s.AddLane(Lane{Name: "capped", Task: "embed", Rungs: []int{128}, Ceiling: 128, Dimensions: 8, MaxExchangeSequences: 3})
	a.reply = nil
	res, err = s.Run(context.Background(), "capped", "embed", inputs[:7], time.Time{})
	if err != nil || !slices.Equal(res.Buckets, []int{128, 128, 128}) {
		t.Fatalf("%v %v: want three exchanges of 3, 3 and 1", res, err)
	}
}

// A call whose requests would pass the frame limit (long sequences of the widest token ids, five
// bytes each on the wire) is split too, on the request's size: every exchange's request fits
// the frame, each sequence is sent once, in order, and the scores come back in input order.
func TestACallIsSplitIntoExchangesWhoseRequestsFitTheFrameLimit(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	a := &fakeAcquirer{clk: clk}
	var sizes, counts []int
	var sent [][]uint32
	a.reply = func(e *pb.Execute) *pb.Reply {
		sizes, counts = append(sizes, proto.Size(e)), append(counts, len(e.Sequences))
		r := &pb.Reply{}
		for _, seq := range e.Sequences {
			sent = append(sent, seq.TokenIds)
			r.Scores = append(r.Scores, float32(seq.TokenIds[0]))
		}
		return r
	}
	s := New(a, clk)
	s.AddLane(Lane{Name: "long", Task: "rerank", Rungs: []int{8192}, Ceiling: 8192, Dimensions: 8, MaxExchangeSequences: 1000})
	const n = 600 // 600 x 8192 ids x 5 bytes: about 24 MiB of requests
	inputs := make([][]uint32, n)
	for i := range inputs {
		seq := make([]uint32, 8192)
		for j := range seq {
			seq[j] = math.MaxUint32 - uint32(j)
		}
		seq[0] = uint32(i)
		inputs[i] = seq
	}
	res, err := s.Run(context.Background(), "long", "rerank", inputs, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for i, size := range sizes {
		if size > protocol.DefaultMaxFrame {
			t.Fatalf("exchange %d's request is %d bytes, over the frame limit: %v", i, size, sizes)
		}
		total += counts[i]
	}
	if len(sizes) < 2 || total != n || a.maxHeld != 1 {
		t.Fatalf("%d exchanges of %v sequences (%d in all, want %d), %d leases at once; want the call split", len(sizes), counts, total, n, a.maxHeld)
	}
	for i := range inputs {
		if sent[i][0] != uint32(i) || res.Scores[i] != float32(i) {
			t.Fatalf("sequence %d was sent as %d and scored %v: out of order", i, sent[i][0], res.Scores[i])
		}
	}
}

// Past the lane's running and waiting bounds a call is refused overloaded at once, with a time
// to retry; a call that waits gets the permit a finished one gives back.
func TestPastItsBoundsALaneAnswersOverloadedAtOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	a := &fakeAcquirer{clk: clk, gate: make(chan struct{})}
	s := New(a, clk)
	s.AddLane(Lane{Name: "gte", Task: "embed", Rungs: []int{128}, Ceiling: 128, Dimensions: 8, MaxInflight: 1, MaxQueued: 1})
	run := func() chan error {
		done := make(chan error, 1)
		go func() {
			_, err := s.Run(context.Background(), "gte", "embed", [][]uint32{tokens(3)}, time.Time{})
			done <- err
		}()
		return done
	}
	running := run()
	eventually(t, "the first call is in its exchange", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.exchanges == 1 })
	waiting := run()
	eventually(t, "the second call waits", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.lanes["gte"].waiting == 1 })
	_, err := s.Run(context.Background(), "gte", "embed", [][]uint32{tokens(3)}, time.Time{})
	var r *refusal.Error
	if !errors.As(err, &r) || r.Code != refusal.Overloaded || r.RetryAfter <= 0 {
		t.Fatalf("the third call: %v, want overloaded with a retry time", err)
	}
	close(a.gate)
	if err := <-running; err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatal(err)
	}

	// With no queue, a call that finds every permit taken is refused at once.
	s.AddLane(Lane{Name: "noqueue", Task: "embed", Rungs: []int{128}, Ceiling: 128, Dimensions: 8, MaxInflight: 1, MaxQueued: -1})
	a.gate = make(chan struct{})
	held := make(chan error, 1)
	go func() {
		_, err := s.Run(context.Background(), "noqueue", "embed", [][]uint32{tokens(3)}, time.Time{})
		held <- err
	}()
	eventually(t, "the call is in its exchange", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.exchanges == 3 })
	if _, err := s.Run(context.Background(), "noqueue", "embed", [][]uint32{tokens(3)}, time.Time{}); refusal.CodeOf(err) != refusal.Overloaded {
		t.Fatalf("%v, want overloaded", err)
	}
	close(a.gate)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
}

// TestACallThatWouldWaitPastItsDeadlineIsRefusedOverloadedAtOnce: a call that would get its
// permit, and then run, only after its deadline (by how long the lane's calls hold a permit) is
// refused overloaded at once with a time to retry, instead of waiting to be answered
// deadline_exceeded; a call with time enough waits and is served.
func TestACallThatWouldWaitPastItsDeadlineIsRefusedOverloadedAtOnce(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	a := &fakeAcquirer{clk: clk, exchangeDelay: time.Second}
	s := New(a, clk)
	s.AddLane(Lane{Name: "gte", Task: "embed", Rungs: []int{128}, Ceiling: 128, Dimensions: 8, MaxInflight: 1, MaxQueued: 4})
	// A call that holds its permit a second teaches the lane how long calls take.
	if _, err := s.Run(context.Background(), "gte", "embed", [][]uint32{tokens(3)}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	a.gate, a.exchangeDelay = make(chan struct{}), time.Second
	a.mu.Unlock()
	running := make(chan error, 1)
	go func() {
		_, err := s.Run(context.Background(), "gte", "embed", [][]uint32{tokens(3)}, time.Time{})
		running <- err
	}()
	eventually(t, "the second call is in its exchange", func() bool { a.mu.Lock(); defer a.mu.Unlock(); return a.exchanges == 2 })

	// It would wait about a second and run about a second: 1.5 s is not enough.
	_, err := s.Run(context.Background(), "gte", "embed", [][]uint32{tokens(3)}, clk.Now().Add(1500*time.Millisecond))
	var r *refusal.Error
	if !errors.As(err, &r) || r.Code != refusal.Overloaded || r.RetryAfter < time.Second {
		t.Fatalf("a call that cannot finish by its deadline: %v, want overloaded at once with a retry time of at least the wait", err)
	}
	// Three seconds are: it waits and is served.
	waiting := make(chan error, 1)
	go func() {
		_, err := s.Run(context.Background(), "gte", "embed", [][]uint32{tokens(3)}, clk.Now().Add(3*time.Second))
		waiting <- err
	}()
	eventually(t, "the call with time enough waits", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.lanes["gte"].waiting == 1 })
	a.mu.Lock()
	a.exchangeDelay = 0
	a.mu.Unlock()
	close(a.gate)
	if err := <-running; err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("the call with time enough: %v", err)
	}
}
