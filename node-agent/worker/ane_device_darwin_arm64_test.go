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
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// TestOnTheDeviceACachedRungLoadsWithoutCompilingAndMatchesItsGoldens runs on a Mac with a
// Neural Engine (it is built for darwin/arm64 in CI and run by a Mac owner): the tiny model's
// rung compiles (or loads, if aned holds it), then a second worker finds every layer cached,
// loads without writing or compiling, and embeds the goldens within the parity bound.
func TestOnTheDeviceACachedRungLoadsWithoutCompilingAndMatchesItsGoldens(t *testing.T) {
	b, err := worker.NewANE()
	var missing *ane.MissingError
	switch {
	case errors.As(err, &missing):
		t.Fatalf("this macOS build lacks part of the private API: %v", err)
	case err != nil:
		t.Skipf("no usable Neural Engine here: %v", err)
	}
	dir, _ := tinyArtifact(t)
	load := &pb.Load{Identity: "tiny", Layers: 3, Dimensions: 32, Rungs: []uint32{64}, ArtifactDir: dir}
	if _, err := b.Load(context.Background(), load); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Admit(context.Background(), 64); err != nil {
		t.Fatal(err)
	}
	second, err := worker.NewANE()
	if err != nil {
		t.Fatal(err)
	}
	cached, err := second.Load(context.Background(), load)
	if err != nil || len(cached) != 1 {
		t.Fatalf("the second worker's cache check: %v, %v", cached, err)
	}
	adm, err := second.Admit(context.Background(), 64)
	if err != nil || adm.Compiled != 0 || adm.CacheHit != 3 {
		t.Fatalf("the cached admission: %+v, %v", adm, err)
	}
	var goldens []aneartifact.Golden
	data, _ := os.ReadFile(filepath.Join(dir, aneartifact.GoldensFile))
	if err := json.Unmarshal(data, &goldens); err != nil {
		t.Fatal(err)
	}
	for _, g := range goldens {
		if g.Rung != 64 {
			continue
		}
		reply, err := second.Execute(context.Background(), &pb.Execute{Task: "embed", Rung: 64, Sequences: []*pb.Sequence{{TokenIds: g.Tokens}}})
		if err != nil {
			t.Fatal(err)
		}
		var worst float64
		for i, v := range reply.Vectors[0].Values {
			worst = max(worst, math.Abs(float64(v-g.Output[i])))
		}
		t.Logf("%d tokens: largest difference from the CPU reference %.5f", len(g.Tokens), worst)
		if worst > 0.02 {
			t.Fatalf("%d tokens: the device differs from the golden by %.4f", len(g.Tokens), worst)
		}
	}
	device, cpu, err := second.Probe(context.Background(), 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("probe: device %v, CPU reference %v, ratio %.2f", device, cpu, float64(device)/float64(cpu))
	_ = b.Evict(64)
	_ = second.Evict(64)
}
