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
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// driver steps a core by hand and plays its world: each test chooses exactly which outcome
// arrives when, and in which order. Every step is followed by the core's invariant check.
type driver struct {
	t       *testing.T
	c       *Core
	now     time.Time
	fx      []Effect
	tickets Ticket
	warns   []string
}

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var errBrokenPipe = errors.New("write |1: broken pipe")

func newDriver(t *testing.T, budget int) *driver {
	d := &driver{t: t, now: epoch}
	d.c = New(Config{Budget: budget, CertifyObservation: true, Log: testr.New(t),
		Warn: func(msg string, kv ...any) { d.warns = append(d.warns, msg) }})
	return d
}

// step feeds one input at the driver's time and keeps the effects for take.
func (d *driver) step(in Input) {
	d.t.Helper()
	d.c.Step(d.now, in)
	d.fx = append(d.fx, d.c.Ready().Effects...)
	if err := d.c.CheckInvariants(); err != nil {
		d.t.Fatalf("after %T: %v\n%s", in, err, d.c.Inspect())
	}
}

// advance moves time on and steps the core.
func (d *driver) advance(dt time.Duration) {
	d.t.Helper()
	d.now = d.now.Add(dt)
	d.step(Tick{})
}

// take removes and returns the first pending effect of type T that matches.
func take[T Effect](d *driver, what string, match func(T) bool) T {
	d.t.Helper()
	for i, fx := range d.fx {
		if e, ok := fx.(T); ok && (match == nil || match(e)) {
			d.fx = append(d.fx[:i:i], d.fx[i+1:]...)
			return e
		}
	}
	d.t.Fatalf("no %s among the effects %s", what, d.pending())
	var zero T
	return zero
}

// none fails if an effect of type T that matches is pending.
func none[T Effect](d *driver, what string, match func(T) bool) {
	d.t.Helper()
	for _, fx := range d.fx {
		if e, ok := fx.(T); ok && (match == nil || match(e)) {
			d.t.Fatalf("unexpected %s: %+v", what, e)
		}
	}
}

func (d *driver) pending() string {
	s := ""
	for _, fx := range d.fx {
		s += fmt.Sprintf("\n  %T%+v", fx, fx)
	}
	return s
}

func spec(lane string) ModelSpec {
	return ModelSpec{Lane: lane, Identity: "gte", Layers: 22, Rungs: []int{128, 256, 512, 1024},
		MaxResidentShapes: 4, AdmissionBound: 600 * time.Second}
}

// load loads a lane and connects its first worker.
func (d *driver) load(sp ModelSpec, cached ...int) *Gen {
	d.t.Helper()
	d.step(Load{Spec: sp})
	g := take(d, "Spawn "+sp.Lane, func(s Spawn) bool { return s.Gen.Lane == sp.Lane }).Gen
	d.step(Spawned{Gen: g, Conn: sp.Lane, Cached: cached})
	take(d, "Loaded "+sp.Lane, func(l Loaded) bool { return l.Lane == sp.Lane && l.Err == nil })
	return g
}

// acquire sends a slow-path request.
func (d *driver) acquire(lane string, rung int, deadline time.Time) Ticket {
	d.t.Helper()
	d.tickets++
	d.step(Acquire{Ticket: d.tickets, Lane: lane, Rung: rung, Deadline: deadline})
	return d.tickets
}

func (d *driver) answer(t Ticket) Answer {
	d.t.Helper()
	return take(d, fmt.Sprintf("an answer to ticket %d", t), func(a Answer) bool { return a.Ticket == t })
}

func (d *driver) admit(lane string, rung int) Admit {
	d.t.Helper()
	return take(d, fmt.Sprintf("Admit %s/%d", lane, rung), func(a Admit) bool { return a.Gen.Lane == lane && a.Rung == rung })
}

var counts = func() Admission {
	zero, layers := 0, 22
	return Admission{CacheHitLayers: &zero, CompiledLayers: &layers}
}

// lease makes rung of lane resident (admitting it if need be) and returns a held lease.
func (d *driver) lease(lane string, rung int) *Cell {
	d.t.Helper()
	t := d.acquire(lane, rung, time.Time{})
	for range 2 {
		for _, fx := range d.fx {
			if a, ok := fx.(Answer); ok && a.Ticket == t {
				a = d.answer(t)
				if a.Handoff {
					d.step(Acquire{Ticket: t, Lane: lane, Rung: rung, Member: true})
					a = d.answer(t)
				}
				if a.Cell == nil {
					d.t.Fatalf("ticket %d: %+v", t, a)
				}
				return a.Cell
			}
		}
		d.ackEvictions()
		d.advance(50 * time.Millisecond)
		d.ackEvictions()
		adm := d.admit(lane, rung)
		d.step(Admitted{Gen: adm.Gen, Job: adm.Job, Load: adm.Load, Admission: counts(), Took: time.Second})
	}
	d.t.Fatalf("ticket %d was never answered: %s", t, d.pending())
	return nil
}

// ackEvictions acknowledges every eviction the core sent.
func (d *driver) ackEvictions() {
	d.t.Helper()
	for {
		i := -1
		for j, fx := range d.fx {
			if _, ok := fx.(Evict); ok {
				i = j
				break
			}
		}
		if i < 0 {
			return
		}
		ev := d.fx[i].(Evict)
		d.fx = append(d.fx[:i:i], d.fx[i+1:]...)
		d.step(Evicted{Gen: ev.Gen, Load: ev.Load, Attempt: ev.Attempt})
	}
}

// release gives a lease back; a faulted one reports its fault.
func (d *driver) release(c *Cell, fault error) {
	d.t.Helper()
	if fault != nil {
		c.Gen.MarkFaulted()
	}
	c.Release()
	if fault != nil {
		d.step(ExchangeFault{Gen: c.Gen, Err: fault})
	} else {
		d.step(Tick{})
	}
}

func code(err error) refusal.Code { return refusal.CodeOf(err) }
