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
	"sync/atomic"
)

// A Cell's word packs its lease count with three flags, so that a lease and the owner's
// decision to close the cell are one atomic operation each and cannot cross.
const (
	leaseMask int64 = 1<<32 - 1
	// closedBit: no new lease; the shape is being evicted, its lane retires or its generation
	// faulted. The owner sets it for an eviction only while the count is zero.
	closedBit int64 = 1 << 62
	// unprobedBit: the shape's placement probe has not passed; only the owner leases it (for
	// the probe itself, and for the requests it answers once the probe passed).
	unprobedBit int64 = 1 << 61
	// watchBit: the owner waits for this cell's leases to be released (a drain, or a starved
	// budget head), so a release must wake it.
	watchBit int64 = 1 << 60
)

// Gen is one worker generation of one lane.
type Gen struct {
	Lane string
	N    int64
	// Conn is the owner's handle on the worker process.
	Conn any

	faulted atomic.Bool
	users   atomic.Int32
}

// MarkFaulted says an exchange on this generation faulted: no request leases it again, even
// before the owner hears of the fault.
func (g *Gen) MarkFaulted() { g.faulted.Store(true) }

// Faulted reports whether an exchange on this generation faulted.
func (g *Gen) Faulted() bool { return g.faulted.Load() }

// Enter and Exit bracket every call on the generation's stream (held or waited for). The count
// is a scheduling hint for eviction (an idle stream is preferred), never an ownership guarantee.
func (g *Gen) Enter() { g.users.Add(1) }

// Exit ends what Enter began.
func (g *Gen) Exit() { g.users.Add(-1) }

func (g *Gen) idle() bool { return g.users.Load() == 0 }

// Cell is one load of one resident shape: what a lease holds. A reloaded shape gets a new
// Cell, so a lease of an old load can never count against a new one.
type Cell struct {
	word atomic.Int64
	// use is the epoch of the last lease or release, for least-recently-used eviction.
	use   atomic.Int64
	epoch *atomic.Int64

	Lane string
	Rung int
	Gen  *Gen
	load uint64
	// probeAttempt is the placement probe that holds a lease of the core's own on the cell
	// (zero: none). Only the owner reads or writes it: the first report of that probe gives
	// the lease back; a repeated report, or one of an earlier probe, nothing.
	probeAttempt uint64
}

// releaseProbe gives back probe attempt's own lease, once however often its outcome is
// reported.
func (c *Cell) releaseProbe(attempt uint64) {
	if attempt != 0 && c.probeAttempt == attempt {
		c.probeAttempt = 0
		c.Release()
	}
}

// lease takes one lease unless a flag in mask is set or the generation faulted. It reports
// whether it did, and whether its undoing must wake the owner.
func (c *Cell) lease(mask int64) (ok, wake bool) {
	w := c.word.Add(1)
	if w&mask != 0 || c.Gen.faulted.Load() {
		return false, c.word.Add(-1)&watchBit != 0
	}
	c.use.Store(c.epoch.Load())
	return true, false
}

// Release gives one lease back. It reports whether the owner asked to hear of it (the caller
// then wakes the owner).
func (c *Cell) Release() (wake bool) {
	c.use.Store(c.epoch.Load())
	return c.word.Add(-1)&watchBit != 0
}

// Leases counts the leases held now.
func (c *Cell) Leases() int { return int(c.word.Load() & leaseMask) }

// closeIfFree closes the cell for an eviction if nobody holds or takes a lease at this instant.
func (c *Cell) closeIfFree() bool {
	for {
		w := c.word.Load()
		if w&leaseMask != 0 || w&closedBit != 0 {
			return false
		}
		if c.word.CompareAndSwap(w, w|closedBit) {
			return true
		}
	}
}

func (c *Cell) setBits(b int64)   { c.word.Or(b) }
func (c *Cell) clearBits(b int64) { c.word.And(^b) }
func (c *Cell) has(b int64) bool  { return c.word.Load()&b != 0 }

// Progress is an admission's progress as its worker reports it.
type Progress struct {
	AdmissionProgress
	done atomic.Int32
}

// Report records the layers the worker reported done.
func (p *Progress) Report(layersDone int) { p.done.Store(int32(layersDone)) }

func (p *Progress) read() AdmissionProgress {
	a := p.AdmissionProgress
	a.LayersDone = int(p.done.Load())
	return a
}
