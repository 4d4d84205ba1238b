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
	"errors"
	"flag"
	"testing"
	"time"
)

var (
	seed     = flag.Uint64("seed", 0, "replay this one seed (0: run -seeds seeds from -first)")
	first    = flag.Uint64("first", 1, "the first seed of a run of seeds")
	seeds    = flag.Int("seeds", 200, "how many seeds to run")
	duration = flag.Duration("duration", 0, "run seeds until this much time has passed (overrides -seeds)")
	traceLen = flag.Int("tracelen", 80, "how many of the last steps a failure shows")
)

// TestSimulation runs seeded random schedules of requests and faults against the residency
// core, checking every invariant after every step. A failure prints its seed; -seed replays it.
func TestSimulation(t *testing.T) {
	var total Result
	ran := 0
	run := func(sd uint64) bool {
		res, err := Run(Config{Seed: sd, TraceLen: *traceLen})
		ran++
		total.Steps += res.Steps
		total.Leases += res.Leases
		total.Admissions += res.Admissions
		total.Evictions += res.Evictions
		total.Faults += res.Faults
		total.Exits += res.Exits
		total.Retirements += res.Retirements
		total.Observed += res.Observed
		total.Refusals += res.Refusals
		total.Probes += res.Probes
		total.Duplicates += res.Duplicates
		total.Promises += res.Promises
		total.Bursts += res.Bursts
		total.IdleCrashes += res.IdleCrashes
		total.LoadsWhileRetiring += res.LoadsWhileRetiring
		total.Withdrawn += res.Withdrawn
		if res.Panicked {
			total.Panicked = true
		}
		if err != nil {
			var f *Failure
			if errors.As(err, &f) {
				t.Fatalf("%v", f)
			}
			t.Fatalf("seed %d: %v", sd, err)
			return false
		}
		return true
	}
	began := time.Now()
	switch {
	case *seed != 0:
		run(*seed)
	case *duration > 0:
		for sd := *first; time.Since(began) < *duration; sd++ {
			if !run(sd) {
				return
			}
		}
	default:
		n := *seeds
		if testing.Short() {
			n = min(n, 50)
		}
		for sd := *first; sd < *first+uint64(n); sd++ {
			if !run(sd) {
				return
			}
		}
	}
	elapsed := time.Since(began)
	t.Logf("%d seeds, %d steps in %s (%.0f seeds/s, %.0f steps/s): %d leases, %d admissions, %d evictions, %d probes, %d faults, %d exits, %d retirements, %d observations, %d refusals; "+
		"%d promises checked, %d repeated reports, %d bursts, %d idle crashes, %d loads while retiring, %d observations withdrawn",
		ran, total.Steps, elapsed.Round(time.Millisecond), float64(ran)/elapsed.Seconds(), float64(total.Steps)/elapsed.Seconds(),
		total.Leases, total.Admissions, total.Evictions, total.Probes, total.Faults, total.Exits, total.Retirements, total.Observed, total.Refusals,
		total.Promises, total.Duplicates, total.Bursts, total.IdleCrashes, total.LoadsWhileRetiring, total.Withdrawn)
	// A property that held because nothing happened proves nothing.
	if ran >= 50 {
		for what, n := range map[string]int{"leases": total.Leases, "admissions": total.Admissions, "evictions": total.Evictions,
			"faults": total.Faults, "exits": total.Exits, "retirements": total.Retirements, "promises": total.Promises,
			"repeated reports": total.Duplicates, "bursts": total.Bursts, "idle crashes": total.IdleCrashes,
			"loads while retiring": total.LoadsWhileRetiring, "withdrawn observations": total.Withdrawn} {
			if n == 0 {
				t.Errorf("the seeds exercised no %s: %+v", what, total)
			}
		}
	}
}
