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
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

func TestTheSimBackendComputesWhatItsArtifactHolds(t *testing.T) {
	d := "sha256:" + strings.Repeat("ab", 32)
	dir := filepath.Join(t.TempDir(), "a")
	if _, err := artifact.BuildSim(dir, artifact.SimSpec{Model: "m", Revision: "r", CheckpointDigest: d,
		ConversionPolicy: artifact.ConversionPolicy{Name: "p", Digest: d}, ConverterVersion: "sim-1", Platform: artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"},
		Rungs: []int{128}, Layers: 2, Dimensions: 8, Seed: "the artifact's seed"}); err != nil {
		t.Fatal(err)
	}
	s := &worker.Sim{Machine: simane.New(simane.Config{Clock: clock.RealClock{}, Scale: 1e-6}), SigningID: "w", Clock: clock.RealClock{}}
	ctx := context.Background()
	if _, err := s.Load(ctx, &pb.Load{Identity: "id", Layers: 2, Dimensions: 8, Rungs: []uint32{128}, ArtifactDir: dir}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Admit(ctx, 128); err != nil {
		t.Fatal(err)
	}
	reply, err := s.Execute(ctx, &pb.Execute{Rung: 128, Task: "embed", Sequences: []*pb.Sequence{{TokenIds: []uint32{5, 6}}}})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(reply.Vectors[0].Values, worker.Embed("the artifact's seed", 8, []uint32{5, 6})) {
		t.Fatal("the outputs do not follow from the artifact")
	}

	// An artifact of another shape than the agent asked for is refused at load.
	_, err = s.Load(ctx, &pb.Load{Identity: "id", Layers: 2, Dimensions: 16, Rungs: []uint32{128}, ArtifactDir: dir})
	var we *worker.Error
	if !errors.As(err, &we) || we.Code != "invalid_model" {
		t.Fatalf("got %v, want invalid_model", err)
	}
}
