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
	"fmt"
	"slices"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// prewarm is a model's background load of rungs, once per worker generation.
type prewarm struct {
	gen       *Gen
	remaining []int
	began     time.Time
	job       *compilequeue.Job // the admission on the wire, if any
	summary   PrewarmSummary
}

// setPrewarm records the rungs to load in the background once the lane is ready (its
// self-check passed): at the lowest priority, one admission at a time, only while no request
// waits and the lane is quiet, only into free budget and free shape slots, never evicting. The
// first rung that does not fit ends it. Each worker generation is prewarmed once; a replacement
// is prewarmed again.
func (c *Core) setPrewarm(lane string, rungs []int) {
	if m := c.models[lane]; m != nil && m.state != retiring {
		m.prewarmRungs = slices.Clone(rungs)
	}
}

func (m *model) prewarming(j *compilequeue.Job) bool {
	return m.prewarm != nil && j != nil && m.prewarm.job == j
}

// drivePrewarm starts the next prewarm admission of some model, if the machine is idle enough.
func (c *Core) drivePrewarm() {
	if c.queue.Len() > 0 || len(c.waiters) > 0 {
		return // a request waits, or an admission holds the gate: prewarm yields
	}
	for _, lane := range c.lanes {
		m := c.models[lane]
		if m.state != running || m.prewarmRungs == nil {
			continue
		}
		p := m.prewarm
		if p == nil || p.gen != m.gen {
			p = &prewarm{gen: m.gen, remaining: slices.Clone(m.prewarmRungs), began: c.now, summary: PrewarmSummary{State: "Running"}}
			m.prewarm = p
		}
		if p.summary.State != "Running" || p.job != nil || !c.quiet(m) {
			continue
		}
		for len(p.remaining) > 0 {
			r := p.remaining[0]
			if m.shape(r) != nil {
				p.summary.AlreadyResident++
				p.remaining = p.remaining[1:]
				continue
			}
			if c.used+m.spec.Layers > c.budget || len(m.shapes) >= m.spec.MaxResidentShapes {
				// Never evicting: the first rung that does not fit ends the prewarm.
				p.summary.SkippedForBudget++
				p.remaining = nil
				break
			}
			p.remaining = p.remaining[1:]
			p.job = c.queue.StartBackground(c.now, m.owner(), compilequeue.Shape{Model: m.spec.Identity, Rung: r}, m.spec.Layers, m.cached[r])
			c.admit(m, p.job)
			return // one admission at a time, machine-wide
		}
		if len(p.remaining) == 0 {
			c.endPrewarm(m, "Finished")
		}
	}
}

// prewarmWaits reports whether m's prewarm has a rung to load and waits only for the lane to be
// quiet: the release of a lease must then wake the core.
func (c *Core) prewarmWaits(m *model) bool {
	if m.state != running || m.prewarmRungs == nil {
		return false
	}
	p := m.prewarm
	return p == nil || p.gen != m.gen || p.summary.State == "Running" && p.job == nil && len(p.remaining) > 0
}

// quiet: no shape of the lane is leased or admitting or evicting, no request is on its way
// from a handoff answer to its lease, and its worker's stream is idle.
func (c *Core) quiet(m *model) bool {
	for _, sh := range m.shapes {
		if sh.state != resident || sh.cell.Leases() > 0 || sh.cohort.protects(c.now) {
			return false
		}
	}
	return m.idle()
}

// prewarmAdmitted records a prewarm admission that loaded its rung.
func (c *Core) prewarmAdmitted(m *model, j *compilequeue.Job, kind compilequeue.Kind) {
	if !m.prewarming(j) {
		return
	}
	p := m.prewarm
	p.job = nil
	p.summary.Loaded = append(p.summary.Loaded, j.Shape.Rung)
	if kind == compilequeue.Load {
		p.summary.LoadedFromCache++
	} else {
		p.summary.Compiled++
	}
	if len(p.remaining) == 0 {
		c.endPrewarm(m, "Finished")
	}
}

// prewarmEnded ends the prewarm whose admission j did not load its rung: refused by the worker
// (Finished, with a warning, and no restart), or of unknown outcome (Cancelled: the worker
// restarts as after any admission).
func (c *Core) prewarmEnded(m *model, j *compilequeue.Job, failed bool, state string) {
	if !m.prewarming(j) {
		return
	}
	p := m.prewarm
	p.job = nil
	if failed {
		p.summary.Failed++
	}
	p.remaining = nil
	c.endPrewarm(m, state)
}

// cancelPrewarm ends a lane's prewarm on unload or retirement: rungs not yet sent are
// withdrawn; an admission on the wire finishes first.
func (c *Core) cancelPrewarm(m *model) {
	c.cancelPrewarmRun(m)
	m.prewarmRungs = nil
}

// cancelPrewarmRun ends the current generation's prewarm (its worker faulted); the
// replacement is prewarmed again.
func (c *Core) cancelPrewarmRun(m *model) {
	if p := m.prewarm; p != nil && p.summary.State == "Running" {
		p.remaining = nil
		c.endPrewarm(m, "Cancelled")
	}
}

func (c *Core) endPrewarm(m *model, state string) {
	p := m.prewarm
	if p.summary.State != "Running" {
		return
	}
	p.summary.State = state
	p.summary.Total = c.now.Sub(p.began)
	verb := "finished"
	if state == "Cancelled" {
		verb = "cancelled"
	}
	c.log.Info(fmt.Sprintf("direct-ANE prewarm %s", verb), "lane", m.spec.Lane, "loaded", p.summary.Loaded,
		"loaded_from_cache", p.summary.LoadedFromCache, "compiled", p.summary.Compiled,
		"already_resident", p.summary.AlreadyResident, "skipped_for_budget", p.summary.SkippedForBudget,
		"failed", p.summary.Failed, "total_ms", p.summary.Total.Milliseconds())
}
