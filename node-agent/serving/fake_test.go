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
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	clocktesting "k8s.io/utils/clock/testing"

	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// fakeAcquirer hands out leases on a fake clock and records what happened to them.
type fakeAcquirer struct {
	clk *clocktesting.FakeClock

	mu        sync.Mutex
	acquired  []int // rungs, in order
	held      int   // leases held now
	maxHeld   int
	released  int
	faults    []error
	exchanges int
	// admitDelay is stepped on the clock inside Acquire: a cold admission.
	admitDelay time.Duration
	// gate, when set, holds every exchange until closed; exchangeDelay is stepped on the
	// clock inside it: a slow reply.
	gate          chan struct{}
	exchangeDelay time.Duration
	exchangeCtxs  []context.Context
	// reply, when set, replaces the worker's answer (to inject malformed replies).
	reply func(e *pb.Execute) *pb.Reply
}

type fakeLease struct {
	a    *fakeAcquirer
	rung int
}

func (a *fakeAcquirer) Acquire(ctx context.Context, lane string, rung int, deadline time.Time) (Lease, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.admitDelay > 0 {
		a.clk.Step(a.admitDelay)
	}
	a.acquired = append(a.acquired, rung)
	a.held++
	a.maxHeld = max(a.maxHeld, a.held)
	return &fakeLease{a: a, rung: rung}, nil
}

func (l *fakeLease) Exchange(ctx context.Context, payload []byte) ([]byte, error) {
	a := l.a
	a.mu.Lock()
	a.exchanges++
	a.exchangeCtxs = append(a.exchangeCtxs, ctx)
	gate, delay, replyFn := a.gate, a.exchangeDelay, a.reply
	a.mu.Unlock()
	if gate != nil {
		<-gate
	}
	if delay > 0 {
		a.clk.Step(delay)
	}
	e := &pb.Execute{}
	if err := proto.Unmarshal(payload, e); err != nil {
		return nil, err
	}
	reply := &pb.Reply{}
	if replyFn != nil {
		reply = replyFn(e)
	} else {
		for _, s := range e.Sequences {
			if e.Task == "embed" {
				reply.Vectors = append(reply.Vectors, &pb.Vector{Values: worker.Embed("gte", 8, s.TokenIds)})
			} else {
				reply.Scores = append(reply.Scores, float32(len(s.TokenIds)))
			}
		}
	}
	return proto.Marshal(reply)
}

func (l *fakeLease) Fault(err error) {
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	l.a.faults = append(l.a.faults, err)
}

func (l *fakeLease) Release() {
	l.a.mu.Lock()
	defer l.a.mu.Unlock()
	l.a.held--
	l.a.released++
}

func (l *fakeLease) Rung() int         { return l.rung }
func (l *fakeLease) Generation() int64 { return 1 }

func (a *fakeAcquirer) snapshot() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.snapshotLocked()
}

func (a *fakeAcquirer) snapshotLocked() string {
	return fmt.Sprintf("acquired=%v held=%d max=%d released=%d exchanges=%d faults=%v", a.acquired, a.held, a.maxHeld, a.released, a.exchanges, a.faults)
}
