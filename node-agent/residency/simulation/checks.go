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
	"fmt"
	"slices"
	"strings"
)

// check runs after every step of the core: the core's own invariants, then the ones only the
// machine can see.
func (s *sim) check() {
	if s.err != nil || s.aborted {
		return
	}
	if err := s.core.CheckInvariants(); err != nil {
		s.violate("core invariant: %v", err)
		return
	}
	insp := s.core.Inspect()
	s.checkPromises(insp)
	s.checkHold(insp)
	if insp.Used > s.budget {
		s.violate("charged %d executables, over the budget of %d", insp.Used, s.budget)
	}
	// Refunds only after acknowledgement or confirmed exit: every program a process whose exit
	// is unconfirmed may hold on the device is still charged to it.
	onDevice := 0
	for g, p := range s.procs {
		if p.exited || len(p.resident) == 0 {
			continue
		}
		onDevice += len(p.resident) * p.lane.spec.Layers
		m, ok := insp.Models[g.Lane]
		if !ok || m.Gen != g.N {
			s.violate("%s#%d holds rungs %v on the device, but its charges were refunded before its exit was confirmed",
				g.Lane, g.N, sortedRungs(p.resident))
			continue
		}
		for r := range p.resident {
			if _, charged := insp.Shape(g.Lane, r); !charged {
				s.violate("%s#%d holds rung %d on the device, but it is not charged (refunded before its release was acknowledged)", g.Lane, g.N, r)
			}
		}
	}
	if onDevice > insp.Used {
		s.violate("the device holds %d executables, but only %d are charged", onDevice, insp.Used)
	}
	// Every lease the clients hold is counted on its cell.
	for c, n := range s.leases {
		if n < 0 {
			s.violate("%s#%d/%d was released more often than leased", c.Lane, c.Gen.N, c.Rung)
		}
		if c.Leases() < n {
			s.violate("%s#%d/%d counts %d leases, but clients hold %d", c.Lane, c.Gen.N, c.Rung, c.Leases(), n)
		}
	}
}

func sortedRungs(m map[int]bool) []int {
	var out []int
	for r := range m {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// drain ends the workload: no more arrivals; every lane is retired.
func (s *sim) drain() {
	s.draining = true
	for _, l := range s.lanes {
		s.retire(l)
	}
}

// finished: the run drained, nobody waits, and every lane is gone, except one whose worker
// will never exit (its charges stay, as they must).
func (s *sim) finished() bool {
	if !s.draining {
		return false
	}
	for _, r := range s.reqs {
		if r.waiting || r.held != nil {
			return false
		}
	}
	if s.aborted {
		return true
	}
	for _, l := range s.lanes {
		if l.phase != gone && !s.stuck(l) {
			return false
		}
	}
	return true
}

// stuck reports whether a lane's worker is wedged for good, so its retirement never ends.
func (s *sim) stuck(l *lane) bool {
	for _, p := range s.procs {
		if p.lane == l && p.neverDies && !p.dead {
			return true
		}
	}
	return false
}

// endChecks: every request was answered, every lease given back, every charge refunded except
// those of a worker that never exited.
func (s *sim) endChecks() {
	for _, r := range s.reqs {
		if !r.over {
			s.violate("ticket %d (%s/%d, since %s) was never answered", r.ticket, r.lane, r.rung, rel(r.since))
		}
	}
	for c, n := range s.leases {
		if n != 0 {
			s.violate("%d leases of %s#%d/%d were never released", n, c.Lane, c.Gen.N, c.Rung)
		}
	}
	for id := range s.obsOpen {
		if !s.obsWithdrawn[id] {
			s.violate("observation %d was never answered", id)
		}
	}
	if s.aborted {
		return
	}
	insp := s.core.Inspect()
	want := 0
	for _, l := range s.lanes {
		if s.stuck(l) {
			for _, sh := range insp.Models[l.name].Shapes {
				want += chargeOf(l, sh.State)
			}
		}
	}
	if insp.Used != want {
		s.violate("after every lane retired, %d executables are charged, want %d (those of workers that never exit)", insp.Used, want)
	}
	if s.core.Used() != insp.Used {
		s.violate("Used %d differs from the inspection's %d", s.core.Used(), insp.Used)
	}
}

func chargeOf(l *lane, _ string) int { return l.spec.Layers }

func (s *sim) pendingSummary() string {
	var b strings.Builder
	n := 0
	for _, r := range s.reqs {
		if r.waiting {
			n++
			if n <= 5 {
				fmt.Fprintf(&b, " t%d %s/%d since %s;", r.ticket, r.lane, r.rung, rel(r.since))
			}
		}
	}
	fmt.Fprintf(&b, " %d requests wait;", n)
	for _, l := range s.lanes {
		fmt.Fprintf(&b, " %s %v;", l.name, l.phase)
	}
	for g, p := range s.procs {
		if !p.exited {
			var calls []string
			for _, c := range p.stream {
				calls = append(calls, fmt.Sprintf("%s(started %v done %v)", c.name, c.started, c.done))
			}
			fmt.Fprintf(&b, " proc %s#%d dead=%v closing=%v wedged=%v neverDies=%v calls=%v;", g.Lane, g.N, p.dead, p.closing, p.wedged, p.neverDies, calls)
		}
	}
	return b.String()
}

func (p lanePhase) String() string { return [...]string{"gone", "loading", "loaded", "retiring"}[p] }
