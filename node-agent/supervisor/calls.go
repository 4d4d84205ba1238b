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
	"fmt"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// The executors of the core's worker effects. Each runs on a goroutine of its own, holds the
// generation's stream for its call, and reports the outcome back to the owner; a panic in a
// worker call is reported as an error, so the core observes every call it started.

func (s *Supervisor) spawn(ctx context.Context, fx residency.Spawn) {
	var w Worker
	var cached []int
	err := observe(func() error {
		var err error
		w, cached, err = s.cfg.Spawner.Spawn(ctx, fx.Spec, fx.Gen.N)
		return err
	})
	var conn any
	if err == nil {
		conn = &stream{w: w, gen: fx.Gen}
	}
	s.report(residency.Spawned{Gen: fx.Gen, Conn: conn, Cached: cached, Err: err})
}

func (s *Supervisor) admit(fx residency.Admit) {
	ev := Event{RequestID: fx.RequestID, Lane: fx.Gen.Lane, Rung: fx.Rung, Ticket: uint64(fx.Ticket), RPC: "admit"}
	var rpcStart time.Time
	var got Admission
	err := observe(func() error {
		return s.traced(streamOf(fx.Gen), ev, func(w Worker) error {
			// Compile time is learned from the moment the admission reaches the worker,
			// never from time spent waiting for its stream.
			rpcStart = s.clk.Now()
			var err error
			got, err = w.Admit(withProgress(context.Background(), fx.Progress), fx.Rung)
			return err
		})
	})
	var took time.Duration
	if !rpcStart.IsZero() {
		took = s.clk.Now().Sub(rpcStart)
	}
	s.report(residency.Admitted{Gen: fx.Gen, Job: fx.Job, Load: fx.Load, Admission: got, Took: took, Err: err})
}

func (s *Supervisor) evict(fx residency.Evict) {
	ev := Event{Lane: fx.Gen.Lane, Rung: fx.Rung, RPC: "evict"}
	err := observe(func() error {
		return s.traced(streamOf(fx.Gen), ev, func(w Worker) error { return w.Evict(context.Background(), fx.Rung) })
	})
	s.report(residency.Evicted{Gen: fx.Gen, Load: fx.Load, Attempt: fx.Attempt, Err: err})
}

// probe runs the placement probe on the core's lease. It is bounded by ProbeTimeout, whoever
// waits for it. The lane's judge rules on the measurement on the owner goroutine, as the
// outcome is applied, so its verdict reaches the requests that waited before anything the judge
// sets off (the agent unloads a lane whose probe failed) can reach the owner.
func (s *Supervisor) probe(fx residency.ProbeShape) {
	ctx, cancel := context.WithTimeout(context.Background(), ProbeTimeout)
	defer cancel()
	ev := Event{RequestID: "placement-probe", Lane: fx.Gen.Lane, Rung: fx.Rung, RPC: "probe"}
	var device, cpu time.Duration
	err := observe(func() error {
		return s.traced(streamOf(fx.Gen), ev, func(w Worker) error {
			var err error
			device, cpu, err = w.Probe(ctx, fx.Rung)
			return err
		})
	})
	s.send(context.Background(), input{in: residency.Probed{Gen: fx.Gen, Load: fx.Load, Attempt: fx.Attempt, Cell: fx.Cell, Device: device, CPU: cpu, Err: err},
		judge: fx.Judge})
}

// confirmExit closes the worker's channel, waits for the process to exit (killing it after
// ExitGrace) and reports the confirmed exit.
func (s *Supervisor) confirmExit(fx residency.ConfirmExit) {
	w := streamOf(fx.Gen).w
	_ = observe(w.Close)
	select {
	case <-w.Exited():
	case <-s.clk.After(ExitGrace):
		_ = observe(w.Kill)
		<-w.Exited()
	}
	s.report(residency.Exited{Gen: fx.Gen})
}

// inventory asks the worker for its resident rungs. The call is not tied to whoever asked for
// the observation: giving up on an observation must never cut a serving worker's call short
// (which would kill it); the worker's own call bound limits it.
func (s *Supervisor) inventory(fx residency.Inventory) {
	var rungs []int
	err := observe(func() error {
		return streamOf(fx.Gen).do(func(w Worker) error {
			var err error
			rungs, err = w.Inventory(context.Background())
			return err
		})
	})
	s.report(residency.Inventoried{Observation: fx.Observation, Gen: fx.Gen, Rungs: rungs, Err: err})
}

// observe runs a worker call and turns a panic into an error.
func observe(call func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("worker call panicked: %v", r)
		}
	}()
	return call()
}
