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
	"slices"

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
)

// ErrObservationOff: certify observation is not enabled; ordinary serving records nothing.
var ErrObservationOff = errors.New("certify observation is off")

// observation is a certify observation under way. It is a barrier: while one is pending no
// admission or eviction starts, and the inventories are asked only once none is in flight, so
// the workers' inventories and the independent count describe the same moment.
type observation struct {
	id      uint64
	asked   bool
	pending int
	workers []certify.WorkerInventory
	// count is the independent admission count at the moment the inventories were asked; a
	// worker that exits or faults after that answers (or fails to answer) about that moment.
	count int
}

func (c *Core) observe(id uint64, withdraw bool) {
	if withdraw {
		c.obs = slices.DeleteFunc(c.obs, func(o *observation) bool { return o.id == id && !o.asked })
		return
	}
	if !c.cfg.CertifyObservation {
		c.emit(Observed{ID: id, Err: ErrObservationOff})
		return
	}
	c.obs = append(c.obs, &observation{id: id})
}

func (c *Core) observing() bool { return len(c.obs) > 0 }

// driveObservation asks every worker for its inventory once no admission or eviction is in
// flight. A lane whose worker cannot answer (loading, recovering, exiting) is recorded without
// an inventory and with the reason, never with an empty one.
func (c *Core) driveObservation() {
	if len(c.obs) == 0 {
		return
	}
	o := c.obs[0]
	if !o.asked {
		for _, lane := range c.lanes {
			if c.models[lane].moving > 0 {
				return // wait for the admissions and evictions in flight
			}
		}
		o.asked, o.count = true, c.admittedCount
		for _, lane := range c.lanes {
			m := c.models[lane]
			inv := certify.WorkerInventory{Lane: lane, Generation: m.genN()}
			if (m.state == running || m.state == retiring) && m.live() && !m.exiting {
				o.pending++
				m.busy++
				c.emit(Inventory{Observation: o.id, Gen: m.gen})
			} else {
				inv.Error = fmt.Sprintf("worker generation %d is %s and cannot report its resident shapes", m.genN(), m.state)
			}
			o.workers = append(o.workers, inv)
		}
	}
	if o.pending > 0 {
		return
	}
	c.obs = c.obs[1:]
	// The barrier lifted: admissions and evictions it held back this pass may go now.
	c.soon(c.now)
	c.emit(Observed{ID: o.id, Observation: certify.Observation{Workers: o.workers, AdmittedShapes: o.count}})
	c.driveObservation()
}

// inventoried records one worker's answer.
func (c *Core) inventoried(in Inventoried) {
	if len(c.obs) == 0 || c.obs[0].id != in.Observation {
		return
	}
	o := c.obs[0]
	i := slices.IndexFunc(o.workers, func(w certify.WorkerInventory) bool {
		return w.Lane == in.Gen.Lane && w.Generation == in.Gen.N && w.Inventory == nil && w.Error == ""
	})
	if i < 0 {
		return
	}
	o.pending--
	m := c.current(in.Gen)
	if m != nil {
		m.busy--
	}
	if in.Err != nil {
		o.workers[i].Error = in.Err.Error()
		if m != nil && !IsWorkerError(in.Err) {
			// An I/O error or a malformed answer: the stream is broken, as after any call.
			c.fault(m, in.Gen, fmt.Errorf("asking for its inventory: %w", in.Err))
		}
		return
	}
	rungs := slices.Clone(in.Rungs)
	if rungs == nil {
		rungs = []int{}
	}
	slices.Sort(rungs)
	o.workers[i].Inventory = &rungs
}
