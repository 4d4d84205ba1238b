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

package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// loadable is a model the capacity stage places and later unloads.
type loadable interface {
	placeable
	Unload() error
	Close()
}

// Capacity is what the capacity stage found: how many distinct programs the device held at
// once, and how it refused the next. jafreck/ironmill docs/design/ane/ane-constraints.md
// reports about 55 models loadable at once on M-series ("model-size dependent": these are small
// programs, so the count is the device's program limit, not its memory's); the residency
// budget assumes
// residency.DefaultBudget; and the load failure the worker treats as "device full" (0x20004)
// has no public source. This stage measures all three.
type Capacity struct {
	// Loaded is how many programs were resident at once; Tried how many it tried to load.
	Loaded int `json:"loaded"`
	Tried  int `json:"tried"`
	// Refusal is the load that failed, with its NSError; nil if every program loaded.
	Refusal *StageError `json:"refusal,omitempty"`
	// RecognisedAsFull: the worker reads that refusal as the device being full
	// (ResourcesExhausted), so it evicts and retries rather than failing the rung.
	RecognisedAsFull bool `json:"recognisedAsFull"`
	Budget           int  `json:"budget"`
}

// fill loads distinct programs, built by build, until one fails to load or limit are
// resident, then unloads them all. A compile or build failure is an error; a load failure is
// the finding.
func fill(build func(i int) (loadable, error), b *budget, limit int, now func() time.Time) (Capacity, error) {
	c := Capacity{Budget: residency.DefaultBudget}
	var held []loadable
	defer func() {
		for _, m := range held {
			_ = m.Unload()
			m.Close()
		}
	}()
	for i := range limit {
		m, err := build(i)
		if err != nil {
			return c, fmt.Errorf("program %d: %w", i, err)
		}
		c.Tried++
		var chk Check
		err = place(m, &chk, b, now)
		if err == nil {
			held = append(held, m)
			c.Loaded++
			continue
		}
		m.Close()
		var ce *ane.CallError
		if !errors.As(err, &ce) || ce.Call != "load" {
			return c, fmt.Errorf("program %d: %w", i, err)
		}
		c.Refusal, c.RecognisedAsFull = describe(err), ce.ResourcesExhausted
		break
	}
	return c, nil
}

// judgeCapacity is the capacity stage's verdict: the device must hold the residency budget's
// programs, and refuse the next with a code the worker recognises.
func judgeCapacity(c Capacity) (string, error) {
	switch {
	case c.Refusal == nil:
		return fmt.Sprintf("%d programs resident at once, none refused (the residency budget is %d)", c.Loaded, c.Budget), nil
	case c.Loaded < c.Budget:
		return "", fmt.Errorf("the device held %d programs and refused the next (%s %d: %s); the residency budget assumes %d: lower it to %d",
			c.Loaded, c.Refusal.Domain, c.Refusal.Code, c.Refusal.Description, c.Budget, c.Loaded)
	case !c.RecognisedAsFull:
		return "", fmt.Errorf("the device held %d programs and refused the next with %s %d, which the worker does not read as the device being full", c.Loaded, c.Refusal.Domain, c.Refusal.Code)
	}
	return fmt.Sprintf("%d programs resident at once, then refused with %s %d (read as the device being full)", c.Loaded, c.Refusal.Domain, c.Refusal.Code), nil
}

// residencyBudget is how many programs the capacity stage tries: the residency budget, which
// is what it must show the device holds.
func residencyBudget() int { return residency.DefaultBudget }
