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

package rollout

import (
	"fmt"
	"strings"
	"testing"
	"time"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// drain is the loop's SwitchDrain: any wait works, the loop's clock jumps it.
const drain = 5 * time.Second

// placed is one placement in the loop's world.
type placed struct {
	space    string
	serves   bool
	retiring bool
}

// world is a lane and its placements, run by Decide and by a world that does what the
// controller, the agents and the endpoints controller do: retired placements leave their
// nodes a step later, placements made serve a step later, and the EndpointSlices follow a
// switch a step after it is written.
type world struct {
	want, surge, unavail int
	newSpace, space      string
	old, cur             []placed
	nodes                int
	generation, followed int64
	followedAt, now      time.Time
}

func (w *world) snapshot() Snapshot {
	s := Snapshot{Replicas: w.want, MaxSurge: w.surge, MaxUnavailable: min(w.unavail, w.want), NewSpace: w.newSpace, Space: w.space}
	for _, set := range []struct {
		from []placed
		to   *[]Placement
	}{{w.old, &s.Old}, {w.cur, &s.Current}} {
		for _, p := range set.from {
			if p.retiring {
				s.Retiring++
				continue
			}
			*set.to = append(*set.to, Placement{Space: p.space, Serves: p.serves})
		}
	}
	s.Endpoints.Followed = w.followed == w.generation
	if s.Endpoints.Followed {
		s.Endpoints.DrainLeft = max(0, drain-w.now.Sub(w.followedAt))
	}
	return s
}

// live is the placements not being retired; serving those that serve in the lane's space.
func live(ps []placed) []*placed {
	var out []*placed
	for i := range ps {
		if !ps[i].retiring {
			out = append(out, &ps[i])
		}
	}
	return out
}

func (w *world) serving() int {
	n := 0
	for _, p := range append(live(w.old), live(w.cur)...) {
		if p.serves && p.space == w.space {
			n++
		}
	}
	return n
}

// apply carries a plan out as the controller does and checks the bounds it must keep.
func (w *world) apply(s Snapshot, p Plan) error {
	before := w.serving()
	oldLive := live(w.old)
	for _, i := range p.Retire {
		o := oldLive[i]
		if o.space != p.Space && (!s.Endpoints.Followed || s.Endpoints.DrainLeft > 0) {
			return fmt.Errorf("retired an old placement of %s the EndpointSlices may still list", o.space)
		}
		o.retiring = true
	}
	if w.space != "" && p.Space != w.space {
		w.generation++ // as the controller counts switches in the lane's status
	}
	w.space = p.Space
	cur := live(w.cur)
	for _, c := range cur[min(len(cur), p.NewTarget):] {
		c.retiring = true
	}
	for n := len(cur); n < p.NewTarget && len(w.old)+len(w.cur) < w.nodes; n++ {
		w.cur = append(w.cur, placed{space: w.newSpace})
	}
	if after := w.serving(); after < min(w.want-min(w.unavail, w.want), before) {
		return fmt.Errorf("%d placements serve in space %s, %d did: past maxUnavailable %d", after, w.space, before, w.unavail)
	}
	if n := len(live(w.old)) + len(live(w.cur)); n > w.nodes {
		return fmt.Errorf("%d placements on %d nodes", n, w.nodes)
	}
	return nil
}

// advance is a step of the world: retired placements leave, placements made serve, the
// endpoints follow the lane's space.
func (w *world) advance(wait time.Duration) {
	drop := func(ps []placed) []placed {
		out := ps[:0]
		for _, p := range ps {
			if !p.retiring {
				p.serves = true
				out = append(out, p)
			}
		}
		return out
	}
	w.old, w.cur = drop(w.old), drop(w.cur)
	if w.followed != w.generation {
		w.followed, w.followedAt = w.generation, w.now
	}
	w.now = w.now.Add(max(wait, time.Second))
}

// done: the lane has its replicas of the latest spec, all serving, in the new space.
func (w *world) done() bool {
	return len(w.old) == 0 && len(w.cur) == w.want && w.serving() == w.want && w.space == w.newSpace
}

func (w *world) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replicas %d surge %d unavailable %d, space %q (generation %d, followed %d):", w.want, w.surge, w.unavail, w.space, w.generation, w.followed)
	for _, set := range [][]placed{w.old, w.cur} {
		b.WriteString(" [")
		for _, p := range set {
			fmt.Fprintf(&b, " %s/serves=%v/retiring=%v", p.space, p.serves, p.retiring)
		}
		b.WriteString(" ]")
	}
	return b.String()
}

// run drives the world until it is done, or the plan says it stalled; the trace is every
// state it went through.
func (w *world) run() (last Plan, trace []string, err error) {
	for step := 0; step < 20*w.nodes+20; step++ {
		trace = append(trace, w.String())
		s := w.snapshot()
		p := Decide(s)
		if w.done() {
			if p.Strategy != "" || len(p.Retire) > 0 || p.NewTarget != w.want {
				return p, trace, fmt.Errorf("at the end the plan still acts: %+v", p)
			}
			return p, trace, nil
		}
		if err := w.apply(s, p); err != nil {
			return p, trace, err
		}
		if p.Stalled != "" {
			return p, trace, nil
		}
		w.advance(p.DrainWait)
	}
	return Plan{}, trace, fmt.Errorf("no end after %d steps", 20*w.nodes+20)
}

// start is a state a rollout may find its lane in: old placements serving or not (fewer than
// replicas when nodes were lost), some of the latest spec already made, an earlier rollout's
// placements of a third space still draining, or the switch already made.
type start struct {
	oldServing, oldNot, curServing, curNot int
	third, switched                        bool
}

