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

package scale

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
)

// writeTail is how long a storm's writes are still counted after it reconverged: the longest a
// lane's status write is deferred to be coalesced with the next (placement.ProgressInterval),
// twice over. The controller's queue depth does not show a deferred write (it waits in the
// queue's delay heap, with every node's next Lease check), so without the tail a resync that
// wrote a lane's status a few seconds after it looked idle counted as writing nothing.
const writeTail = 2 * placement.ProgressInterval

// settled reports whether the fleet is as it should be with dead Macs gone: every lane placed on
// live Macs, Ready, and where it may be.
func (f *fleet) settled(dead map[string]bool) (bool, string) {
	st, err := f.state()
	if err != nil {
		return false, err.Error()
	}
	if ok, how := st.placed(f.lanes, dead); !ok {
		return false, how
	}
	if ok, how := st.ready(f.lanes); !ok {
		return false, how
	}
	if _, err := f.check(st, dead); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// idle reports whether the controller has reconciled at least n lanes since it started and has
// nothing queued.
func (f *fleet) idle(ctx context.Context, n int) (bool, string) {
	m, err := f.ctrl.metrics(ctx)
	if err != nil {
		return false, err.Error()
	}
	done, q := reconciles(m, "lane.placement"), queued(m)
	return done >= float64(n) && q == 0, fmt.Sprintf("%.0f lanes reconciled, %.0f queued", done, q)
}

// stormKill kills a tenth of the Macs at once, as a power cut would, and measures until their
// lanes are placed elsewhere and Ready.
func (f *fleet) stormKill(ctx context.Context, rep *report, dead map[string]bool) (storm, error) {
	s := storm{Name: "10% of Macs killed"}
	before, err := f.cp.apiRequests(ctx)
	if err != nil {
		return s, err
	}
	start := time.Now()
	var wg sync.WaitGroup
	for i, spec := range f.specs {
		if i%10 != 5 {
			continue
		}
		dead[spec.Name] = true
		m := f.macs[spec.Name]
		delete(f.macs, spec.Name)
		wg.Add(1)
		go func() { defer wg.Done(); _ = m.Kill(time.Minute) }()
	}
	wg.Wait()
	f.logf("killed %d Macs", len(dead))
	// The controller forces lost nodes' placements away at most EvictionRate nodes a second.
	rate := f.sc.EvictionRate
	if rate <= 0 {
		rate = lifecycle.DefaultEvictionRate
	}
	limit := f.sc.Grace + f.sc.Eviction + time.Duration(float64(len(dead))/rate*float64(time.Second)) + 10*time.Minute
	err = f.waitFor(ctx, "the dead Macs' lanes placed elsewhere", limit, func() (bool, string) {
		st, err := f.state()
		if err != nil {
			return false, err.Error()
		}
		return st.placed(f.lanes, dead)
	})
	if err != nil {
		return s, err
	}
	s.ReplacedSeconds = time.Since(start).Seconds()
	f.logf("re-placed in %.1fs (%s)", s.ReplacedSeconds, f.controllerPeak())
	f.heapProfile(ctx, "controller-replaced.heap.pprof")
	if err := f.waitFor(ctx, "every lane Ready again", limit, func() (bool, string) { return f.settled(dead) }); err != nil {
		return s, err
	}
	return s, f.endStorm(ctx, &s, rep, before, start)
}

// stormController restarts the controller: a resync with nothing to change must write nothing.
func (f *fleet) stormController(ctx context.Context, rep *report, dead map[string]bool) (storm, error) {
	s := storm{Name: "controller restarted"}
	before, err := f.cp.apiRequests(ctx)
	if err != nil {
		return s, err
	}
	start := time.Now()
	if err := f.ctrl.stop(); err != nil {
		return s, err
	}
	if err := f.ctrl.start(); err != nil {
		return s, err
	}
	err = f.waitFor(ctx, "the new controller to resync every lane", 10*time.Minute, func() (bool, string) {
		if ok, how := f.idle(ctx, len(f.lanes)); !ok {
			return false, how
		}
		return f.settled(dead)
	})
	if err != nil {
		return s, err
	}
	return s, f.endStorm(ctx, &s, rep, before, start)
}

// stormAPIServer kills the API server and starts it again; etcd keeps everything.
func (f *fleet) stormAPIServer(ctx context.Context, rep *report, dead map[string]bool) (storm, error) {
	s := storm{Name: "API server restarted"}
	start := time.Now()
	f.apiServerRestarted = true
	if err := f.cp.restartAPIServer(); err != nil {
		return s, err
	}
	back := time.Now()
	f.logf("the API server is back after %.1fs", back.Sub(start).Seconds())
	// Reconverged once every Mac has renewed its Lease through the new API server, and the
	// controller and the fleet are as before. Its counters start again from zero.
	err := f.waitFor(ctx, "the fleet to reconverge", 10*time.Minute, func() (bool, string) {
		if ok, how := f.leasesRenewedSince(back, dead); !ok {
			return false, how
		}
		if ok, how := f.macsReady(dead); !ok {
			return false, how
		}
		if ok, how := f.idle(ctx, 0); !ok {
			return false, how
		}
		return f.settled(dead)
	})
	if err != nil {
		return s, err
	}
	return s, f.endStorm(ctx, &s, rep, requestCounts{}, start)
}

// endStorm records a storm's time to reconverge and the writes it cost beyond the steady rate
// of the Macs alive.
func (f *fleet) endStorm(ctx context.Context, s *storm, rep *report, before requestCounts, start time.Time) error {
	s.ReconvergeSeconds = time.Since(start).Seconds()
	select {
	case <-time.After(writeTail):
	case <-ctx.Done():
		return ctx.Err()
	}
	end := time.Now()
	after, err := f.cp.apiRequests(ctx)
	if err != nil {
		return err
	}
	d := after.minus(before)
	s.APIRequests = d
	s.APIWrites = d.total(writeVerbs...)
	if rep.Steady.WindowSeconds > 0 {
		// At rest the writes are the Macs' Lease renewals, one stream per Mac, and a few of the
		// control plane's and the controller's own Leases: after Macs were killed, what is steady
		// is mostly the renewals of those still alive.
		alive := float64(f.sc.Nodes-len(f.dead)) / float64(f.sc.Nodes)
		s.ExtraAPIWrites = s.APIWrites - rep.Steady.APIWrites/rep.Steady.WindowSeconds*alive*end.Sub(start).Seconds()
	}
	if err := f.audit.read(); err != nil {
		return err
	}
	s.ControllerWrites = f.audit.between(start, end)
	s.LeaderElectionWrites = f.audit.leaderElection(start, end)
	f.logf("%s: reconverged in %.1fs, %.0f API writes (%.0f over the steady rate), controller writes %v (until %s after; %s)",
		s.Name, s.ReconvergeSeconds, s.APIWrites, s.ExtraAPIWrites, s.ControllerWrites, writeTail, f.controllerPeak())
	return nil
}
