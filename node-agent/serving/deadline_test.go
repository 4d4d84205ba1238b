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
	"slices"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// TestEveryWaitEndsAtTheRequestsAbsoluteDeadline: a call's absolute deadline ends its wait
// wherever it waits — behind a starved budget head, on a placement probe, for an execution
// permit, for the next exchange of its shape, in an exchange the worker does not answer — and
// not a moment before.
func TestEveryWaitEndsAtTheRequestsAbsoluteDeadline(t *testing.T) {
	const wait = 5 * time.Second
	// expire checks that c waits until its deadline, left after the time already passed, then
	// is answered deadline_exceeded.
	expire := func(t *testing.T, l *live, c <-chan outcome, what string, left time.Duration) {
		t.Helper()
		eventually(t, "the call waits "+what, func() bool { return l.clk.HasWaiters() && len(c) == 0 })
		l.clk.Step(left - time.Millisecond)
		select {
		case o := <-c:
			t.Fatalf("answered %v before its deadline", o.err)
		default:
		}
		l.clk.Step(time.Millisecond)
		if o := waitAnswer(t, c); refusal.CodeOf(o.err) != refusal.DeadlineExceeded {
			t.Fatalf("waiting %s, the call got %v, want deadline_exceeded at its deadline", what, o.err)
		}
	}

	t.Run("behind a starved budget head", func(t *testing.T) {
		l := newLive(t, 22) // one shape fits
		// A call holds a/128 in its exchange; b's cold admission cannot get budget: a starved head.
		w, gate := l.gated()
		l.lane("b")
		holding := l.call("a", 10, time.Time{})
		eventually(t, "the exchange holds a/128", func() bool { return w.Exchanging() == 1 })
		head := l.call("b", 10, time.Time{})
		eventually(t, "b's admission is queued", func() bool { return l.sup.Node().QueueLength == 1 })
		l.step(50 * time.Millisecond) // past the start hold: the head is elected, and starved
		// A call for the resident a/128 yields to the starved head, until its deadline.
		behind := l.call("a", 10, l.clk.Now().Add(wait))
		expire(t, l, behind, "behind the starved head", wait)
		close(gate)
		if o := waitAnswer(t, holding); o.err != nil {
			t.Fatal(o.err)
		}
		if o := l.settle(head, time.Second); o.err != nil {
			t.Fatal(o.err)
		}
	})

	t.Run("on a placement probe", func(t *testing.T) {
		l := newLive(t, 100)
		l.sp.ReportCached([]int{128}) // a load from aned's cache: predicted ready well before the deadline
		l.lane("a", func(s *supervisor.ModelSpec, _ *Lane) {
			s.Probe = func(int, int64, time.Duration, time.Duration) error { return nil }
		})
		gate := make(chan struct{})
		defer close(gate)
		w := l.sp.Get(t, "a", 1)
		w.Lock()
		w.ProbeGate = gate // the probe never finishes
		w.Unlock()
		c := l.call("a", 10, l.clk.Now().Add(wait))
		eventually(t, "the admission is queued", func() bool { return l.sup.Node().QueueLength == 1 })
		l.step(50 * time.Millisecond) // the admission starts after its start hold
		eventually(t, "the probe runs", func() bool {
			calls := w.Calls()
			return len(calls) == 2 && calls[1] == "probe 128"
		})
		expire(t, l, c, "on the probe", wait-50*time.Millisecond)
	})

	t.Run("for an execution permit", func(t *testing.T) {
		l := newLive(t, 100)
		w, gate := l.gated(func(_ *supervisor.ModelSpec, ln *Lane) { ln.MaxInflight = 1 })
		holding := l.call("a", 10, time.Time{})
		eventually(t, "the call holds the lane's one permit", func() bool { return w.Exchanging() == 1 })
		c := l.call("a", 10, l.clk.Now().Add(wait))
		expire(t, l, c, "for the permit", wait)
		close(gate)
		if o := waitAnswer(t, holding); o.err != nil {
			t.Fatal(o.err)
		}
	})

	t.Run("for the next exchange of its shape", func(t *testing.T) {
		l := newLive(t, 100)
		w, gate := l.gated()
		holding := l.call("a", 10, time.Time{})
		eventually(t, "the call's exchange runs", func() bool { return w.Exchanging() == 1 })
		c := l.call("a", 11, l.clk.Now().Add(wait))
		expire(t, l, c, "for the next exchange", wait)
		close(gate)
		if o := waitAnswer(t, holding); o.err != nil {
			t.Fatal(o.err)
		}
		eventually(t, "the call let go unsent", func() bool { return l.srv.Inflight("a") == 0 })
		if n := len(slices.DeleteFunc(w.Calls(), func(c string) bool { return c != "exchange 128" })); n != 2 {
			t.Fatalf("%d exchanges, want the warm-up's and the holding call's only", n)
		}
	})

	t.Run("in an exchange the worker does not answer", func(t *testing.T) {
		l := newLive(t, 100)
		w, gate := l.gated() // the worker hangs until the gate opens
		c := l.call("a", 10, l.clk.Now().Add(wait))
		eventually(t, "the exchange runs", func() bool { return w.Exchanging() == 1 })
		expire(t, l, c, "in the exchange", wait)
		// The caller is answered; the call still owns its lease and permit until the reply
		// drains, and the healthy worker is not restarted for it.
		if n := l.srv.Inflight("a"); n != 1 {
			t.Fatalf("inflight %d after the caller was answered, want the exchange still owned", n)
		}
		close(gate)
		eventually(t, "the call let go once its reply drained", func() bool { return l.srv.Inflight("a") == 0 })
		if n := l.sp.Spawned("a"); n != 1 {
			t.Fatalf("%d workers spawned: the drained worker was restarted", n)
		}
		if o := l.settle(l.call("a", 10, time.Time{}), time.Second); o.err != nil {
			t.Fatalf("the shape is not leased free again: %v", o.err)
		}
	})
}
