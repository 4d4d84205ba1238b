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

package workerhost

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// TestASupervisedWorkerThatCrashesWhileAdmittingIsRestartedExactlyOnce runs the supervisor
// over real worker processes: the first generation crashes on its first admission, the request
// is answered engine_crashed, exactly one replacement starts, and it serves.
func TestASupervisedWorkerThatCrashesWhileAdmittingIsRestartedExactlyOnce(t *testing.T) {
	var mu sync.Mutex
	spawned := map[int64]int{}
	h := newHost(t, func(c *Config) {
		c.Env = func(lane string, gen int64) []string {
			mu.Lock()
			defer mu.Unlock()
			spawned[gen]++
			if gen == 1 {
				return []string{"SYNAPSE_WORKER_FAULTS=crash:admit:1"}
			}
			return nil
		}
	})
	s := supervisor.New(supervisor.Config{Clock: clock.RealClock{}, Spawner: h, Log: testr.New(t)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	if err := s.LoadModel(ctx, spec); err != nil {
		t.Fatal(err)
	}

	_, err := s.Acquire(ctx, spec.Lane, 128, time.Time{})
	if refusal.CodeOf(err) != refusal.EngineCrashed {
		t.Fatalf("got %v, want engine_crashed", err)
	}
	// The retry is served by the replacement.
	var l supervisor.Lease
	for attempt := 0; ; attempt++ {
		l, err = s.Acquire(ctx, spec.Lane, 128, time.Time{})
		if err == nil {
			break
		}
		if refusal.CodeOf(err) != refusal.EngineCrashed || attempt == 100 {
			t.Fatal(err)
		}
	}
	payload, _ := proto.Marshal(&pb.Execute{Task: "embed", Sequences: []*pb.Sequence{{TokenIds: []uint32{101, 102}}}})
	raw, err := l.Exchange(ctx, payload)
	l.Release()
	if err != nil {
		t.Fatal(err)
	}
	reply := &pb.Reply{}
	if err := proto.Unmarshal(raw, reply); err != nil || len(reply.Vectors) != 1 || l.Generation() != 2 {
		t.Fatalf("reply %v (%v) from generation %d", reply, err, l.Generation())
	}
	mu.Lock()
	defer mu.Unlock()
	if spawned[1] != 1 || spawned[2] != 1 || len(spawned) != 2 {
		t.Fatalf("spawned %v, want generation 1 and exactly one replacement", spawned)
	}
	if err := s.Retire(ctx, spec.Lane); err != nil {
		t.Fatal(err)
	}
	if s.Used() != 0 {
		t.Fatalf("charged %d after retirement", s.Used())
	}
}

func TestTheFirstLoadTakesTheLaneLockAndWorkersInheritIt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ane-lane.lock")
	s := supervisor.New(supervisor.Config{Clock: clock.RealClock{}, Spawner: newHost(t), Log: testr.New(t), LockPath: path})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// Another agent already holds the device: the load is refused, never run beside it.
	other, err := lanelock.Acquire(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.LoadModel(ctx, spec); !errors.Is(err, lanelock.ErrHeld) {
		t.Fatalf("loading beside another lock holder: %v", err)
	}
	other.Release()

	if err := s.LoadModel(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := lanelock.Acquire(path); !errors.Is(err, lanelock.ErrHeld) {
		t.Fatalf("the lane lock is free after a load: %v", err)
	}
	if err := s.Retire(ctx, spec.Lane); err != nil {
		t.Fatal(err)
	}
}
