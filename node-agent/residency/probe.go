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

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// waitForProbe holds w until the shape's placement probe gives its verdict, starting the probe
// if none runs. The probe runs on a lease of its own that the core takes and gives back, so
// the shape stays resident while it runs and a request that gives up does not abandon it.
func (c *Core) waitForProbe(w *waiter, m *model, sh *shape) {
	w.probing = sh
	sh.probe.waiters = append(sh.probe.waiters, w.Ticket)
	if sh.probe.running {
		return
	}
	if ok, _ := sh.cell.lease(closedBit); !ok {
		// The generation faulted and the core has not heard yet: the recovery answers w.
		return
	}
	sh.probe.running, sh.probe.attempt = true, c.nextAttempt()
	sh.cell.probeAttempt = sh.probe.attempt
	m.busy++
	c.emit(ProbeShape{Gen: m.gen, Load: sh.load, Attempt: sh.probe.attempt, Rung: sh.rung, Cell: sh.cell, Judge: m.spec.Probe})
}

// probed records a probe's verdict and answers the requests that waited for it: a pass lets them
// lease, a failure refuses them and every later request on this load, and a probe that could not
// measure fails them (a fault also recovers the worker, whose replacement probes afresh).
func (c *Core) probed(in Probed) {
	in.Cell.releaseProbe(in.Attempt)
	m := c.current(in.Gen)
	if m == nil {
		return // the exit was confirmed first: its requests were answered then
	}
	sh := m.shapeByLoad(in.Load)
	if sh == nil || !sh.probe.running || sh.probe.attempt != in.Attempt {
		return
	}
	m.busy--
	sh.probe.running = false
	waiters := sh.probe.waiters
	sh.probe.waiters = nil
	each := func(f func(w *waiter)) {
		for _, t := range waiters {
			if w := c.waiters[t]; w != nil && w.probing == sh {
				w.probing = nil
				f(w)
			}
		}
	}
	switch {
	case in.Err != nil && !IsWorkerError(in.Err):
		each(func(w *waiter) {
			c.refuse(w, refusal.EngineCrashed, "worker generation %d failed during rung %d's placement probe: %v", in.Gen.N, sh.rung, in.Err)
		})
		c.fault(m, in.Gen, in.Err)
	case in.Err != nil:
		each(func(w *waiter) {
			c.refuse(w, refusal.WorkerRefused, "rung %d's placement probe: %v", sh.rung, in.Err)
		})
	case in.Verdict != nil:
		verdict := in.Verdict
		var r *refusal.Error
		if !errors.As(verdict, &r) {
			verdict = refusal.New(refusal.ComputeUnitMismatch, m.spec.Lane, "%v", verdict)
		}
		sh.probe.failed = verdict
		c.log.Info("a shape failed its placement probe; it serves nothing", "lane", m.spec.Lane, "rung", sh.rung, "verdict", verdict.Error())
		each(func(w *waiter) { c.answer(w, Answer{Err: verdict}) })
	default:
		sh.probe.passed = true
		sh.cell.clearBits(unprobedBit)
		each(func(w *waiter) {
			c.waiters[w.Ticket] = w
			c.reroute = append(c.reroute, w.Ticket)
		})
	}
}
