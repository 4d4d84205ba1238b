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

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// admit reserves the running job's charge and shape slot and sends it to the worker. The
// queue's running slot is the compile gate; the job holds it until its outcome (or, for an
// unknown outcome, its worker's confirmed exit or hold expiry) frees it.
func (c *Core) admit(m *model, j *compilequeue.Job) {
	sh := &shape{rung: j.Shape.Rung, state: admitting, charge: j.Layers, load: c.nextLoad(), job: j}
	m.addShape(sh)
	c.used += sh.charge
	m.busy++
	m.moving++
	var ticket Ticket
	requestID := ""
	if ts := j.Waiters(); len(ts) > 0 {
		ticket = ts[0]
		if w := c.waiters[ticket]; w != nil {
			requestID = w.RequestID
		}
	}
	c.trace(Event{Kind: EventReservation, RequestID: requestID, Lane: m.spec.Lane, Rung: sh.rung, Ticket: uint64(ticket),
		Charge: sh.charge, Used: c.used})
	m.admitting = &Progress{AdmissionProgress: AdmissionProgress{Rung: sh.rung, LayersTotal: j.Layers, Started: c.now,
		PredictedDone: c.now.Add(j.Prediction.Cost)}}
	c.emit(Admit{Gen: m.gen, Job: j.ID, Load: sh.load, Rung: sh.rung, Progress: m.admitting, RequestID: requestID, Ticket: ticket})
}

// admitted applies an admission's outcome. An outcome of a generation whose exit was confirmed
// meanwhile, or of a job that no longer admits the shape, is stale: the exit already refunded
// the shape, freed the gate and answered the job's requests, so it changes nothing.
func (c *Core) admitted(in Admitted) {
	if h := c.hold; h != nil && h.outstanding && h.job.ID == in.Job && h.load == in.Load {
		// The call of an admission whose worker's exit was confirmed returned: the gate frees.
		c.queue.Finish(h.job)
		c.hold = nil
		return
	}
	m := c.current(in.Gen)
	if m == nil {
		return
	}
	var sh *shape
	for _, s := range m.shapes {
		if s.state == admitting && !s.unknownOutcome && s.job != nil && s.job.ID == in.Job && s.load == in.Load {
			sh = s
		}
	}
	if sh == nil {
		return
	}
	j := sh.job
	m.busy--
	m.moving--
	if m.admitting != nil && m.admitting.Rung == sh.rung {
		m.admitting = nil
	}
	lane := m.spec.Lane
	var we *WorkerError
	switch {
	case in.Err == nil:
		c.admissionSucceeded(m, sh, j, in)
	case errors.As(in.Err, &we):
		// The worker answered with an error: nothing was loaded and the stream is healthy, so
		// the gate and the budget are free at once and the worker is not restarted.
		c.queue.Finish(j)
		c.trace(Event{Kind: EventAdmissionRefused, Lane: lane, Rung: sh.rung})
		c.refund(m, sh)
		c.admissionRefused(m, sh.rung, j, we)
	default:
		// Unknown outcome: the gate and the charge stay held until the old process's exit is
		// confirmed; the gate for at most UnknownOutcomeGateHold after the restart began. The
		// shape remembers that its outcome came, so a repeated report changes nothing.
		sh.unknownOutcome = true
		c.answerJob(j, func(w *waiter) error {
			return refusal.New(refusal.EngineCrashed, lane, "worker generation %d failed while admitting rung %d: %v", in.Gen.N, sh.rung, in.Err)
		})
		c.prewarmEnded(m, j, false, "Cancelled")
		c.fault(m, in.Gen, fmt.Errorf("admitting rung %d: %w", sh.rung, in.Err))
		c.holdGate(j, sh.load, in.Gen, c.holdUntil(m), false)
	}
}

