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
	"context"
	"errors"
	"slices"

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
)

// ErrObservationOff: certify observation is not enabled; ordinary serving records nothing.
var ErrObservationOff = errors.New("certify observation is off")

// Observe asks every running worker for its inventory and returns it with the independently
// kept admission count. A worker that does not answer is recorded without an inventory,
// never with an empty one.
func (s *Supervisor) Observe(ctx context.Context) (certify.Observation, error) {
	if !s.certify {
		return certify.Observation{}, ErrObservationOff
	}
	type target struct {
		lane string
		gen  int64
		st   *stream
	}
	s.mu.Lock()
	var targets []target
	for lane, m := range s.models {
		if m.stream != nil && (m.state == running || m.state == retiring) {
			targets = append(targets, target{lane, m.gen, m.stream})
		}
	}
	count := s.admittedCount
	s.mu.Unlock()
	slices.SortFunc(targets, func(a, b target) int { return compareStrings(a.lane, b.lane) })

	obs := certify.Observation{AdmittedShapes: count}
	for _, t := range targets {
		inv := certify.WorkerInventory{Lane: t.lane, Generation: t.gen}
		var rungs []int
		err := s.observe(func() error {
			return t.st.do(func(w Worker) error {
				var err error
				rungs, err = w.Inventory(ctx)
				return err
			})
		})
		if err != nil {
			inv.Error = err.Error()
		} else {
			if rungs == nil {
				rungs = []int{}
			}
			slices.Sort(rungs)
			inv.Inventory = &rungs
		}
		obs.Workers = append(obs.Workers, inv)
	}
	return obs, nil
}
