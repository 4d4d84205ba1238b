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
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

func TestAResidentShapeIsLeasedOnTheFastPath(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	first := h.acquire("a", 128)
	h.admitWaiting()
	a := h.got(first)
	if a.err != nil {
		t.Fatal(a.err)
	}
	a.lease.Release()

	// Resident now: the lease is granted without the scheduler and without an admission.
	l, err := h.s.Acquire(h.ctx, "a", 128, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	reply, err := l.Exchange(context.Background(), []byte("x"))
	l.Release()
	if err != nil || string(reply) != "a/128:x" {
		t.Fatalf("exchange: %q, %v", reply, err)
	}
	if calls := h.spawner.Get(t, "a", 1).Calls(); !slices.Equal(calls, []string{"admit 128", "exchange 128"}) {
		t.Fatalf("worker calls %v", calls)
	}
}

func TestIdenticalModelsInDistinctWorkersEachAdmitTheirOwnShape(t *testing.T) {
	h := newHarness(t, 100)
	// Two lanes of the same certified model: the same package identity, two workers.
	h.load("a")
	h.load("b")
	ra := h.acquire("a", 128)
	h.admitWaiting()
	la := h.got(ra)
	rb := h.acquire("b", 128)
	h.admitWaiting()
	lb := h.got(rb)
	if la.err != nil || lb.err != nil {
		t.Fatalf("a: %v, b: %v", la.err, lb.err)
	}
	// Each worker admitted the shape itself, and each reservation is charged to its owner.
	for _, lane := range []string{"a", "b"} {
		if calls := h.spawner.Get(t, lane, 1).Calls(); !slices.Equal(calls, []string{"admit 128"}) {
			t.Errorf("worker %s calls %v, want its own admission", lane, calls)
		}
	}
	if used := h.s.Used(); used != 44 {
		t.Fatalf("charged %d executables, want 22 for each worker's shape", used)
	}
	if la.lease.c == lb.lease.c || la.lease.c.Gen == lb.lease.c.Gen || streamOf(la.lease.c.Gen) == streamOf(lb.lease.c.Gen) {
		t.Fatal("the two requests lease the same worker's shape")
	}
	la.lease.Release()
	lb.lease.Release()

	// Retiring one refunds only its own reservation.
	if err := h.s.Retire(h.ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if used := h.s.Used(); used != 22 {
		t.Fatalf("charged %d after retiring a, want b's 22", used)
	}
	if l, err := h.s.Acquire(h.ctx, "b", 128, time.Time{}); err != nil {
		t.Fatalf("b lost its shape: %v", err)
	} else {
		l.Release()
	}
	if _, err := h.s.Acquire(h.ctx, "a", 128, time.Time{}); refusal.CodeOf(err) != refusal.LaneRetired && refusal.CodeOf(err) != refusal.UnknownLane {
		t.Fatalf("a after retirement: %v", err)
	}
}
