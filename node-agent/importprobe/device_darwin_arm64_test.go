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

package importprobe

import (
	"path/filepath"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/internal/workertest"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

// TestOnTheDeviceTheImportProbesTheRegisteredArtifact runs on a Mac with a Neural Engine (CI
// compiles it for darwin/arm64; a Mac owner runs it): a real worker on the ane backend loads the
// registered tiny artifact under the lane lock, and its smallest rung's probe passes.
func TestOnTheDeviceTheImportProbesTheRegisteredArtifact(t *testing.T) {
	if _, err := worker.NewANE(); err != nil {
		t.Skipf("no usable Neural Engine here: %v", err)
	}
	bin, cleanup, err := workertest.Build()
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	digest, err := artifact.FileSHA256(bin)
	if err != nil {
		t.Fatal(err)
	}
	state := t.TempDir()
	host := workerhost.New(workerhost.Config{Binary: bin, Backend: "ane", BinaryDigest: digest, StateDir: state, Log: testr.New(t)})
	probe, why := For(Config{Backend: "ane", Host: host, LockPath: filepath.Join(state, "ane.lock")})
	if probe == nil {
		t.Fatalf("no probe on this Mac: %s", why)
	}
	res, err := importer(t, probe, why).Import(aneArchive(t), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Probe == nil {
		t.Fatalf("the import did not probe: %s", res.NotProbed)
	}
	t.Logf("probe: rung %d, device %v, CPU reference %v, ratio %.2f", res.Probe.Rung, res.Probe.Device, res.Probe.CPU, res.Probe.Ratio())
}
