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
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// judged records the placement probes the supervisor asks a lane's judge about.
type judged struct {
	sync.Mutex
	rungs  []int
	reject map[int]bool
}

func (j *judged) judge(rung int, gen int64, device, cpu time.Duration) error {
	j.Lock()
	defer j.Unlock()
	j.rungs = append(j.rungs, rung)
	if j.reject[rung] {
		return errors.New("ratio over the limit")
	}
	return nil
}

func (j *judged) seen() []int {
	j.Lock()
	defer j.Unlock()
	return slices.Clone(j.rungs)
}

func TestNoRequestRunsOnALoadedShapeBeforeItsPlacementProbePasses(t *testing.T) {
	h := newHarness(t, 100)
	j := &judged{}
	h.load("a", func(s *ModelSpec) { s.Probe = j.judge })
	for _, rung := range []int{128, 256} {
		c := h.acquire("a", rung)
		h.admitWaiting()
		a := h.got(c)
		if a.err != nil {
			t.Fatal(a.err)
		}
		if _, err := a.lease.Exchange(h.ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
		a.lease.Release()
	}
	// Resident and probed: a second request per rung is leased without probing again.
	for _, rung := range []int{128, 256} {
		l, err := h.s.Acquire(h.ctx, "a", rung, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
	}
	want := []string{"admit 128", "probe 128", "exchange 128", "admit 256", "probe 256", "exchange 256"}
	if calls := h.spawner.Get(t, "a", 1).Calls(); !slices.Equal(calls, want) {
		t.Fatalf("worker calls %v, want %v: every loaded shape is probed once, before its first request", calls, want)
	}
	if got := j.seen(); !slices.Equal(got, []int{128, 256}) {
		t.Fatalf("judged rungs %v", got)
	}
}

func TestAShapeWhosePlacementProbeFailsServesNoRequest(t *testing.T) {
	h := newHarness(t, 100)
	j := &judged{reject: map[int]bool{256: true}}
	h.load("a", func(s *ModelSpec) { s.Probe = j.judge })
	c := h.acquire("a", 256)
	h.admitWaiting()
	a := h.got(c)
	if refusal.CodeOf(a.err) != refusal.ComputeUnitMismatch || a.lease != nil {
		t.Fatalf("first request: %v, want compute_unit_mismatch and no lease", a.err)
	}
	// The verdict stands for the shape's load: later requests fail at once, unprobed again.
	for range 3 {
		if _, err := h.s.Acquire(h.ctx, "a", 256, time.Time{}); refusal.CodeOf(err) != refusal.ComputeUnitMismatch {
			t.Fatalf("later request: %v, want compute_unit_mismatch", err)
		}
	}
	// Another rung of the lane, whose probe passes, serves.
	c = h.acquire("a", 128)
	h.admitWaiting()
	if a := h.got(c); a.err != nil {
		t.Fatal(a.err)
	} else {
		a.lease.Release()
	}
	want := []string{"admit 256", "probe 256", "admit 128", "probe 128"}
	if calls := h.spawner.Get(t, "a", 1).Calls(); !slices.Equal(calls, want) {
		t.Fatalf("worker calls %v, want %v: nothing runs on the rejected shape", calls, want)
	}
	// The refused leases were given back: nothing holds the rejected shape.
	eventually(t, "every lease is released", h.state(func(i residency.Inspection) bool { return leases(i, "a") == 0 }))
}

func TestConcurrentRequestsOnAnUnprobedShapeWaitForOneProbe(t *testing.T) {
	h := newHarness(t, 100)
	j := &judged{}
	h.load("a", func(s *ModelSpec) { s.Probe = j.judge })
	w := h.spawner.Get(t, "a", 1)
	hold := make(chan struct{})
	w.Lock()
	w.ProbeGate = hold
	w.Unlock()

	first := h.acquire("a", 128)
	h.admitWaiting()
	eventually(t, "the first request probes", func() bool { return slices.Contains(w.Calls(), "probe 128") })
	second := h.acquire("a", 128)
	eventually(t, "the second request waits for the probe", h.state(func(i residency.Inspection) bool {
		sh, _ := i.Shape("a", 128)
		return i.Models["a"].ProbeWaiters == 2 && sh.Leases == 1 // the probe's own lease; both requests wait
	}))
	if !pending(first) || !pending(second) {
		t.Fatal("a request was answered before the shape's probe ended")
	}
	close(hold)
	for _, c := range []<-chan acquired{first, second} {
		a := h.got(c)
		if a.err != nil {
			t.Fatal(a.err)
		}
		a.lease.Release()
	}
	if calls := w.Calls(); !slices.Equal(calls, []string{"admit 128", "probe 128"}) {
		t.Fatalf("worker calls %v, want one probe for both requests", calls)
	}
}

func TestARequestThatGivesUpDoesNotAbandonTheProbe(t *testing.T) {
	h := newHarness(t, 100)
	j := &judged{}
	h.load("a", func(s *ModelSpec) { s.Probe = j.judge })
	w := h.spawner.Get(t, "a", 1)
	hold := make(chan struct{})
	w.Lock()
	w.ProbeGate = hold
	w.Unlock()

	ctx, cancel := context.WithCancel(h.ctx)
	out := make(chan error, 1)
	go func() {
		_, err := h.s.Acquire(ctx, "a", 128, time.Time{})
		out <- err
	}()
	h.admitWaiting()
	eventually(t, "the probe runs", func() bool { return slices.Contains(w.Calls(), "probe 128") })
	cancel()
	if err := <-out; err == nil {
		t.Fatal("a request that gave up was granted")
	}
	// The probe goes on without it, holding the shape, and its verdict stands.
	close(hold)
	eventually(t, "the probe passed", h.state(func(i residency.Inspection) bool { sh, _ := i.Shape("a", 128); return sh.Probed }))
	l, err := h.s.Acquire(h.ctx, "a", 128, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	if calls := w.Calls(); !slices.Equal(calls, []string{"admit 128", "probe 128"}) {
		t.Fatalf("worker calls %v, want one probe", calls)
	}
	eventually(t, "every lease is released", h.state(func(i residency.Inspection) bool { return leases(i, "a") == 0 }))
}

func TestAProbeWhoseWorkerFaultsFailsItsRequestsAndTheReplacementProbesAfresh(t *testing.T) {
	h := newHarness(t, 100)
	j := &judged{}
	h.load("a", func(s *ModelSpec) { s.Probe = j.judge })
	w := h.spawner.Get(t, "a", 1)
	w.Lock()
	w.NextProbeErr = fakeworker.ErrBrokenPipe
	w.Unlock()
	c := h.acquire("a", 128)
	h.admitWaiting()
	if a := h.got(c); refusal.CodeOf(a.err) != refusal.EngineCrashed {
		t.Fatalf("a request whose probe faulted: %v, want engine_crashed", a.err)
	}
	eventually(t, "generation 2 runs", h.state(func(i residency.Inspection) bool { return i.Models["a"].Gen == 2 && i.Models["a"].State == "running" }))
	c = h.acquire("a", 128)
	h.admitWaiting()
	a := h.got(c)
	if a.err != nil || a.lease.Generation() != 2 {
		t.Fatalf("after recovery: %v", a.err)
	}
	a.lease.Release()
	if calls := h.spawner.Get(t, "a", 2).Calls(); !slices.Equal(calls, []string{"admit 128", "probe 128"}) {
		t.Fatalf("the replacement's calls %v, want its own probe", calls)
	}
	if got := j.seen(); !slices.Equal(got, []int{128}) {
		t.Fatalf("judged %v: the faulted probe measured nothing to judge", got)
	}
}
