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

package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// SimSpec is what a sim artifact is built from: the model it stands for and a seed that
// determines its outputs.
type SimSpec struct {
	Model, Revision, CheckpointDigest string
	ConversionPolicy                  ConversionPolicy
	ConverterVersion                  string
	Platform                          Platform
	Rungs                             []int
	Layers, Dimensions                int
	Seed                              string
}

// simParams is the sim backend's whole model: its outputs follow from the seed.
type simParams struct {
	Seed       string `json:"seed"`
	Layers     int    `json:"layers"`
	Dimensions int    `json:"dimensions"`
}

// golden is one input and the output the model must give for it.
type golden struct {
	Tokens []uint32  `json:"tokens"`
	Output []float32 `json:"output"`
}

// goldenInputs are the inputs every sim artifact is checked on.
var goldenInputs = [][]uint32{{1, 2, 3}, {7}, {101, 2023, 2003, 1037, 3231, 102}}

// BuildSim writes a sim artifact into dir (which must not exist): its parameters, the goldens
// computed from them, and its manifest. It is built beside dir and moved into place with one
// rename, so a loader never sees half of it.
func BuildSim(dir string, spec SimSpec) (m *Manifest, err error) {
	dir, finish, err := Beside(dir)
	if err != nil {
		return nil, err
	}
	defer finish(&err)
	params, err := json.Marshal(simParams{Seed: spec.Seed, Layers: spec.Layers, Dimensions: spec.Dimensions})
	if err != nil {
		return nil, err
	}
	var goldens []golden
	for _, in := range goldenInputs {
		goldens = append(goldens, golden{Tokens: in, Output: worker.Embed(spec.Seed, spec.Dimensions, in)})
	}
	goldenData, err := json.Marshal(goldens)
	if err != nil {
		return nil, err
	}
	files := map[string][]byte{"params.json": params, "goldens.json": goldenData}
	m = &Manifest{SchemaVersion: SchemaVersion, Model: spec.Model, Revision: spec.Revision, CheckpointDigest: spec.CheckpointDigest,
		ConversionPolicy: spec.ConversionPolicy, ConverterVersion: spec.ConverterVersion, GraphDigest: digest(params), Backend: "sim",
		Rungs: spec.Rungs, Layers: spec.Layers, Dimensions: spec.Dimensions, Precision: PrecisionFP16, ComputeUnits: ComputeUnitsCPUAndNE,
		Platform: spec.Platform, Files: map[string]string{},
		// The stand-in has no operations off its device: its plan is the Neural Engine's whole.
		Placement: PlacementSimulated,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return nil, err
		}
		m.Files[name] = digest(data)
	}
	maxErr, err := simParity(params, goldenData)
	if err != nil {
		return nil, err
	}
	m.Parity = Parity{Status: "passed", Goldens: "goldens.json", MaxAbsError: maxErr}
	if maxErr > 0 {
		m.Parity.Status = "failed"
	}
	data, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	if _, err := Parse(data); err != nil {
		return nil, fmt.Errorf("the built manifest does not verify: %w", err)
	}
	return m, writeAtomic(filepath.Join(dir, ManifestFile), data)
}

// Beside starts building an artifact at dst, which must not exist, in a fresh directory beside
// it. The builder defers finish with its own error: on success the directory is moved to dst
// with one rename, so a loader never sees half an artifact; on failure it is removed.
func Beside(dst string) (dir string, finish func(*error), err error) {
	if _, err := os.Lstat(dst); err == nil {
		return "", nil, fmt.Errorf("%s exists", dst)
	}
	dir, err = os.MkdirTemp(filepath.Dir(dst), "."+filepath.Base(dst)+".building-")
	if err != nil {
		return "", nil, err
	}
	finish = func(err *error) {
		if *err == nil {
			*err = os.Rename(dir, dst)
		}
		if *err != nil {
			os.RemoveAll(dir)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, finish, nil
}

// simParity recomputes the goldens' outputs from the parameters and returns the largest
// difference.
func simParity(params, goldenData []byte) (float64, error) {
	var p simParams
	if err := json.Unmarshal(params, &p); err != nil {
		return 0, err
	}
	var goldens []golden
	if err := json.Unmarshal(goldenData, &goldens); err != nil {
		return 0, err
	}
	var maxErr float64
	for _, g := range goldens {
		out := worker.Embed(p.Seed, p.Dimensions, g.Tokens)
		if len(out) != len(g.Output) {
			return math.Inf(1), nil
		}
		for i := range out {
			maxErr = max(maxErr, math.Abs(float64(out[i]-g.Output[i])))
		}
	}
	return maxErr, nil
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// SimConverterVersion is the version of BuildSim, the sim backend's converter.
const SimConverterVersion = "sim-1"
