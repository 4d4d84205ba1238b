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

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// probeState is one load of a shape's placement-probe state. A shape is created by its
// admission and dropped by its eviction or its worker's end, so a reloaded shape is probed
// afresh.
type probeState struct {
	passed bool
	// failed is the judgement that refuses every lease of this load.
	failed error
	// running is closed when the probe in flight ends; requests wait on it rather than probe
	// the shape twice.
	running chan struct{}
}

// probeGate holds a freshly granted lease until its shape's placement probe has passed: the first
// lease of a load runs the probe, the others wait for its verdict. A failed probe refuses the
// lease (which gate releases) with compute_unit_mismatch; a probe whose exchange faulted
// returns the fault, and the worker's recovery begins when the lease is released.
func (s *Supervisor) probeGate(ctx context.Context, l *Lease) error {
	if l.probed {
		return nil
	}
	judge := l.m.spec.Probe
	for {
		s.mu.Lock()
		g := &l.sh.probe
		switch {
		case g.passed:
			s.mu.Unlock()
			return nil
		case g.failed != nil:
			err := g.failed
			s.mu.Unlock()
			l.Release()
			return err
		case g.running != nil:
			done := g.running
			s.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				l.Release()
				return refusal.New(refusal.DeadlineExceeded, l.m.spec.Lane, "the request's deadline passed while rung %d's placement probe ran", l.sh.rung)
			}
		}
		done := make(chan struct{})
		g.running = done
		s.mu.Unlock()

		device, cpu, err := l.Probe(ctx)
		var verdict error
		if err == nil {
			if verdict = judge(l.sh.rung, l.gen, device, cpu); verdict != nil {
				var r *refusal.Error
				if !errors.As(verdict, &r) {
					verdict = refusal.New(refusal.ComputeUnitMismatch, l.m.spec.Lane, "%v", verdict)
				}
			}
		}
		s.mu.Lock()
		g.running = nil
		close(done)
		switch {
		case err != nil:
			// Not judged: the next lease of this load probes again (after a fault there is
			// none; the replacement's shapes are new).
		case verdict != nil:
			g.failed = verdict
		default:
			g.passed = true
		}
		s.mu.Unlock()
		if err != nil || verdict != nil {
			l.Release()
			if err != nil {
				return err
			}
			return verdict
		}
		return nil
	}
}

// ProbeResident runs the placement probe on rung of lane if the rung is resident and not yet
// probed in its current load; it never loads anything. It reports whether the rung is
// resident and probed, and the probe's refusal if it failed.
func (s *Supervisor) ProbeResident(ctx context.Context, lane string, rung int) (bool, error) {
	l := s.LeaseResident(lane, rung)
	if l == nil {
		return false, nil
	}
	if err := s.probeGate(ctx, l); err != nil {
		return false, err
	}
	l.Release()
	return true, nil
}
