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
	"fmt"
	"slices"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// victim is an eviction candidate.
type victim struct {
	m  *model
	sh *shape
	// The order of preference, most evictable first.
	busy, demanded, smallest bool
}

// makeRoom makes sure the head's admission will find budget and a shape slot when the gate
// frees: it evicts ahead of time, while the running compile finishes, so the head's compile
// starts at once. It reports false when the head is starved: no set of evictable shapes frees
// enough, because the rest are leased, protected or already on their way out.
func (s *Supervisor) makeRoom(now time.Time, head *compilequeue.Job) bool {
	m := s.models[head.Owner]
	if m == nil || m.state != running {
		return true // nothing to make room for until the worker is back
	}
	free := s.budget - s.used
	slots := m.spec.MaxResidentShapes - m.occupied()
	for _, mm := range s.models {
		for _, sh := range mm.shapes {
			if sh.state == evicting {
				free += sh.charge
				if mm == m {
					slots++
				}
			}
		}
	}
	if free >= head.Layers && slots >= 1 {
		return true
	}

	candidates := s.candidates(now)
	var picked []victim
	// A model at its shape limit evicts one of its own shapes.
	if slots < 1 {
		i := slices.IndexFunc(candidates, func(v victim) bool { return v.m == m })
		if i < 0 {
			return false
		}
		picked = append(picked, candidates[i])
		free += candidates[i].sh.charge
		candidates = slices.Delete(candidates, i, i+1)
	}
	for _, v := range candidates {
		if free >= head.Layers {
			break
		}
		picked = append(picked, v)
		free += v.sh.charge
	}
	if free < head.Layers {
		return false
	}
	for _, v := range picked {
		s.evict(v.m, v.sh)
	}
	return true
}

// candidates lists the shapes that may be evicted, most evictable first: never a leased shape,
// one a handoff cohort protects, or one of a worker that is not running. Among the rest an idle
// worker stream goes first, then a shape no request waits for, then a rung that is not the
// model's smallest, then the least recently used. A busy stream's shape stays a candidate, last,
// for when the idle ones cannot free enough.
func (s *Supervisor) candidates(now time.Time) []victim {
	demand := map[*shape]bool{}
	for _, w := range append(append([]*waiter{}, s.blocked...), s.incoming...) {
		if sh := w.m.shapes[w.rung]; sh != nil {
			demand[sh] = true
		}
	}
	var out []victim
	for _, m := range s.models {
		if m.state != running {
			continue
		}
		for _, sh := range m.shapes {
			if sh.state != resident || sh.leases > 0 || sh.cohort.protects(now) {
				continue
			}
			out = append(out, victim{m: m, sh: sh, busy: !m.stream.idle() || m.busy > 0,
				demanded: demand[sh], smallest: sh.rung == m.smallestRung()})
		}
	}
	slices.SortFunc(out, func(a, b victim) int {
		for _, c := range []struct{ a, b bool }{{a.busy, b.busy}, {a.demanded, b.demanded}, {a.smallest, b.smallest}} {
			if c.a != c.b {
				if c.a {
					return 1
				}
				return -1
			}
		}
		if c := a.sh.lastUsed.Compare(b.sh.lastUsed); c != 0 {
			return c
		}
		return compareStrings(fmt.Sprint(a.m.spec.Lane, a.sh.rung), fmt.Sprint(b.m.spec.Lane, b.sh.rung))
	})
	return out
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// evict dispatches the release of a shape. Its charge stays counted until the worker
// acknowledges; a busy stream only delays the release, it is never a reason to refund early.
func (s *Supervisor) evict(m *model, sh *shape) {
	sh.state = evicting
	m.busy++
	st, gen := m.stream, m.gen
	s.trace(Event{Kind: EventEvictionDispatch, Lane: m.spec.Lane, Rung: sh.rung})
	ev := Event{Lane: m.spec.Lane, Rung: sh.rung, RPC: "evict"}
	go func() {
		err := s.observe(func() error {
			return s.traced(st, ev, func(w Worker) error { return w.Evict(context.Background(), sh.rung) })
		})
		s.post(func(now time.Time) { s.evicted(now, m, gen, sh, err) })
	}()
}

// evicted applies an eviction's outcome.
func (s *Supervisor) evicted(now time.Time, m *model, gen int64, sh *shape, err error) {
	m.busy--
	if j := sh.thenRetry; j != nil {
		sh.thenRetry = nil
		s.queue.Retry(j)
	}
	switch {
	case err == nil:
		if m.shapes[sh.rung] == sh {
			delete(m.shapes, sh.rung)
			s.used -= sh.charge
			s.counts.Evictions++
			if s.certify {
				s.admittedCount--
			}
			s.trace(Event{At: now, Kind: EventEvictionAck, Lane: m.spec.Lane, Rung: sh.rung, Used: s.used})
		}
	case isWorkerError(err):
		s.log.Info("the worker refused to release a shape; it stays resident", "lane", m.spec.Lane, "rung", sh.rung, "error", err.Error())
		sh.state = resident
	default:
		// The outcome is unknown: the charge stays until the old process's exit is confirmed.
		s.fault(now, m, gen, err)
	}
}

// observe runs a worker call and turns a panic into an error, so the scheduler observes every
// call it starts.
func (s *Supervisor) observe(call func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker call panicked: %v", r)
		}
	}()
	return call()
}
