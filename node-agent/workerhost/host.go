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

// Package workerhost starts synapse-ane-worker processes and speaks protocol v3 to them: it
// implements the supervisor's Spawner and Worker. Each worker inherits the lane lock, its
// stderr lines are logged, its exit is confirmed by waiting on the process, and every call is
// bounded in time: a call that times out kills the worker and is a fault of unknown outcome.
// Everything but starting the process speaks to the worker's streams (Streams), so a harness
// that runs the worker in process (the scale test's hollow Macs) runs this code unchanged.
package workerhost

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// Config configures the host.
type Config struct {
	// Binary is the synapse-ane-worker executable.
	Binary string
	// Backend is ane or sim; it is passed as given, and a worker that cannot run it refuses.
	Backend string
	// SigningIdentifier is the worker's code-signing identifier (its default if empty).
	SigningIdentifier string
	// BinaryDigest, if set, is the digest the node reports for the worker binary: a worker
	// whose hello reports another (the binary was replaced on disk) is refused, so a node never
	// runs a binary other than the one its identities were matched against.
	BinaryDigest string
	// StateDir holds the sim stand-in's aned cache.
	StateDir string
	// SimScale scales the stand-in's times.
	SimScale float64
	// Lock is the lane lock, inherited by every worker.
	Lock *os.File
	// Env, if set, adds to a worker's environment (for example injected faults), per lane and
	// generation.
	Env func(lane string, gen int64) []string
	Log logr.Logger
	// Clock times the calls' bounds (a call's timeout runs a function: the exchange itself runs
	// on the caller's goroutine).
	Clock clock.WithDelayedExecution
	// CallTimeout bounds a load, an execution, an eviction or an inventory; AdmitTimeout an
	// admission, which may compile for minutes.
	CallTimeout, AdmitTimeout time.Duration
	// Launch, if set, starts each worker in place of running Binary, and the host speaks to
	// the streams it returns as to a process's (the scale test's hollow Macs run the worker in
	// process). Binary, SigningIdentifier, StateDir, SimScale, Lock and Env are then unused.
	Launch func(spec supervisor.ModelSpec, gen int64) (Streams, error)
}

// Host starts workers.
type Host struct {
	mu  sync.Mutex
	cfg Config
	// onLine, if set, sees every stderr line of every worker (see OnStderr).
	onLine func(lane string, gen int64, line string)
}

// OnStderr makes every stderr line of the workers started from now on reach f as well as the
// log, so that the agent can tell a worker's warnings from its progress lines and report them.
func (h *Host) OnStderr(f func(lane string, gen int64, line string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onLine = f
}

// InheritLock makes every worker started from now on inherit the lane lock f.
func (h *Host) InheritLock(f *os.File) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cfg.Lock = f
}

// New returns a host.
func New(cfg Config) *Host {
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	if cfg.AdmitTimeout == 0 {
		cfg.AdmitTimeout = 30 * time.Minute
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Host{cfg: cfg}
}

// Spawn starts generation gen of spec's worker, says hello and loads the model.
func (h *Host) Spawn(ctx context.Context, spec supervisor.ModelSpec, gen int64) (supervisor.Worker, []int, error) {
	h.mu.Lock()
	cfg, onLine := h.cfg, h.onLine
	h.mu.Unlock()
	launch := cfg.Launch
	if launch == nil {
		launch = cfg.startProcess
	}
	s, err := launch(spec, gen)
	if err != nil {
		return nil, nil, err
	}
	log := cfg.Log.WithValues("lane", spec.Lane, "generation", gen)
	if s.Pid != 0 {
		log = log.WithValues("pid", s.Pid)
	}
	var line func(string)
	if onLine != nil {
		line = func(l string) { onLine(spec.Lane, gen, l) }
	}
	p := attach(s, cfg, log, line)

	resp, err := p.call(ctx, cfg.CallTimeout, &pb.Request{Body: &pb.Request_Hello{Hello: &pb.Hello{ProtocolVersion: 3}}})
	if err == nil {
		hello := resp.GetHello()
		switch {
		case hello == nil || hello.Backend != cfg.Backend:
			err = fmt.Errorf("the worker answered hello with %v, want backend %s", resp, cfg.Backend)
		case cfg.BinaryDigest != "" && hello.BinaryDigest != cfg.BinaryDigest:
			err = fmt.Errorf("the worker binary is %s, not the %s the node reports (was it replaced?); restart the agent so the node reports what it runs",
				hello.BinaryDigest, cfg.BinaryDigest)
		}
	}
	var loaded *pb.Loaded
	if err == nil {
		rungs := make([]uint32, len(spec.Rungs))
		for i, r := range spec.Rungs {
			rungs[i] = uint32(r)
		}
		resp, err = p.call(ctx, cfg.CallTimeout, &pb.Request{Body: &pb.Request_Load{Load: &pb.Load{
			Lane: spec.Lane, Identity: spec.Identity, Model: spec.Model, Layers: uint32(spec.Layers),
			Dimensions: uint32(spec.Dimensions), Rungs: rungs, ArtifactDir: spec.ArtifactDir}}})
		if err == nil && resp.GetLoaded() == nil {
			err = fmt.Errorf("the worker answered load with %v", resp)
		}
		loaded = resp.GetLoaded()
	}
	if err != nil {
		_ = p.Kill()
		<-p.exited
		return nil, nil, fmt.Errorf("worker generation %d of lane %s did not start: %w%s", gen, spec.Lane, err, p.lastWords())
	}
	// An older worker sends no ane_cached_shapes: nil, every rung is predicted as a compile.
	var cached []int
	if c := loaded.GetAneCachedShapes(); c != nil {
		cached = []int{}
		for _, r := range c.Rungs {
			cached = append(cached, int(r))
		}
	}
	return p, cached, nil
}
