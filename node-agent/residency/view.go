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
	"slices"
)

// View is the state the owner publishes after every Step: immutable, read without a lock by the
// lease fast path and by status readers. Only the Cells and Progress it points to change, and
// only through atomics.
type View struct {
	starved bool
	stopped error
	lanes   map[string]*laneView
	node    NodeSnapshot
}

type laneView struct {
	// rungs and cells are aligned: cells[i] is rung rungs[i]'s resident load, or nil. Only a
	// running lane has cells.
	rungs []int
	cells []*Cell
	// yield: the lane's resident traffic yields to a head starved for one of its shape slots.
	yield    bool
	snap     LaneSnapshot
	progress *Progress
	prewarm  *PrewarmSummary
}

// TryLease is the fast path: it leases rung of lane if the shape is resident, probed and open,
// its generation has not faulted and no starved budget head waits. It reports whether a failed
// attempt must wake the owner (it briefly counted on a cell the owner watches).
func (v *View) TryLease(lane string, rung int) (c *Cell, wake bool) {
	if v == nil || v.starved || v.stopped != nil {
		return nil, false
	}
	lv := v.lanes[lane]
	if lv == nil || lv.cells == nil || lv.yield {
		return nil, false
	}
	for i, r := range lv.rungs {
		if r == rung {
			c = lv.cells[i]
			break
		}
	}
	if c == nil {
		return nil, false
	}
	ok, wake := c.lease(closedBit | unprobedBit)
	if !ok {
		return nil, wake
	}
	return c, false
}

// Stopped is the error the core stopped with, or nil.
func (v *View) Stopped() error { return v.stopped }

// Lane returns lane's snapshot, and false if it is not loaded.
func (v *View) Lane(lane string) (LaneSnapshot, bool) {
	lv := v.lanes[lane]
	if lv == nil {
		return LaneSnapshot{}, false
	}
	out := lv.snap
	if lv.progress != nil {
		a := lv.progress.read()
		out.Admitting = &a
	}
	return out, true
}

// Prewarm returns lane's prewarm summary, and false if it has none.
func (v *View) Prewarm(lane string) (PrewarmSummary, bool) {
	lv := v.lanes[lane]
	if lv == nil || lv.prewarm == nil {
		return PrewarmSummary{}, false
	}
	return *lv.prewarm, true
}

// Lanes lists the loaded lanes, sorted.
func (v *View) Lanes() []string {
	out := make([]string, 0, len(v.lanes))
	for lane := range v.lanes {
		out = append(out, lane)
	}
	slices.Sort(out)
	return out
}

// Node returns the machine-wide picture.
func (v *View) Node() NodeSnapshot { return v.node }

// StoppedView is the view of a core whose owner stopped: nothing is leased on the fast path,
// and every request goes to the owner, which refuses it.
func StoppedView(err error) *View { return &View{stopped: err, lanes: map[string]*laneView{}} }

// same reports whether v and o publish the same state.
func (v *View) same(o *View) bool {
	if v.starved != o.starved || v.stopped != o.stopped || v.node != o.node || len(v.lanes) != len(o.lanes) {
		return false
	}
	for lane, a := range v.lanes {
		b := o.lanes[lane]
		if b == nil || !a.same(b) {
			return false
		}
	}
	return true
}

func (a *laneView) same(b *laneView) bool {
	if a.yield != b.yield || a.progress != b.progress || !slices.Equal(a.cells, b.cells) || !slices.Equal(a.rungs, b.rungs) {
		return false
	}
	if (a.prewarm == nil) != (b.prewarm == nil) || a.prewarm != nil && !samePrewarm(*a.prewarm, *b.prewarm) {
		return false
	}
	x, y := a.snap, b.snap
	if x.Generation != y.Generation || x.Loading != y.Loading || x.Running != y.Running || x.Recovering != y.Recovering ||
		x.Retiring != y.Retiring || x.Restarts != y.Restarts || !slices.Equal(x.Resident, y.Resident) || !slices.Equal(x.Cached, y.Cached) {
		return false
	}
	return (x.LastFault == nil) == (y.LastFault == nil) && (x.LastFault == nil || *x.LastFault == *y.LastFault)
}

func samePrewarm(a, b PrewarmSummary) bool {
	loaded := slices.Equal(a.Loaded, b.Loaded)
	a.Loaded, b.Loaded = nil, nil
	return loaded && a.State == b.State && a.LoadedFromCache == b.LoadedFromCache && a.Compiled == b.Compiled &&
		a.AlreadyResident == b.AlreadyResident && a.SkippedForBudget == b.SkippedForBudget && a.Failed == b.Failed && a.Total == b.Total
}

// Probed reports whether rung of lane is resident on a running worker, and whether its
// placement probe has passed for this load: read from the view, without the owner.
func (v *View) Probed(lane string, rung int) (resident, probed bool) {
	lv := v.lanes[lane]
	if lv == nil || lv.cells == nil {
		return false, false
	}
	i := slices.Index(lv.rungs, rung)
	if i < 0 || lv.cells[i] == nil {
		return false, false
	}
	return true, !lv.cells[i].has(unprobedBit)
}
