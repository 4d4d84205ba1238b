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
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// ProbeTimeout bounds one placement probe. The probe runs on its own lease, apart from the
// request that started it, so a request that gives up does not abandon it half done.
var ProbeTimeout = 10 * time.Minute

// probeState is one load of a shape's placement-probe state. A shape is created by its
// admission and dropped by its eviction or its worker's end, so a reloaded shape is probed
// afresh.
type probeState struct {
	passed bool
	// failed is the judgement that refuses every lease of this load.
	failed error
	// running is the probe in flight; requests wait for it rather than probe twice.
	running *probeRun
}

// probeRun is one probe: done is closed when it ends; err is set if it could not measure.
type probeRun struct {
	done chan struct{}
	err  error
}

// probeGate holds a freshly granted lease until its shape's placement probe has passed. The
// first lease of a load starts the probe in the background, on a lease of its own; every
// request waits for its verdict within its own deadline. A failed probe refuses the lease
// (which probeGate releases) with compute_unit_mismatch, and every later one of the load; a
// probe that could not measure (its worker faulted) fails the requests that waited for it,
// and the worker's recovery begins when the probe's lease is released.
func (s *Supervisor) probeGate(ctx context.Context, l *Lease) error {
	if l.probed {
		return nil
	}
	var waited *probeRun
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
		case waited != nil && g.running == nil && waited.err != nil:
			s.mu.Unlock()
			l.Release()
			return waited.err
		case g.running == nil:
			// Start the probe on a lease of its own: the shape stays resident while it runs.
			l.sh.leases++
			pl := &Lease{s: s, requestID: "placement-probe", m: l.m, sh: l.sh, stream: l.stream, gen: l.gen, probed: true}
			g.running = &probeRun{done: make(chan struct{})}
			go s.runProbe(pl, g, g.running)
		}
		waited = g.running
		s.mu.Unlock()
		select {
		case <-waited.done:
		case <-ctx.Done():
			l.Release()
			return refusal.New(refusal.DeadlineExceeded, l.m.spec.Lane, "the request's deadline passed while rung %d's placement probe ran", l.sh.rung)
		}
	}
}

// runProbe measures the shape on pl, has the lane's judge rule on it, and records the verdict.
func (s *Supervisor) runProbe(pl *Lease, g *probeState, run *probeRun) {
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	device, cpu, err := pl.Probe(ctx)
	var verdict error
	if err == nil {
		if verdict = pl.m.spec.Probe(pl.sh.rung, pl.gen, device, cpu); verdict != nil {
			var r *refusal.Error
			if !errors.As(verdict, &r) {
				verdict = refusal.New(refusal.ComputeUnitMismatch, pl.m.spec.Lane, "%v", verdict)
			}
		}
	}
	// The probe's lease goes first: if the probe faulted, its generation is leased no more
	// before anyone can start another probe on it.
	pl.Release()
	s.mu.Lock()
	switch {
	case err != nil:
		// Not judged: the requests that waited fail with the error; the next lease of this
		// load (if its worker lives) probes again.
		run.err = err
	case verdict != nil:
		g.failed = verdict
	default:
		g.passed = true
	}
	g.running = nil
	close(run.done)
	s.mu.Unlock()
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
