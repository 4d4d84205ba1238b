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

package simulation

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// The checks of what the core promised and of progress: the half of the seed that says what
// must eventually happen. The core's own invariants (CheckInvariants) check its state after
// every step; these check it against what clients were told and what the machine did.

// promise is a shape_compiling answer's word: the compile stays queued, and is kept for at
// least twice the retry time told, unless it starts, its shape becomes resident by another
// way, or its lane is unloaded. A later answer for the same compile replaces it: the seed
// drops a compile nobody waits for after twice the delay it *last* promised.
type promise struct {
	ticket residency.Ticket
	lane   string
	rung   int
	job    uint64
	until  time.Time
}

type promises struct {
	open []promise
	// started are the jobs the core dispatched to a worker.
	started map[uint64]bool
}

// promised records and checks a shape_compiling answer at the moment it is given.
func (s *sim) promised(r *req, rf *refusal.Error) {
	if rf.RetryAfter < residency.MinRetryAfter {
		s.violate("ticket %d was told to retry after %s, under the %s floor", r.ticket, rf.RetryAfter, residency.MinRetryAfter)
	}
	if !strings.Contains(rf.Message, "stays queued") {
		return // a wait behind another admission ended; no compile of its own was promised
	}
	insp := s.core.Inspect()
	if m, ok := insp.Models[r.lane]; !ok || m.State == "retiring" {
		return
	}
	j, ok := insp.Job(r.lane, r.rung)
	if !ok {
		if sh, resident := insp.Shape(r.lane, r.rung); resident && sh.State != "evicting" {
			return
		}
		s.violate("ticket %d was told its compile of %s/%d stays queued, but no such compile is queued", r.ticket, r.lane, r.rung)
		return
	}
	s.res.Promises++
	until := s.now.Add(2 * rf.RetryAfter)
	if j.DropAt.Before(until) {
		s.violate("ticket %d was told to retry after %s, but %s/%d is dropped at %s, before twice that (%s)",
			r.ticket, rf.RetryAfter, r.lane, r.rung, rel(j.DropAt), rel(until))
	}
	p := promise{ticket: r.ticket, lane: r.lane, rung: r.rung, job: j.ID, until: until}
	if i := slices.IndexFunc(s.open, func(o promise) bool { return o.job == j.ID }); i >= 0 {
		s.open[i] = p
		return
	}
	s.open = append(s.open, p)
}

// checkPromises: no promised compile disappears before its time without having started.
func (s *sim) checkPromises(insp residency.Inspection) {
	kept := s.open[:0]
	for _, p := range s.open {
		if !s.now.Before(p.until) || s.started[p.job] {
			continue
		}
		if m, ok := insp.Models[p.lane]; !ok || m.State == "retiring" {
			continue // the lane was unloaded: its compiles go with it
		}
		if j, ok := insp.Job(p.lane, p.rung); ok && j.ID == p.job {
			kept = append(kept, p)
			continue
		}
		if _, ok := insp.Shape(p.lane, p.rung); ok {
			continue // resident or admitting by another way: the retry finds it
		}
		s.violate("the compile of %s/%d promised to ticket %d until %s was dropped at %s without starting", p.lane, p.rung, p.ticket, rel(p.until), rel(s.now))
	}
	s.open = kept
}

// gateFreedAtOnce: a worker that answered an admission with an error of its own freed the
// compile gate in that very step, without its worker's restart.
func (s *sim) gateFreedAtOnce(fx residency.Admit) {
	if r := s.core.Inspect().Running; r != nil && r.ID == uint64(fx.Job) {
		s.violate("%s#%d answered job %d with its own error, but the job still holds the compile gate", fx.Gen.Lane, fx.Gen.N, fx.Job)
	}
}

// checkPrewarmStart: a background admission starts only while no request waits or is queued,
// the lane is quiet (no lease held, its worker's stream idle) and it fits without evicting.
func (s *sim) checkPrewarmStart(fx residency.Admit, p *proc) {
	s.started[uint64(fx.Job)] = true
	insp := s.core.Inspect()
	r := insp.Running
	if r == nil || r.ID != uint64(fx.Job) || !r.Background {
		return
	}
	switch {
	case insp.Waiting > 0 || len(insp.Queued) > 0:
		s.violate("a prewarm admission of %s/%d started while %d requests waited and %d compiles were queued", fx.Gen.Lane, fx.Rung, insp.Waiting, len(insp.Queued))
	case len(p.stream) > 0:
		s.violate("a prewarm admission of %s/%d started while its worker's stream was busy", fx.Gen.Lane, fx.Rung)
	}
	for c, n := range s.leases {
		if c.Gen == fx.Gen && n > 0 {
			s.violate("a prewarm admission of %s/%d started while rung %d of its lane was leased", fx.Gen.Lane, fx.Rung, c.Rung)
		}
	}
}

// checkHold: an unknown outcome holds the gate at most UnknownOutcomeGateHold after the restart
// of its worker began, as the machine saw it; and the core is stepped just after the hold's end
// whether or not it asked, so a hold that outlives it is seen.
func (s *sim) checkHold(insp residency.Inspection) {
	if !insp.Held || insp.Running == nil {
		return
	}
	if p := s.procs[insp.HeldBy]; p != nil && p.closing && insp.HoldUntil.After(p.restartBegan.Add(residency.UnknownOutcomeGateHold)) {
		s.violate("%s#%d's unknown outcome holds the gate until %s, more than %s after its restart began at %s",
			p.gen.Lane, p.gen.N, rel(insp.HoldUntil), residency.UnknownOutcomeGateHold, rel(p.restartBegan))
	}
	if s.holdTick != insp.HoldUntil {
		s.holdTick = insp.HoldUntil
		s.at(insp.HoldUntil.Add(epsilon), func() { s.step(residency.Tick{}) })
	}
}

// settled: faults have stopped and every trace of them is gone: no worker is wedged, exiting or
// dead unconfirmed, no lane recovers, and no call that began while faults were on is still in
// flight. A request that arrives then must be served, or refused only for a reason of its own.
func (s *sim) settled() bool {
	if s.aborted || (!s.cfg.NoFaults && s.now.Before(s.faultsUntil)) {
		return false
	}
	for _, p := range s.procs {
		if p.exited {
			continue
		}
		if p.wedged || p.closing || p.dead {
			return false
		}
		for _, c := range p.stream {
			if c.underFaults {
				return false
			}
		}
	}
	for _, m := range s.core.Inspect().Models {
		if m.State == "recovering" {
			return false
		}
	}
	return true
}

// checkServed: a request that arrived settled is never refused for a fault.
func (s *sim) checkServed(r *req, err error) {
	if !r.settled || err == nil {
		return
	}
	var rf *refusal.Error
	if !errors.As(err, &rf) {
		return
	}
	switch rf.Code {
	case refusal.EngineCrashed, refusal.BackendUnavailable, refusal.WorkerRefused:
	case refusal.ResourcesExhausted:
		if l := s.lane(r.lane); l.spec.Layers > s.budget {
			return // one shape needs more than the machine has: a reason of its own
		}
	default:
		return
	}
	s.violate("ticket %d for %s/%d arrived once faults were over and everything had recovered, yet was refused %v", r.ticket, r.lane, r.rung, err)
}
