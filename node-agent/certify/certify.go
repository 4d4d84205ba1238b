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

// Package certify holds the certification observation of a node's residency and its
// validator (the placement gate that synapse-certify runs). With certify observation on, the
// supervisor records each worker's inventory of resident shapes and, kept apart, a count of
// admissions minus evictions. A missing inventory must never read as a complete, empty one.
package certify

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Observation is one recorded snapshot.
type Observation struct {
	// Workers lists every loaded model's worker.
	Workers []WorkerInventory `json:"workers"`
	// AdmittedShapes is the supervisor's independent count: admissions minus evictions.
	AdmittedShapes int `json:"admittedShapes"`
}

// WorkerInventory is what one worker reported.
type WorkerInventory struct {
	Lane       string `json:"lane"`
	Generation int64  `json:"generation"`
	// Inventory is the worker's resident rungs. Nil means the worker did not report one: it
	// is serialised as an absent field, never as an empty list.
	Inventory *[]int `json:"inventory,omitempty"`
	// Error says why the inventory is missing.
	Error string `json:"error,omitempty"`
}

var (
	// ErrInventoryOmitted: a worker's inventory is missing from the observation.
	ErrInventoryOmitted = errors.New("worker inventory omitted")
	// ErrCountMismatch: the inventories do not add up to the independent admission count.
	ErrCountMismatch = errors.New("inventory count mismatch")
)

// Validate is the placement gate: every worker's inventory is present and the inventories
// together hold exactly the independently counted admitted shapes.
func Validate(o Observation) error {
	total := 0
	for _, w := range o.Workers {
		if w.Inventory == nil {
			return fmt.Errorf("%w: lane %s generation %d did not report its resident shapes (%s); a missing inventory is not an empty one",
				ErrInventoryOmitted, w.Lane, w.Generation, w.Error)
		}
		total += len(*w.Inventory)
	}
	if total != o.AdmittedShapes {
		return fmt.Errorf("%w: the workers report %d resident shapes, the supervisor counted %d admitted",
			ErrCountMismatch, total, o.AdmittedShapes)
	}
	return nil
}

// Parse reads a serialised observation. Unknown fields are refused, so a report of another
// schema is not mistaken for this one.
func Parse(data []byte) (Observation, error) {
	var o Observation
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return Observation{}, fmt.Errorf("reading the observation: %w", err)
	}
	return o, nil
}
