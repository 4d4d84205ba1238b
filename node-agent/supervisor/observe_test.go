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
	"encoding/json"
	"errors"
	"strings"
	"testing"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
)

func TestSerializedInventoryOmissionFailsPlacementGate(t *testing.T) {
	h := newHarness(t, 100)
	h.load("a")
	h.load("b")
	h.resident("a", 128).Release()
	h.resident("a", 256).Release()
	h.resident("b", 128).Release()

	// Every worker answers: the gate passes.
	obs, err := h.s.Observe(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := certify.Validate(obs); err != nil {
		t.Fatalf("a complete observation failed the gate: %v", err)
	}

	// b does not answer. Serialised, its inventory must be absent, not an empty list.
	b := h.spawner.Get(t, "b", 1)
	b.Lock()
	b.NextInventoryErr = fakeworker.ErrBrokenPipe
	b.Unlock()
	obs, err = h.s.Observe(h.ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(obs)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `"inventory":[]`) || strings.Count(string(data), `"inventory"`) != 1 {
		t.Fatalf("serialised observation %s: b's missing inventory must be omitted, not empty", data)
	}
	parsed, err := certify.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := certify.Validate(parsed); !errors.Is(err, certify.ErrInventoryOmitted) {
		t.Fatalf("the gate answered %v, want an omitted inventory", err)
	}
}

func TestOrdinaryServingRecordsNoObservation(t *testing.T) {
	s := New(Config{Clock: clocktesting.NewFakeClock(epoch)})
	if _, err := s.Observe(context.Background()); !errors.Is(err, ErrObservationOff) {
		t.Fatalf("got %v, want observation off", err)
	}
}