func starts(want int, blueGreen bool) []start {
	var out []start
	for o := 0; o <= want; o++ {
		for n := 0; o+n <= want; n++ {
			for cs := 0; cs <= 1; cs++ {
				for cn := 0; cn <= 1; cn++ {
					out = append(out, start{oldServing: o, oldNot: n, curServing: cs, curNot: cn})
					if blueGreen {
						out = append(out, start{oldServing: o, oldNot: n, curServing: cs, curNot: cn, third: true},
							start{oldServing: o, oldNot: n, curServing: cs, curNot: cn, switched: true})
					}
				}
			}
		}
	}
	return out
}

func newWorld(want, surge, unavail int, blueGreen bool, st start) *world {
	w := &world{want: want, surge: surge, unavail: unavail, newSpace: "a", space: "a", now: time.Unix(0, 0)}
	oldSpace := "a"
	if blueGreen {
		w.newSpace, oldSpace = "b", "a"
	}
	add := func(to *[]placed, space string, serves bool, n int) {
		for range n {
			*to = append(*to, placed{space: space, serves: serves})
		}
	}
	add(&w.old, oldSpace, true, st.oldServing)
	add(&w.old, oldSpace, false, st.oldNot)
	add(&w.cur, w.newSpace, true, st.curServing)
	add(&w.cur, w.newSpace, false, st.curNot)
	if st.third {
		// The lane was rolled back from space c to a before the endpoints followed.
		add(&w.old, "c", true, 1)
		w.generation = 1
	}
	if st.switched {
		w.space, w.generation = w.newSpace, 1
	}
	w.nodes = max(want+surge, len(w.old)+len(w.cur))
	return w
}

// TestEveryRolloutEndsOrSaysWhy drives every combination of replicas 1..5, maxSurge 0..2 and
// maxUnavailable 0..2, rolling and blue/green, from every start, step by step: each reaches its
// end state (every replica of the latest spec serving in its space, no old one left) within
// maxUnavailable and its nodes, or stops with a Stalled message, and only where no step within
// the bounds leads on: rolling with both bounds 0 (which the API server refuses), or a
// blue/green whose switch needs more placements than the lane may have (see noWay).
func TestEveryRolloutEndsOrSaysWhy(t *testing.T) {
	runs, stalls := 0, 0
	for want := 1; want <= 5; want++ {
		for surge := 0; surge <= 2; surge++ {
			for unavail := 0; unavail <= 2; unavail++ {
				for _, blueGreen := range []bool{false, true} {
					for _, st := range starts(want, blueGreen) {
						w := newWorld(want, surge, unavail, blueGreen, st)
						first := w.String()
						last, trace, err := w.run()
						runs++
						if err != nil {
							t.Fatalf("%s\n%v\n%s", first, err, strings.Join(trace, "\n"))
						}
						if last.Stalled != "" {
							stalls++
							if !w.noWay(blueGreen) {
								t.Fatalf("%s: stalled where a way is left: %s\n%s", first, last.Stalled, strings.Join(trace, "\n"))
							}
						}
					}
				}
			}
		}
	}
	t.Logf("%d rollouts run, %d stalled with a message", runs, stalls)
}

// noWay: no step within the bounds leads on. A blue/green keeps min(replicas-maxUnavailable,
// S) of its old space serving until it switches, S being what serves there now, and switches
// only with as many of the new serving (one at least): both within replicas + maxSurge.
func (w *world) noWay(blueGreen bool) bool {
	u := min(w.unavail, w.want)
	if !blueGreen {
		return w.surge == 0 && u == 0
	}
	keep := min(w.want-u, w.serving())
	return keep+max(1, keep) > w.want+w.surge
}

// TestAFullLaneWithBoundsThatLeaveNoWayStallsAtOnceAndSaysWhatToSet: the examples (3
// replicas, surge 1 / unavailable 0, and surge 0 / unavailable 1) stopped forever at one new
// placement, Progressing True; now no placement is made or retired and the plan says what to
// set.
func TestAFullLaneWithBoundsThatLeaveNoWayStallsAtOnceAndSaysWhatToSet(t *testing.T) {
	for _, tc := range []struct {
		surge, unavail int
		want           string
		strategy       string
		blueGreen      bool
	}{
		{1, 0, "set rollout.maxSurge to at least 3 or rollout.maxUnavailable to at least 1", v1.LaneReasonBlueGreen, true},
		{0, 1, "set rollout.maxSurge to at least 1 or rollout.maxUnavailable to at least 2", v1.LaneReasonBlueGreen, true},
		{0, 0, "set maxSurge to 1 (a spare node) or maxUnavailable to 1", v1.LaneReasonRollingUpdate, false},
	} {
		w := newWorld(3, tc.surge, tc.unavail, tc.blueGreen, start{oldServing: 3})
		p := Decide(w.snapshot())
		if !strings.Contains(p.Stalled, tc.want) || p.Strategy != tc.strategy || len(p.Retire) != 0 || p.NewTarget != 0 {
			t.Errorf("surge %d unavailable %d: plan %+v, want it stalled saying %q", tc.surge, tc.unavail, p, tc.want)
		}
	}
}

// TestABlueGreenWhoseOldPlacementsWereLostSwitchesOnAsManyAsTheyServe: two of three old
// placements lost with surge 0 / unavailable 1: the new space switches once it serves as many
// as the old still do, rather than wait for two that no node can hold beside the old.
func TestABlueGreenWhoseOldPlacementsWereLostSwitchesOnAsManyAsTheyServe(t *testing.T) {
	w := newWorld(3, 0, 1, true, start{oldServing: 1, curServing: 1})
	p := Decide(w.snapshot())
	if !p.Switched || p.Space != "b" || p.Stalled != "" {
		t.Fatalf("plan %+v, want the switch to b", p)
	}
}
