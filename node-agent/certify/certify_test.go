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

package certify

import (
	"errors"
	"testing"
)

func inventory(rungs ...int) *[]int { return &rungs }

func TestValidatorRefusesPlacementInventoryCountMismatch(t *testing.T) {
	obs := Observation{
		Workers: []WorkerInventory{
			{Lane: "a", Generation: 1, Inventory: inventory(128, 256)},
			{Lane: "b", Generation: 3, Inventory: inventory(128)},
		},
		AdmittedShapes: 4,
	}
	if err := Validate(obs); !errors.Is(err, ErrCountMismatch) {
		t.Fatalf("got %v, want a count mismatch", err)
	}
	obs.AdmittedShapes = 3
	if err := Validate(obs); err != nil {
		t.Fatalf("a consistent observation was refused: %v", err)
	}
}

func TestValidatorRefusesAnOmittedInventoryEvenWhenTheCountsWouldMatch(t *testing.T) {
	obs := Observation{
		Workers: []WorkerInventory{
			{Lane: "a", Generation: 1, Inventory: inventory()},
			{Lane: "b", Generation: 1, Error: "inventory: broken pipe"},
		},
		AdmittedShapes: 0,
	}
	if err := Validate(obs); !errors.Is(err, ErrInventoryOmitted) {
		t.Fatalf("got %v, want an omitted inventory", err)
	}
}

func TestParseRefusesAnotherSchema(t *testing.T) {
	if _, err := Parse([]byte(`{"schema": 1, "workers": []}`)); err == nil {
		t.Fatal("an observation with unknown fields was accepted")
	}
}