func (c *Core) admissionSucceeded(m *model, sh *shape, j *compilequeue.Job, in Admitted) {
	c.queue.Finish(j)
	sh.state, sh.job = resident, nil
	sh.cell = &Cell{epoch: &c.epoch, Lane: m.spec.Lane, Rung: sh.rung, Gen: m.gen, load: sh.load}
	sh.cell.use.Store(c.epoch.Load())
	if m.spec.Probe != nil {
		sh.cell.setBits(unprobedBit)
	}
	if m.state == retiring {
		sh.cell.setBits(closedBit | watchBit)
	}
	kind := compilequeue.Compile
	if in.Admission.CompiledLayers != nil && *in.Admission.CompiledLayers == 0 {
		kind = compilequeue.Load
	}
	c.queue.Costs().Observe(compilequeue.Observation{Shape: j.Shape, Layers: j.Layers, Duration: in.Took, Kind: kind, Retried: j.Retried})
	if in.Admission.CompiledLayers != nil || in.Admission.CacheHitLayers != nil {
		// aned holds what was just compiled or loaded. A worker that sends no counts is an
		// older one: its rungs stay predicted and learned as compiles.
		m.cached[sh.rung] = true
	}
	if kind == compilequeue.Load {
		c.counts.CacheLoads++
	} else {
		c.counts.Compiles++
	}
	if c.cfg.CertifyObservation {
		c.admittedCount++
	}
	tickets := j.Waiters()
	c.log.Info("shape admitted", "lane", m.spec.Lane, "generation", m.genN(), "rung", sh.rung, "kind", kind.String(),
		"totalMs", in.Took.Milliseconds(), "waiters", len(tickets))
	c.prewarmAdmitted(m, j, kind)
	// The tickets that joined while it ran form a closed cohort; later arrivals cannot join.
	if len(tickets) > 0 {
		sh.cohort = &cohort{members: map[Ticket]bool{}, expires: c.now.Add(HandoffWindow)}
	}
	for _, t := range tickets {
		c.queue.Leave(j, t)
		if w := c.waiters[t]; w != nil && w.job == j {
			w.job = nil
			sh.cohort.members[t] = true
			c.answer(w, Answer{Handoff: true})
		}
	}
}

// admissionRefused handles an admission the worker refused. Nothing was loaded.
func (c *Core) admissionRefused(m *model, rung int, j *compilequeue.Job, we *WorkerError) {
	lane := m.spec.Lane
	// A job is worth putting back if a request waits for it, or if a client sent away with
	// shape_compiling was told its compile stays queued and the promise has not run out.
	waited := len(j.Waiters()) > 0 || c.now.Before(j.DropAt())
	switch {
	case we.Code == protocol.CodeRecycle && m.state == running && !j.Recycled:
		// The worker asks to be replaced before its compile limit. The admission waits, with
		// its requests, for the replacement, which starts with no compiles made.
		c.log.Info("the worker asked to be replaced before its compile limit; its admission waits for the replacement",
			"lane", lane, "generation", m.genN(), "rung", rung, "message", we.Message)
		c.prewarmEnded(m, j, false, "Cancelled")
		if waited {
			c.queue.Recycle(j)
		}
		c.fault(m, m.gen, fmt.Errorf("replaced at its own request: %s", we.Message))
		m.lastFault = &Fault{Code: protocol.CodeRecycle, Message: fmt.Sprintf("worker generation %d asked to be replaced: %s", m.genN(), we.Message), At: c.now}
		return

	case we.Code == string(refusal.ResourcesExhausted) && waited && !j.Retried && m.state == running:
		// The device is full beyond our own budget: evict one shape and retry once, when the
		// release is acknowledged. The job keeps its place at the queue's head meanwhile, so
		// requests for its shape still join it.
		if v := c.candidates(); len(v) > 0 && v[0].sh.cell.closeIfFree() {
			c.log.Info("the device refused an admission for resources; evicting and retrying", "lane", lane, "rung", rung,
				"victim", v[0].m.spec.Lane, "victimRung", v[0].sh.rung)
			c.prewarmEnded(m, j, false, "Finished")
			c.queue.Park(j)
			c.evict(v[0].m, v[0].sh, j)
			return
		}
	}
	code := refusal.WorkerRefused
	if we.Code == string(refusal.ResourcesExhausted) {
		code = refusal.ResourcesExhausted
	}
	if m.prewarming(j) {
		c.warn("direct-ANE prewarm admission refused by the worker; prewarm ends", "lane", lane, "rung", rung, "code", we.Code, "message", we.Message,
			"requestsJoined", len(j.Waiters()))
	} else {
		c.log.Info("the worker refused an admission", "lane", lane, "rung", rung, "code", we.Code)
	}
	c.prewarmEnded(m, j, true, "Finished")
	m.lastFault = &Fault{Code: we.Code, Message: fmt.Sprintf("admitting rung %d: %s", rung, we.Message), At: c.now}
	c.answerJob(j, func(w *waiter) error { return refusal.New(code, lane, "admitting rung %d: %s", rung, we.Message) })
}

// refund gives back a shape's charge without an eviction (nothing was loaded, or its process's
// exit is confirmed).
func (c *Core) refund(m *model, sh *shape) {
	m.removeShape(sh)
	c.used -= sh.charge
	if c.cfg.CertifyObservation && sh.state != admitting {
		c.admittedCount--
	}
	c.trace(Event{Kind: EventRefund, Lane: m.spec.Lane, Rung: sh.rung, Charge: sh.charge, Used: c.used})
}
