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

package agent

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
)

// ProbeRatioLimit: a device time over this fraction of the CPU reference's means the model is
// not running on the Neural Engine.
const ProbeRatioLimit = artifact.ProbeRatioLimit

// probe is one rung's runtime placement probe.
type probe struct {
	gen         int64
	device, cpu time.Duration
}

func (p probe) ratio() float64 { return float64(p.device) / float64(p.cpu) }

// probeJudge is the lane's ModelSpec.Probe: the supervisor runs the placement probe on every
// load of a shape before its first lease, and this records the measurement and fails a rung
// that runs where it should not. The lane is then unloaded in the background (the probing
// lease is still held while the judgement is made).
func (a *Agent) probeJudge(l *lane, key string) func(rung int, gen int64, device, cpu time.Duration) error {
	return func(rung int, gen int64, device, cpu time.Duration) error {
		p := probe{gen: gen, device: device, cpu: cpu}
		a.mu.Lock()
		if l.probes == nil {
			l.probes = map[int]probe{}
		}
		l.probes[rung] = p
		a.mu.Unlock()
		if a.simulated() {
			// The stand-in has no device to measure: its ratio is the configured one.
			a.probeRatio.WithLabelValues(key, strconv.Itoa(rung), "simulated").Set(p.ratio())
			a.cfg.Log.Info("placement probe (simulated: the sim backend's configured ratio, nothing measured)", "lane", key, "rung", rung,
				"ratio", fmt.Sprintf("%.2f", p.ratio()))
		} else {
			a.probeRatio.WithLabelValues(key, strconv.Itoa(rung), "measured").Set(p.ratio())
			a.cfg.Log.Info("placement probe", "lane", key, "rung", rung, "deviceMicros", device.Microseconds(), "cpuMicros", cpu.Microseconds(),
				"ratio", fmt.Sprintf("%.2f", p.ratio()))
		}
		a.wake()
		if p.ratio() <= ProbeRatioLimit {
			return nil
		}
		msg := fmt.Sprintf("rung %d ran in %s on the device and %s on the CPU reference: a ratio of %.2f, over %.1f, so it is not running on the Neural Engine",
			rung, device, cpu, p.ratio(), ProbeRatioLimit)
		if a.simulated() {
			msg = fmt.Sprintf("rung %d's simulated probe (the sim backend's configured ratio, nothing measured) is %.2f, over %.1f: it stands for a model not running on the Neural Engine",
				rung, p.ratio(), ProbeRatioLimit)
		}
		err := &artifact.ComputeUnitMismatchError{Check: "probe", Message: msg}
		go a.probeFailed(context.Background(), l, key, err)
		return err
	}
}

// probeLane probes every resident rung of the lane not yet probed in its current load, so
// that requests rarely wait for a probe. It never loads anything.
func (a *Agent) probeLane(ctx context.Context, l *lane) {
	a.mu.Lock()
	key, loaded := l.key, l.loaded
	a.mu.Unlock()
	if !loaded {
		return
	}
	snap, ok := a.sup.Snapshot(key)
	if !ok || !snap.Running {
		return
	}
	for _, rung := range snap.Resident {
		if _, err := a.sup.ProbeResident(ctx, key, rung); err != nil {
			// A mismatch is handled by the judge; a fault is recovered by the supervisor, and
			// the replacement's shapes are probed afresh.
			a.cfg.Log.V(1).Info("the placement probe did not pass", "lane", key, "rung", rung, "error", err.Error())
			return
		}
	}
}

// probeLoop probes the lanes' newly resident rungs: after every scheduling pass and every
// StatusInterval. A lane whose probe fails is unloaded and fails with the measurement.
func (a *Agent) probeLoop(ctx context.Context) error {
	ticker := a.cfg.Clock.NewTicker(a.cfg.StatusInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		case <-a.probeKick:
		}
		a.mu.Lock()
		var lanes []*lane
		for _, l := range a.lanes {
			if l.loaded && l.state == laneReady {
				lanes = append(lanes, l)
			}
		}
		a.mu.Unlock()
		for _, l := range lanes {
			a.probeLane(ctx, l)
		}
	}
}

// probeFailed unloads a lane whose probe failed: explicit ane never runs elsewhere.
func (a *Agent) probeFailed(ctx context.Context, l *lane, key string, err error) {
	a.mu.Lock()
	current := l.loaded && l.key == key
	a.mu.Unlock()
	if !current {
		return // another rung's failure unloaded it already
	}
	a.cfg.Log.Info("the placement probe failed; the lane is unloaded", "lane", key, "error", err.Error())
	a.unload(ctx, l.placement, false)
	a.mu.Lock()
	l.retryAt = a.cfg.Clock.Now().Add(RetryInterval)
	a.mu.Unlock()
	a.fail(l, "ComputeUnitMismatch", err.Error())
	go func() {
		<-a.cfg.Clock.After(RetryInterval)
		a.reconcileAll()
	}()
}

// simulated reports whether the node's probes are the sim backend's: a configured ratio, with
// no time measured on any device.
func (a *Agent) simulated() bool { return a.cfg.Worker.Backend == v1.BackendSim }

// probeStatus is the lane's probes as the placement reports them; a simulated probe reports its
// ratio only, never times as if measured.
func probeStatus(probes map[int]probe, simulated bool) []v1.ProbeMeasurement {
	var out []v1.ProbeMeasurement
	for rung, p := range probes {
		m := v1.ProbeMeasurement{Rung: v1.Rung(rung), Simulated: simulated, Ratio: fmt.Sprintf("%.2f", p.ratio()), WorkerGeneration: p.gen}
		if !simulated {
			m.DeviceMicroseconds, m.CPUMicroseconds = p.device.Microseconds(), p.cpu.Microseconds()
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(x, y v1.ProbeMeasurement) int { return int(x.Rung - y.Rung) })
	return out
}
