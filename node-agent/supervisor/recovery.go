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
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// fault starts the confirmed-exit recovery of generation gen of m's worker after an I/O error,
// a malformed reply or a bounded exchange that failed. One fault restarts its generation once:
// a fault reported for an older generation, or while recovery already runs, is stale and
// ignored, so it never restarts a recovered owner.
func (s *Supervisor) fault(now time.Time, m *model, gen int64, err error) {
	if gen != m.gen || m.state != running && m.state != retiring || m.exiting {
		s.log.V(1).Info("ignoring a stale worker fault", "lane", m.spec.Lane, "generation", gen, "current", m.gen, "error", err.Error())
		return
	}
	s.log.Info("worker faulted; confirming its exit before a replacement starts", "lane", m.spec.Lane, "generation", gen, "error", err.Error())
	if m.state == running {
		m.state = recovering
	}
	m.restartBegan = now
	m.lastFault = &Fault{Code: string(refusal.EngineCrashed), Message: fmt.Sprintf("worker generation %d: %v", gen, err), At: now}
	s.queue.SetRecovering(m.owner(), true)
	if s.gate != nil && s.gate.m == m && s.gate.gen == gen {
		// An unknown outcome holds the gate for at most this long if the exit is not confirmed.
		s.gateHold = now.Add(UnknownOutcomeGateHold)
	}
	s.confirmExit(m, gen)
}

// confirmExit closes the worker's channel, waits for the process to exit (killing it after
// ExitGrace) and reports the confirmed exit to the scheduler.
func (s *Supervisor) confirmExit(m *model, gen int64) {
	m.exiting = true
	w := m.stream.w
	go func() {
		_ = s.observe(w.Close)
		select {
		case <-w.Exited():
		case <-s.clk.After(ExitGrace):
			_ = s.observe(w.Kill)
			<-w.Exited()
		}
		s.post(func(now time.Time) { s.exitConfirmed(now, m, gen) })
	}()
}

// exitConfirmed releases every slot of the exited process, frees the compile gate its failed
// admission held, and then either finishes a retirement or spawns the replacement.
func (s *Supervisor) exitConfirmed(now time.Time, m *model, gen int64) {
	m.exiting = false
	m.exitedGen = gen
	for rung, sh := range m.shapes {
		s.used -= sh.charge
		if s.certify && sh.state != admitting {
			s.admittedCount--
		}
		delete(m.shapes, rung)
	}
	if s.gate != nil && s.gate.m == m && s.gate.gen <= gen {
		s.queue.Finish()
		s.gate, s.gateHold = nil, time.Time{}
	}
	s.log.Info("worker exit confirmed; its reservations are refunded", "lane", m.spec.Lane, "generation", gen)
	if m.state == retiring {
		s.finishRetire(m)
		return
	}
	s.spawn(m)
}

// spawn starts the next generation of m's worker.
func (s *Supervisor) spawn(m *model) {
	m.spawning = true
	next := m.gen + 1
	go func() {
		var w Worker
		var cached []int
		err := s.observe(func() error {
			var err error
			w, cached, err = s.spawner.Spawn(context.Background(), m.spec, next)
			return err
		})
		s.post(func(now time.Time) { s.spawned(now, m, next, w, cached, err) })
	}()
}

// spawned connects a replacement worker, unless the model retired meanwhile: retirement is
// rechecked here, and a replacement of a retiring model is closed without ever being connected.
func (s *Supervisor) spawned(now time.Time, m *model, gen int64, w Worker, cached []int, err error) {
	m.spawning = false
	if err != nil {
		m.spawnFailures++
		backoff := time.Second << min(m.spawnFailures-1, 6)
		m.spawnRetryAt = now.Add(backoff)
		s.log.Error(err, "starting a replacement worker failed; retrying", "lane", m.spec.Lane, "generation", gen, "retryIn", backoff)
		return
	}
	m.spawnFailures = 0
	if m.state == retiring {
		s.log.Info("the lane retired while its replacement started; closing it unconnected", "lane", m.spec.Lane, "generation", gen)
		m.gen, m.stream = gen, &stream{w: w, gen: gen}
		s.confirmExit(m, gen)
		return
	}
	m.gen, m.stream = gen, &stream{w: w, gen: gen}
	m.state = running
	m.restarts++
	s.counts.Restarts++
	m.cached = map[int]bool{}
	for _, r := range cached {
		m.cached[r] = true
	}
	s.queue.SetRecovering(m.owner(), false)
	s.log.Info("replacement worker connected", "lane", m.spec.Lane, "generation", gen)
}

// driveLifecycle moves retirement and failed spawns along; it returns when to look again.
func (s *Supervisor) driveLifecycle(now time.Time, m *model) time.Time {
	switch {
	case m.state == retiring && !m.exiting && !m.spawning && m.exitedGen < m.gen && m.leases() == 0 && m.busy == 0:
		// Drained: close the channel and confirm the exit before refunding anything.
		s.confirmExit(m, m.gen)
	case m.state == recovering && !m.exiting && !m.spawning && !m.spawnRetryAt.IsZero():
		if now.Before(m.spawnRetryAt) {
			return m.spawnRetryAt
		}
		m.spawnRetryAt = time.Time{}
		s.spawn(m)
	case m.state == retiring && !m.exiting && !m.spawning && m.exitedGen >= m.gen:
		// The replacement never started (its spawn failed) and the old exit is confirmed.
		s.finishRetire(m)
	}
	return time.Time{}
}

// Retire unloads lane: it stops new leases and replacement spawning, drops its queued
// admissions, drains in-flight work, closes the worker's channel and confirms its exit, and
// only then refunds its reservations. It returns when all of that is done or ctx ends; an
// unconfirmed exit keeps the resources charged.
func (s *Supervisor) Retire(ctx context.Context, lane string) error {
	s.mu.Lock()
	m := s.models[lane]
	if m == nil {
		s.mu.Unlock()
		return nil
	}
	if m.retireDone == nil {
		m.retireDone = make(chan struct{})
		m.state = retiring
		s.cancelPrewarm(s.clk.Now(), m)
		for _, j := range s.queue.DropOwner(m.owner()) {
			s.answerJob(j.Waiters(), func(w *waiter) error {
				return refusal.New(refusal.LaneRetired, lane, "the lane is being unloaded from this node")
			})
		}
		s.log.Info("retiring lane", "lane", lane, "generation", m.gen)
	}
	done := m.retireDone
	s.mu.Unlock()
	s.wake()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Supervisor) finishRetire(m *model) {
	m.state = retired
	delete(s.models, m.spec.Lane)
	close(m.retireDone)
	s.log.Info("lane retired; worker exit confirmed and reservations refunded", "lane", m.spec.Lane)
}
