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

	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// ErrObservationOff: certify observation is not enabled; ordinary serving records nothing.
var ErrObservationOff = residency.ErrObservationOff

// LoadModel starts the model's first worker generation. It returns once the worker has loaded,
// or failed to. A model retired while its worker starts is closed unconnected and LoadModel
// fails.
func (s *Supervisor) LoadModel(ctx context.Context, spec ModelSpec) error {
	if err := s.takeLock(spec.Lane); err != nil {
		return err
	}
	l := &loadCall{ctx: ctx, done: make(chan error, 1)}
	if !s.send(ctx, input{in: residency.Load{Spec: spec}, load: l}) {
		return s.stoppedOr(ctx, "loading lane %s", spec.Lane)
	}
	// The load finishes whether or not the caller waits: the worker's start is bounded by ctx
	// (a cancelled start fails it), and the answer tells which.
	select {
	case err := <-l.done:
		return err
	case <-s.done:
		select {
		case err := <-l.done:
			return err
		default:
			return s.stoppedOr(ctx, "loading lane %s", spec.Lane)
		}
	}
}

// takeLock takes the machine's lane lock on the first direct-ANE load; workers inherit it, so
// it stays held while any of them can still use the device. A live lane's lock is never
// bypassed: another holder is an error.
func (s *Supervisor) takeLock(lane string) error {
	s.lockMu.Lock()
	defer s.lockMu.Unlock()
	if s.lock != nil || s.cfg.LockPath == "" {
		return nil
	}
	lock, err := lanelock.Acquire(s.cfg.LockPath)
	if err != nil {
		return fmt.Errorf("loading lane %s: %w", lane, err)
	}
	s.lock = lock
	if li, ok := s.cfg.Spawner.(LockInheritor); ok {
		li.InheritLock(lock.File())
	}
	return nil
}

// Retire unloads lane: it stops new leases and replacement spawning, answers the lane's
// waiting requests lane_retired and drops its queued admissions, drains in-flight work, closes
// the worker's channel and confirms its exit, and only then refunds its reservations. It
// returns when all of that is done or ctx ends; an unconfirmed exit keeps the resources
// charged.
func (s *Supervisor) Retire(ctx context.Context, lane string) error {
	done := make(chan error, 1)
	if !s.send(ctx, input{in: residency.Retire{Lane: lane}, retired: done}) {
		return s.stoppedOr(ctx, "retiring lane %s", lane)
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		select {
		case err := <-done:
			return err
		default:
			return s.stoppedOr(ctx, "retiring lane %s", lane)
		}
	}
}

// Prewarm loads rungs of lane in the background once the lane is ready (its self-check passed):
// at the lowest priority, one admission at a time, only while no request waits and the lane is
// quiet, only into free budget and free shape slots, never evicting. The first rung that does
// not fit ends it. Each worker generation is prewarmed once; a replacement is prewarmed again.
func (s *Supervisor) Prewarm(lane string, rungs []int) error {
	snap, ok := s.Snapshot(lane)
	switch {
	case !ok:
		return refusal.New(refusal.UnknownLane, lane, "no such lane is loaded on this node")
	case snap.Retiring:
		return refusal.New(refusal.LaneRetired, lane, "the lane is being unloaded from this node")
	}
	if !s.send(context.Background(), input{in: residency.Prewarm{Lane: lane, Rungs: rungs}}) {
		return s.stoppedOr(context.Background(), "prewarming lane %s", lane)
	}
	return nil
}

// Observe asks every worker for its inventory, once no admission or eviction is in flight, and
// returns the inventories with the independently kept admission count. A worker that does not
// answer (or cannot: it is loading or recovering) is recorded without an inventory and with
// the reason, never with an empty one. Giving up on ctx does not cut the workers' calls short.
func (s *Supervisor) Observe(ctx context.Context) (certify.Observation, error) {
	if !s.cfg.CertifyObservation {
		return certify.Observation{}, ErrObservationOff
	}
	c := make(chan observed, 1)
	id := s.obsIDs.Add(1)
	if !s.send(ctx, input{in: residency.Observe{ID: id}, obs: c}) {
		return certify.Observation{}, s.stoppedOr(ctx, "observing")
	}
	select {
	case o := <-c:
		return o.obs, o.err
	case <-ctx.Done():
		// Withdrawn: an observation not yet asked of the workers is dropped, so abandoned ones
		// do not pile up behind the barrier.
		s.send(context.Background(), input{in: residency.Observe{ID: id, Withdraw: true}})
		return certify.Observation{}, ctx.Err()
	case <-s.done:
		select {
		case o := <-c:
			return o.obs, o.err
		default:
			return certify.Observation{}, s.stoppedOr(ctx, "observing")
		}
	}
}

func (s *Supervisor) stoppedOr(ctx context.Context, format string, args ...any) error {
	if err := s.stopped(); err != nil {
		return fmt.Errorf(format+": the compile scheduler stopped: %w", append(args, err)...)
	}
	return fmt.Errorf(format+": %w", append(args, ctx.Err())...)
}

// Snapshot returns lane's state, and false if it is not loaded.
func (s *Supervisor) Snapshot(lane string) (LaneSnapshot, bool) { return s.view.Load().Lane(lane) }

// Prewarmed returns the lane's prewarm summary, and false if it has none.
func (s *Supervisor) Prewarmed(lane string) (PrewarmSummary, bool) {
	return s.view.Load().Prewarm(lane)
}

// Lanes lists the loaded lanes.
func (s *Supervisor) Lanes() []string { return s.view.Load().Lanes() }

// Node returns the machine-wide picture.
func (s *Supervisor) Node() NodeSnapshot { return s.view.Load().Node() }

// Used reports the charged layer executables.
func (s *Supervisor) Used() int { return s.view.Load().Node().Used }
