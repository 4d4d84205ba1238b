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

package hollow

import (
	"context"
	"errors"
	"io"
	"maps"
	"slices"
	"sync"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

// Workers starts a hollow Mac's workers in this process, for the agent's own worker host
// (workerhost.Host, whose Launch it is): each generation is the real worker protocol loop
// (worker.Server) in front of the sim backend on the Mac's one simane.Machine (its compiler
// serving one layer at a time, its aned cache, its program limit, at the Machine's scale), its
// stdin, stdout and stderr in-memory pipes. Only the process is missing: everything on the
// agent's side of the pipes (framing, reply matching, timeouts, stderr lines, exit
// confirmation) is the worker host's; a crash or a kill closes the pipes where a process
// would exit, and the generation's programs are given back to the Machine as its exit would.
type Workers struct {
	Machine *simane.Machine
	// SigningID and BinaryDigest are what the worker reports in its hello.
	SigningID, BinaryDigest string
	Clock                   clock.Clock
	// Faults, if set, is a worker.ParseFaults list injected into every generation.
	Faults string

	mu   sync.Mutex
	live map[*generation]struct{}
}

// generation is one running worker: kill ends it; exited is closed once it has given its
// programs back.
type generation struct {
	kill   func()
	exited <-chan struct{}
}

// ExitAll ends every generation still running, as the agent process's exit ends its workers,
// and returns once each has given its programs back: an agent started again in the same
// process finds the Neural Engine as a restarted Mac's agent would. A stopping agent closes
// its workers only while its shutdown's time lasts; the others would otherwise run on,
// reading pipes nobody writes, and hold their programs for good.
func (ws *Workers) ExitAll() {
	ws.mu.Lock()
	gens := slices.Collect(maps.Keys(ws.live))
	ws.mu.Unlock()
	for _, g := range gens {
		g.kill()
		<-g.exited
	}
}

// Launch starts generation gen of spec's worker (workerhost.Config's Launch).
func (ws *Workers) Launch(spec supervisor.ModelSpec, gen int64) (workerhost.Streams, error) {
	faults, err := worker.ParseFaults(ws.Faults)
	if err != nil {
		return workerhost.Streams{}, err
	}
	stdin, agentIn := io.Pipe()
	agentOut, stdout := io.Pipe()
	agentErr, stderr := io.Pipe()
	ctx, stop := context.WithCancel(context.Background())
	var (
		once    sync.Once
		exitErr error
	)
	// exit ends the generation as a process's exit does: what it reads and writes breaks, and
	// its work in progress stops.
	exit := func(why error) {
		once.Do(func() {
			exitErr = why
			stop()
			_ = stdin.CloseWithError(why)
			_ = stdout.CloseWithError(why)
		})
	}
	backend := &worker.Sim{Machine: ws.Machine, SigningID: ws.SigningID, Clock: ws.Clock}
	srv := &worker.Server{
		Backend:  backend,
		Identity: worker.Identity{Backend: "sim", SigningIdentifier: ws.SigningID, BinaryDigest: ws.BinaryDigest},
		Stderr:   stderr,
		Faults:   faults,
		Exit:     func(int) { exit(errCrashed) },
	}
	exited := make(chan struct{})
	g := &generation{kill: func() { exit(errKilled) }, exited: exited}
	ws.mu.Lock()
	if ws.live == nil {
		ws.live = map[*generation]struct{}{}
	}
	ws.live[g] = struct{}{}
	ws.mu.Unlock()
	go func() {
		defer close(exited)
		err := srv.Serve(ctx, stdin, stdout)
		if err == nil {
			err = io.EOF // the agent closed its stdin: a clean exit
		}
		exit(err)
		// The programs it held are given back before its exit is confirmed, as the device
		// frees a process's when it exits: Serve handles one call at a time, so none is still
		// loading. An agent started again re-adopts its lanes on the same Machine.
		backend.Release()
		ws.mu.Lock()
		delete(ws.live, g)
		ws.mu.Unlock()
		_ = stderr.Close()
	}()
	wait := func() error {
		<-exited
		if errors.Is(exitErr, io.EOF) {
			return nil
		}
		return exitErr
	}
	return workerhost.Streams{Stdin: agentIn, Stdout: agentOut, Stderr: agentErr,
		Kill: func() error { g.kill(); return nil }, Wait: wait}, nil
}

var (
	errCrashed = errors.New("the hollow worker crashed")
	errKilled  = errors.New("the hollow worker was killed")
)
