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
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// live is the serving path over the real supervisor, whose workers are fakes on a fake clock
// that answer with the sim model's embeddings.
type live struct {
	t   *testing.T
	clk *clocktesting.FakeClock
	sp  *fakeworker.Spawner
	sup *supervisor.Supervisor
	srv *Server
	ctx context.Context
}

func newLive(t *testing.T, budget int) *live { return newTracedLive(t, budget, nil) }

// newTracedLive is newLive whose supervisor passes its timeline events to trace.
func newTracedLive(t *testing.T, budget int, trace func(supervisor.Event)) *live {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	sp := fakeworker.New(clk)
	sp.Progress = supervisor.ReportProgress
	sp.Configure = func(w *fakeworker.Worker) { w.Reply = embedReply(w.Lane) }
	sup := supervisor.New(supervisor.Config{Clock: clk, Spawner: sp, Log: testr.New(t), Budget: budget, Trace: trace})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sup.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &live{t: t, clk: clk, sp: sp, sup: sup, srv: New(Supervised(sup), clk), ctx: ctx}
}

// embedReply answers an Execute with the sim model's embeddings of its sequences.
func embedReply(identity string) func(int, []byte) ([]byte, error) {
	return func(_ int, payload []byte) ([]byte, error) {
		e := &pb.Execute{}
		if err := proto.Unmarshal(payload, e); err != nil {
			return nil, err
		}
		reply := &pb.Reply{}
		for _, s := range e.Sequences {
			reply.Vectors = append(reply.Vectors, &pb.Vector{Values: worker.Embed(identity, 8, s.TokenIds)})
		}
		return proto.Marshal(reply)
	}
}

// lane loads a lane of 22-layer shapes and serves it.
func (l *live) lane(name string, opts ...func(*supervisor.ModelSpec, *Lane)) {
	l.t.Helper()
	spec := supervisor.ModelSpec{Lane: name, Identity: name, Layers: 22, Rungs: []int{128, 256, 512}, MaxResidentShapes: 3,
		AdmissionBound: 600 * time.Second}
	lane := Lane{Name: name, Task: "embed", Rungs: spec.Rungs, Ceiling: 512, Dimensions: 8}
	for _, o := range opts {
		o(&spec, &lane)
	}
	if err := l.sup.LoadModel(l.ctx, spec); err != nil {
		l.t.Fatal(err)
	}
	l.srv.AddLane(lane)
}

// gated serves lane a, answers a first call on it (its 128-token shape resident), and returns
// its worker, whose exchanges then wait at the returned gate until the test closes it.
func (l *live) gated(opts ...func(*supervisor.ModelSpec, *Lane)) (*fakeworker.Worker, chan struct{}) {
	l.t.Helper()
	l.lane("a", opts...)
	if o := l.settle(l.call("a", 10, time.Time{}), time.Second); o.err != nil {
		l.t.Fatal(o.err)
	}
	gate := make(chan struct{})
	w := l.sp.Get(l.t, "a", 1)
	w.Lock()
	w.ExchangeGate = gate
	w.Unlock()
	return w, gate
}

type outcome struct {
	res *Result
	err error
}

// call starts a call in the background; its request id is "call-<tokens>".
func (l *live) call(lane string, tokens int, deadline time.Time) <-chan outcome {
	out := make(chan outcome, 1)
	go func() {
		ctx := residency.WithRequestID(l.ctx, fmt.Sprintf("call-%d", tokens))
		res, err := l.srv.Run(ctx, lane, "embed", [][]uint32{tokensOf(tokens)}, deadline)
		out <- outcome{res, err}
	}()
	return out
}

func tokensOf(n int) []uint32 { return tokens(n) }

// step advances the fake clock by d once something waits on it.
func (l *live) step(d time.Duration) {
	l.t.Helper()
	eventually(l.t, "something waits on the clock", l.clk.HasWaiters)
	l.clk.Step(d)
}

// settle advances the clock in small steps until c has an answer (an admission's start hold,
// a compile's time), failing after limit of fake time or 10 s of real time.
func (l *live) settle(c <-chan outcome, limit time.Duration) outcome {
	l.t.Helper()
	var passed time.Duration
	var got outcome
	eventually(l.t, "the call is answered", func() bool {
		select {
		case got = <-c:
			return true
		default:
		}
		if passed > limit {
			l.t.Fatalf("no answer within %s of fake time", limit)
		}
		if l.clk.HasWaiters() {
			l.clk.Step(10 * time.Millisecond)
			passed += 10 * time.Millisecond
		}
		return false
	})
	return got
}

func waitAnswer(t *testing.T, c <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-c:
		return o
	case <-time.After(10 * time.Second):
		t.Fatal("the call was never answered")
		return outcome{}
	}
}
