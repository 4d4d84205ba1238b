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
	"fmt"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// gateOwner remembers whose failed admission holds the compile gate until its exit is confirmed.
type gateOwner struct {
	m   *model
	gen int64
}

// startAdmission reserves the job's budget and shape slot, takes the compile gate and sends
// the admission to the worker.
func (s *Supervisor) startAdmission(now time.Time, j *compilequeue.Job) {
	s.queue.Start(now, j)
	s.admit(now, s.models[j.Owner], j)
}

// admit reserves the running job's charge and shape slot and sends it to the worker.
func (s *Supervisor) admit(now time.Time, m *model, j *compilequeue.Job) {
	sh := &shape{rung: j.Shape.Rung, state: admitting, charge: j.Layers}
	m.shapes[sh.rung] = sh
	s.used += sh.charge
	m.busy++
	var ticket uint64
	if w := j.Waiters(); len(w) > 0 {
		ticket = uint64(w[0])
	}
	requestID := ""
	if w := s.waiting[compilequeue.Ticket(ticket)]; w != nil {
		requestID = w.requestID
	}
	s.trace(Event{At: now, Kind: EventReservation, RequestID: requestID, Lane: m.spec.Lane, Rung: sh.rung, Ticket: ticket, Used: s.used})
	ev := Event{RequestID: requestID, Lane: m.spec.Lane, Rung: sh.rung, Ticket: ticket, RPC: "admit"}
	st, gen := m.stream, m.gen
	progress := &admissionState{AdmissionProgress: AdmissionProgress{Rung: sh.rung, LayersTotal: j.Layers, Started: now,
		PredictedDone: now.Add(j.Prediction.Cost)}}
	m.admitting = progress
	go func() {
		var rpcStart time.Time
		var got Admission
		err := s.observe(func() error {
			return s.traced(st, ev, func(w Worker) error {
				// Compile time is learned from the moment the admission reaches the worker,
				// never from time spent waiting for its stream.
				rpcStart = s.clk.Now()
				var err error
				got, err = w.Admit(withProgress(context.Background(), progress), sh.rung)
				return err
			})
		})
		end := s.clk.Now()
		s.post(func(now time.Time) { s.admitted(now, m, gen, sh, j, got, err, end.Sub(rpcStart)) })
	}()
}

// admitted applies an admission's outcome.
func (s *Supervisor) admitted(now time.Time, m *model, gen int64, sh *shape, j *compilequeue.Job, got Admission, err error, took time.Duration) {
	m.busy--
	if m.admitting != nil && m.admitting.Rung == sh.rung {
		m.admitting = nil
	}
	lane := m.spec.Lane
	kind := compilequeue.Compile
	if got.CompiledLayers != nil && *got.CompiledLayers == 0 {
		kind = compilequeue.Load
	}
	defer s.prewarmAdmitted(now, m, j, kind, err)
	var we *WorkerError
	switch {
	case err == nil && m.gen == gen && m.state != retired:
		s.queue.Finish()
		sh.state = resident
		sh.lastUsed = now
		s.queue.Costs().Observe(compilequeue.Observation{Shape: j.Shape, Layers: j.Layers, Duration: took, Kind: kind, Retried: j.Retried})
		m.cached[sh.rung] = true // aned holds what was just compiled or loaded
		if kind == compilequeue.Load {
			s.counts.CacheLoads++
		} else {
			s.counts.Compiles++
		}
		if s.certify {
			s.admittedCount++
		}
		s.log.Info("shape admitted", "lane", lane, "generation", gen, "rung", sh.rung, "kind", kind.String(),
			"totalMs", took.Milliseconds(), "waiters", len(j.Waiters()))
		// The tickets that joined while it ran form a closed cohort; later arrivals cannot join.
		tickets := j.Waiters()
		if len(tickets) > 0 {
			sh.cohort = &cohort{members: map[compilequeue.Ticket]bool{}, expires: now.Add(HandoffWindow)}
		}
		for _, t := range tickets {
			if w := s.waiting[t]; w != nil {
				delete(s.waiting, t)
				sh.cohort.members[t] = true
				w.answer(grant{handoff: true})
			}
		}

	case errors.As(err, &we):
		// The worker answered with an error: nothing was loaded and the stream is healthy, so
		// the gate and the budget are free at once and the worker is not restarted.
		s.queue.Finish()
		delete(m.shapes, sh.rung)
		s.used -= sh.charge
		if we.Code == protocol.CodeRecycle && m.gen == gen && m.state == running && !j.Recycled {
			// The worker asks to be replaced before its compile limit. Its admission waits,
			// with its requests, for the replacement, which starts with no compiles made.
			s.log.Info("the worker asked to be replaced before its compile limit; its admission waits for the replacement",
				"lane", lane, "generation", gen, "rung", sh.rung, "message", we.Message)
			if !m.prewarming(j) {
				s.queue.Recycle(j)
			}
			s.fault(now, m, gen, fmt.Errorf("replaced at its own request: %s", we.Message))
			m.lastFault = &Fault{Code: protocol.CodeRecycle, Message: fmt.Sprintf("worker generation %d asked to be replaced: %s", gen, we.Message), At: now}
			return
		}
		code := refusal.WorkerRefused
		if we.Code == string(refusal.ResourcesExhausted) {
			code = refusal.ResourcesExhausted
			// The device is full beyond our own budget: evict one shape and retry once.
			if !j.Retried && !m.prewarming(j) {
				if c := s.candidates(now); len(c) > 0 {
					s.log.Info("the device refused an admission for resources; evicting and retrying", "lane", lane, "rung", sh.rung,
						"victim", c[0].m.spec.Lane, "victimRung", c[0].sh.rung)
					// The retry waits for the release to be acknowledged: until then the device
					// is as full as it was.
					c[0].sh.thenRetry = j
					s.evict(c[0].m, c[0].sh)
					return
				}
			}
		}
		s.log.Info("the worker refused an admission", "lane", lane, "rung", sh.rung, "code", we.Code)
		m.lastFault = &Fault{Code: we.Code, Message: fmt.Sprintf("admitting rung %d: %s", sh.rung, we.Message), At: now}
		s.answerJob(j.Waiters(), func(w *waiter) error { return refusal.New(code, lane, "admitting rung %d: %s", sh.rung, we.Message) })

	default:
		// Unknown outcome (or the worker was replaced meanwhile): the gate and the charge stay
		// held until the old process's exit is confirmed.
		if err == nil {
			err = errors.New("the worker was replaced while it admitted")
		}
		if m.exitedGen >= gen {
			// The old process's exit is already confirmed and its slots released.
			s.queue.Finish()
			s.answerJob(j.Waiters(), func(w *waiter) error {
				return refusal.New(refusal.EngineCrashed, lane, "worker generation %d exited while admitting rung %d: %v", gen, sh.rung, err)
			})
			return
		}
		s.gate = &gateOwner{m: m, gen: gen}
		s.queue.Fail()
		s.answerJob(j.Waiters(), func(w *waiter) error {
			return refusal.New(refusal.EngineCrashed, lane, "worker generation %d failed while admitting rung %d: %v", gen, sh.rung, err)
		})
		s.fault(now, m, gen, err)
	}
}
