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
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
)

// chipFamily is the chip every hollow Mac reports and every artifact is built for.
const chipFamily = "M4"

// Rungs are the rungs of every artifact InstallArtifact builds: lanes' ladders are drawn from
// them.
var Rungs = []int{128, 256, 512, 1024, 2048, 4096, 8192}

// InstallArtifact builds the sim artifact an identity certifies where the hollow Macs of its
// macOS build look for it, as an operator installs artifacts on a Mac; its outputs follow from
// the identity's name. One already there is kept.
func InstallArtifact(root string, id *v1.CertifiedIdentity) error {
	dir, err := artifact.Path(filepath.Join(root, string(id.Spec.MacOSBuild)), id.Spec.Model.Name, id.Spec.Model.Revision, id.Spec.ConversionPolicy.Name)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	if _, err := artifact.BuildSim(dir, artifact.SimSpec{Model: id.Spec.Model.Name, Revision: id.Spec.Model.Revision,
		CheckpointDigest: string(id.Spec.Model.CheckpointDigest),
		ConversionPolicy: artifact.ConversionPolicy{Name: id.Spec.ConversionPolicy.Name, Digest: string(id.Spec.ConversionPolicy.Digest)},
		ConverterVersion: artifact.SimConverterVersion, Platform: artifact.Platform{ChipFamily: chipFamily, MacOSBuild: string(id.Spec.MacOSBuild)},
		Rungs: Rungs, Layers: int(id.Spec.Model.Layers), Dimensions: int(id.Spec.Model.EmbeddingDimensions), Seed: id.Name}); err != nil {
		return fmt.Errorf("building the artifact of %s: %w", id.Name, err)
	}
	return nil
}
