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
	"fmt"
	"slices"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

// PrewarmSummary reports a lane's background load of its prewarm rungs.
type PrewarmSummary struct {
	// State is Waiting, Running, Finished or Cancelled.
	State string
	// Loaded are the rungs prewarm admitted; LoadedFromCache and Compiled split them.
	Loaded                    []int
	LoadedFromCache, Compiled int
	AlreadyResident           int
	SkippedForBudget          int
	Failed                    int
	Total                     time.Duration
}

// prewarm is a model's background load of rungs, once per worker generation.
type prewarm struct {
	gen       int64
	remaining []int
	began     time.Time
	job       *compilequeue.Job // the admission on the wire, if any
	summary   PrewarmSummary
}

// Prewarm loads rungs of lane in the background once the lane is ready (its self-check passed):
// at the lowest priority, one admission at a time, only while no request waits and the lane is
// quiet, only into free budget and free shape slots, never evicting. The first rung that does
// not fit ends it. Each worker generation is prewarmed once; a replacement is prewarmed again.
func (s *Supervisor) Prewarm(lane string, rungs []int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.modelFor(lane)
	if err != nil {
		return err
	}
	m.prewarmRungs = slices.Clone(rungs)
	s.wake()
	return nil
}

// Prewarmed returns the lane's prewarm summary, and false if it has none.
func (s *Supervisor) Prewarmed(lane string) (PrewarmSummary, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[lane]
	if m == nil || m.prewarm == nil {
		return PrewarmSummary{}, false
	}
	return m.prewarm.summary, true
}

// drivePrewarm starts the next prewarm admission of some model, if the machine is idle enough.
// Callers hold mu; only schedule calls it, after every request has had its turn.
func (s *Supervisor) drivePrewarm(now time.Time) {
	if s.queue.Len() > 0 || len(s.waiting) > 0 || len(s.blocked) > 0 || len(s.incoming) > 0 {
		return // a request waits: prewarm yields
	}
	lanes := make([]string, 0, len(s.models))
	for lane := range s.models {
		lanes = append(lanes, lane)
	}
	slices.Sort(lanes)
	for _, lane := range lanes {
		m := s.models[lane]
		if m.state != running || m.prewarmRungs == nil {
			continue
		}
		p := m.prewarm
		if p == nil || p.gen != m.gen {
			p = &prewarm{gen: m.gen, remaining: slices.Clone(m.prewarmRungs), began: now, summary: PrewarmSummary{State: "Running"}}
			m.prewarm = p
		}
		if p.summary.State != "Running" || p.job != nil || !s.quiet(now, m) {
			continue
		}
		for len(p.remaining) > 0 {
			r := p.remaining[0]
			if sh := m.shapes[r]; sh != nil {
				p.summary.AlreadyResident++
				p.remaining = p.remaining[1:]
				continue
			}
			if s.used+m.spec.Layers > s.budget || m.occupied() >= m.spec.MaxResidentShapes {
				// Never evicting: the first rung that does not fit ends the prewarm.
				p.summary.SkippedForBudget++
				p.remaining = nil
				break
			}
			p.remaining = p.remaining[1:]
			shape := compilequeue.Shape{Model: m.spec.Identity, Rung: r}
			p.job = s.queue.StartBackground(now, m.owner(), shape, m.spec.Layers, m.cached[r])
			s.admit(now, m, p.job)
			return // one admission at a time, machine-wide
		}
		if len(p.remaining) == 0 {
			s.endPrewarm(now, m, "Finished")
		}
	}
}

// prewarming reports whether j is m's prewarm admission.
func (m *model) prewarming(j *compilequeue.Job) bool { return m.prewarm != nil && m.prewarm.job == j }

// quiet: no shape of the lane is leased, no request is on its way from a handoff answer to its
// lease, and its worker's stream is idle.
func (s *Supervisor) quiet(now time.Time, m *model) bool {
	for _, sh := range m.shapes {
		if sh.leases > 0 || sh.cohort.protects(now) || sh.state != resident {
			return false
		}
	}
	return m.busy == 0 && m.stream.idle()
}

// prewarmAdmitted records the outcome of a prewarm admission. A refused one ends the prewarm
// with a warning and no restart; one of unknown outcome restarts the worker as any admission
// does, which ends this generation's prewarm.
func (s *Supervisor) prewarmAdmitted(now time.Time, m *model, j *compilequeue.Job, kind compilequeue.Kind, err error) {
	if !m.prewarming(j) {
		return
	}
	p := m.prewarm
	p.job = nil
	switch {
	case err == nil:
		p.summary.Loaded = append(p.summary.Loaded, j.Shape.Rung)
		if kind == compilequeue.Load {
			p.summary.LoadedFromCache++
		} else {
			p.summary.Compiled++
		}
		if len(p.remaining) == 0 {
			s.endPrewarm(now, m, "Finished")
		}
	case isWorkerError(err):
		p.summary.Failed++
		s.log.Info("WARN direct-ANE prewarm admission refused by the worker; prewarm ends", "lane", m.spec.Lane, "rung", j.Shape.Rung, "error", err.Error())
		s.endPrewarm(now, m, "Finished")
	default:
		p.summary.Failed++
		s.endPrewarm(now, m, "Cancelled")
	}
}

// cancelPrewarm ends a lane's prewarm on unload, pause or retirement: rungs not yet sent are
// withdrawn; an admission on the wire finishes first.
func (s *Supervisor) cancelPrewarm(now time.Time, m *model) {
	if p := m.prewarm; p != nil && p.summary.State == "Running" {
		p.remaining = nil
		s.endPrewarm(now, m, "Cancelled")
	}
	m.prewarmRungs = nil
}

func (s *Supervisor) endPrewarm(now time.Time, m *model, state string) {
	p := m.prewarm
	if p.summary.State != "Running" {
		return
	}
	p.summary.State = state
	p.summary.Total = now.Sub(p.began)
	verb := "finished"
	if state == "Cancelled" {
		verb = "cancelled"
	}
	s.log.Info(fmt.Sprintf("direct-ANE prewarm %s", verb), "lane", m.spec.Lane, "loaded", p.summary.Loaded,
		"loaded_from_cache", p.summary.LoadedFromCache, "compiled", p.summary.Compiled,
		"already_resident", p.summary.AlreadyResident, "skipped_for_budget", p.summary.SkippedForBudget,
		"failed", p.summary.Failed, "total_ms", p.summary.Total.Milliseconds())
}
