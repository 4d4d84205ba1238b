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
	"sync"
	"sync/atomic"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// modelState is where a loaded model is in its life.
type modelState int

const (
	running    modelState = iota
	recovering            // the worker faulted; its exit is being confirmed or a replacement spawned
	retiring              // no new leases; draining before the worker is closed
	retired               // exit confirmed, reservations refunded
)

// model is one loaded model: its worker generation and its shapes.
type model struct {
	spec   ModelSpec
	gen    int64
	stream *stream
	state  modelState
	shapes map[int]*shape
	// cached are the rungs the worker reported held by aned.
	cached map[int]bool
	// restartBegan is when recovery of the current generation began.
	restartBegan time.Time
	retireDone   chan struct{}
	// busy counts admissions and evictions in flight on the worker.
	busy int
	// exiting: the worker's exit is being confirmed. spawning: a replacement is starting.
	exiting, spawning bool
	// exitedGen is the newest generation whose exit is confirmed; faultedGen the newest whose
	// fault a released lease reported (it is leased no more).
	exitedGen, faultedGen int64
	// spawnRetryAt is when a failed replacement spawn is tried again; spawnFailures counts
	// consecutive failures for the backoff.
	spawnRetryAt  time.Time
	spawnFailures int
	// prewarmRungs are loaded in the background once the lane is ready; prewarm is the
	// current generation's progress.
	prewarmRungs []int
	prewarm      *prewarm
	// admitting is the admission on the wire, for the status; lastFault and restarts too.
	admitting *admissionState
	lastFault *Fault
	restarts  int
}

// owner names the model in the compile queue. It is the lane, not the generation: a
// recovering worker's queued admissions wait for its replacement.
func (m *model) owner() string { return m.spec.Lane }

func (m *model) leases() int {
	n := 0
	for _, sh := range m.shapes {
		n += sh.leases
	}
	return n
}

// resident counts the shapes that occupy one of the model's shape slots.
func (m *model) occupied() int { return len(m.shapes) }

type shapeState int

const (
	admitting shapeState = iota
	resident
	evicting
)

// shape is one rung of one model: reserved while admitting, resident, or evicting until the
// worker acknowledges the release. Its charge stays counted in all three.
type shape struct {
	rung     int
	state    shapeState
	charge   int
	leases   int
	lastUsed time.Time
	cohort   *cohort
	// thenRetry is an admission the device refused for resources, retried once this shape's
	// release is acknowledged.
	thenRetry *compilequeue.Job
	// probe is the placement probe's verdict on this load of the shape (ModelSpec.Probe).
	probe probeState
}

// cohort is the closed set of tickets that joined an admission while it ran. Until every
// member leases or leaves, or the handoff window ends, they may lease ahead of a starved
// budget head and the shape is not evicted.
type cohort struct {
	members map[compilequeue.Ticket]bool
	expires time.Time
}

func (c *cohort) protects(now time.Time) bool {
	return c != nil && len(c.members) > 0 && now.Before(c.expires)
}

// stream is a worker's single request/reply channel. Idleness is a scheduling hint; the
// exchange itself always holds mu for the whole request and reply.
type stream struct {
	mu    sync.Mutex
	users atomic.Int32 // holding or waiting for mu
	w     Worker
	gen   int64
}

func (st *stream) idle() bool { return st.users.Load() == 0 }

// do runs one exchange on the stream.
func (st *stream) do(f func(Worker) error) error {
	st.users.Add(1)
	defer st.users.Add(-1)
	st.mu.Lock()
	defer st.mu.Unlock()
	return f(st.w)
}

// LoadModel starts the model's first worker generation. It returns once the worker has loaded.
func (s *Supervisor) LoadModel(ctx context.Context, spec ModelSpec) error {
	s.mu.Lock()
	if _, ok := s.models[spec.Lane]; ok {
		s.mu.Unlock()
		return fmt.Errorf("lane %s is already loaded", spec.Lane)
	}
	if s.lock == nil && s.lockPath != "" {
		// The first direct-ANE load takes the machine's lane lock; workers inherit it, so it
		// stays held while any of them can still use the device. A live lane's lock is never
		// bypassed: another holder is an error.
		lock, err := lanelock.Acquire(s.lockPath)
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("loading lane %s: %w", spec.Lane, err)
		}
		s.lock = lock
		if li, ok := s.spawner.(LockInheritor); ok {
			li.InheritLock(lock.File())
		}
	}
	m := &model{spec: spec, gen: 1, state: recovering, shapes: map[int]*shape{}, cached: map[int]bool{}}
	s.models[spec.Lane] = m
	// Until the worker has loaded, the lane's admissions queue but are not elected.
	s.queue.SetRecovering(m.owner(), true)
	s.mu.Unlock()

	w, cached, err := s.spawner.Spawn(ctx, spec, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		delete(s.models, spec.Lane)
		for _, j := range s.queue.DropOwner(m.owner()) {
			s.answerJob(j.Waiters(), func(w *waiter) error {
				return refusal.New(refusal.EngineCrashed, spec.Lane, "the lane's worker did not start: %v", err)
			})
		}
		return fmt.Errorf("starting the worker of lane %s: %w", spec.Lane, err)
	}
	m.stream = &stream{w: w, gen: 1}
	m.state = running
	s.queue.SetRecovering(m.owner(), false)
	for _, r := range cached {
		m.cached[r] = true
	}
	s.wake()
	return nil
}

// modelFor returns the loaded model of lane, or a refusal.
func (s *Supervisor) modelFor(lane string) (*model, error) {
	if s.stopped != nil {
		return nil, refusal.New(refusal.EngineCrashed, lane, "the compile scheduler stopped: %v", s.stopped)
	}
	m, ok := s.models[lane]
	if !ok {
		return nil, refusal.New(refusal.UnknownLane, lane, "no such lane is loaded on this node")
	}
	if m.state == retiring || m.state == retired {
		return nil, refusal.New(refusal.LaneRetired, lane, "the lane is being unloaded from this node")
	}
	return m, nil
}

// fits reports whether rung is one of the model's ladder.
func (m *model) fits(rung int) bool {
	for _, r := range m.spec.Rungs {
		if r == rung {
			return true
		}
	}
	return false
}

func (m *model) smallestRung() int { return m.spec.Rungs[0] }
