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

package worker_test

import (
	"context"
	"errors"
	"testing"

	"k8s.io/utils/clock"

	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// A sim worker gives back the programs it holds when it is released (its process's exit, for
// the hollow Macs' workers, which run in the agent's process) and when it loads a model again;
// never another worker's.
func TestASimWorkerGivesBackItsProgramsWhenReleasedOrLoadedAgain(t *testing.T) {
	ctx := context.Background()
	m := simane.New(simane.Config{Clock: clock.RealClock{}, Scale: 1e-6})
	held := func() int { _, _, n := m.Stats(); return n }
	load := &pb.Load{Identity: "id", Layers: 3, Dimensions: 8, Rungs: []uint32{128, 256}}
	s := &worker.Sim{Machine: m, SigningID: "w", Clock: clock.RealClock{}}
	admit := func(s *worker.Sim, rungs ...uint32) {
		t.Helper()
		for _, r := range rungs {
			if _, err := s.Admit(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
	}

	if _, err := s.Load(ctx, load); err != nil {
		t.Fatal(err)
	}
	admit(s, 128, 256)
	if held() != 6 {
		t.Fatalf("two rungs of three layers loaded; the machine holds %d programs", held())
	}
	if _, err := s.Load(ctx, load); err != nil {
		t.Fatal(err)
	}
	if held() != 0 {
		t.Fatalf("the model loaded again; the machine still holds %d programs of the one before", held())
	}

	admit(s, 128)
	other := &worker.Sim{Machine: m, SigningID: "w", Clock: clock.RealClock{}}
	if _, err := other.Load(ctx, load); err != nil {
		t.Fatal(err)
	}
	admit(other, 256)
	s.Release()
	if held() != 3 {
		t.Fatalf("one of two workers released; the machine holds %d programs, want the other's 3", held())
	}
	s.Release()
	if held() != 3 {
		t.Fatalf("a worker released twice took %d of the other's programs", 3-held())
	}
	var we *worker.Error
	if _, err := s.Admit(ctx, 128); !errors.As(err, &we) || we.Code != "not_loaded" {
		t.Fatalf("a released worker admitted a rung: %v, want not_loaded", err)
	}
}
