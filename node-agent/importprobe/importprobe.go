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

// Package importprobe is the runtime placement probe an artifact import runs at the registered
// path before it publishes (the seed's fetch path: one probe at the registered path). On a Mac
// whose workers run the ane backend, a worker is started on the artifact as the agent would
// start one, under the machine's lane lock, its smallest rung is admitted and timed on the
// device against the CPU reference, and a ratio over artifact.ProbeRatioLimit fails the import.
// Anywhere else there is no device to probe: the import says it did not probe, and the agent's
// probe of every load remains the gate.
package importprobe

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// Host starts the probe's worker (workerhost.Host): it inherits the lane lock.
type Host interface {
	supervisor.Spawner
	InheritLock(f *os.File)
}

// Config is this machine, as the import sees it.
type Config struct {
	// Backend is the machine's worker backend (ane or sim).
	Backend string
	// Host starts workers; LockPath is the machine's lane lock (the agent's --lock-path).
	Host     Host
	LockPath string
	// Timeout bounds the whole probe: the worker's start, the admission (which may compile)
	// and the measurement. 30 minutes if zero.
	Timeout time.Duration
	// Platform is GOOS/GOARCH ("" for this process's).
	Platform string
	// Clock bounds the wait for the worker's exit (the real clock if nil).
	Clock clock.Clock
}

// For is the importer's probe hook for this machine, or nil and why it does not probe.
func For(c Config) (probe func(dir string, m *artifact.Manifest) (*artifact.ProbeReport, error), why string) {
	platform := c.Platform
	if platform == "" {
		platform = runtime.GOOS + "/" + runtime.GOARCH
	}
	switch {
	case c.Backend != "ane":
		return nil, fmt.Sprintf("this machine's workers run the %q backend, which has no Neural Engine to probe; the agent's probe of every load remains the gate", c.Backend)
	case platform != "darwin/arm64":
		return nil, fmt.Sprintf("this is %s, not macOS on Apple silicon: there is no Neural Engine to probe; the agent's probe of every load remains the gate", platform)
	case c.Host == nil || c.LockPath == "":
		return nil, "no worker or lane lock was given (--worker-binary, --state-dir): not probed; the agent's probe of every load remains the gate"
	}
	timeout := c.Timeout
	if timeout == 0 {
		timeout = 30 * time.Minute
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return func(dir string, m *artifact.Manifest) (*artifact.ProbeReport, error) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		return runProbe(ctx, c, dir, m)
	}, ""
}

// runProbe runs the probe of m's smallest rung on a worker loaded from dir.
func runProbe(ctx context.Context, c Config, dir string, m *artifact.Manifest) (rep *artifact.ProbeReport, err error) {
	lock, err := lanelock.Acquire(c.LockPath)
	if errors.Is(err, lanelock.ErrHeld) {
		// A live lane's lock is never bypassed: the agent that holds it probes every load.
		return &artifact.ProbeReport{NotRun: "the Neural Engine's lane lock is held (an agent is running): the import did not probe; the agent probes every load of the artifact"}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the placement probe: %w", err)
	}
	defer lock.Release()
	c.Host.InheritLock(lock.File())
	rung := m.Rungs[0]
	spec := supervisor.ModelSpec{Lane: "import/" + m.Model, Identity: m.Model + "/" + m.Revision, Model: m.Model, Dimensions: m.Dimensions,
		Layers: m.Layers, Rungs: []int{rung}, MaxResidentShapes: 1, ArtifactDir: dir}
	w, _, err := c.Host.Spawn(ctx, spec, 1)
	if err != nil {
		return nil, fmt.Errorf("the placement probe's worker: %w", err)
	}
	defer func() {
		// The worker exits with its channel closed; one that does not is killed, and its
		// exit is waited for (bounded) so that nothing outlives the import.
		_ = w.Close()
		select {
		case <-w.Exited():
		case <-c.Clock.After(10 * time.Second):
			_ = w.Kill()
			<-w.Exited()
		}
	}()
	if _, err := w.Admit(ctx, rung); err != nil {
		return nil, fmt.Errorf("the placement probe's admission of rung %d: %w", rung, err)
	}
	device, cpu, err := w.Probe(ctx, rung)
	if err != nil {
		return nil, fmt.Errorf("the placement probe of rung %d: %w", rung, err)
	}
	rep = &artifact.ProbeReport{Rung: rung, Device: device, CPU: cpu}
	if rep.Ratio() > artifact.ProbeRatioLimit {
		return rep, &artifact.ComputeUnitMismatchError{Dir: dir, Check: "probe", Message: fmt.Sprintf(
			"rung %d ran in %s on the device and %s on the CPU reference: a ratio of %.2f, over %.1f, so it is not running on the Neural Engine",
			rung, device, cpu, rep.Ratio(), artifact.ProbeRatioLimit)}
	}
	_ = w.Evict(ctx, rung)
	return rep, nil
}
