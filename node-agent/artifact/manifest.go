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

// Package artifact is the model artifact: a directory holding what a worker loads (for ane:
// the MIL text and weight blobs per layer; for sim: its parameters) and a manifest.json that
// says exactly what it is. Nothing unverified loads: Verify checks every claim of the manifest
// against the directory and the machine, and a failure is a typed error naming the check. A
// corrupt artifact is quarantined, so nothing corrupt stays in place.
package artifact

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
)

// SchemaVersion is the manifest schema this package reads and writes. Version 2 replaced the
// compute plan (a figure the converter wrote and the loader then checked against itself) with
// the placement the backend's path actually gives.
const SchemaVersion = 2

// ManifestFile is the manifest's name in an artifact directory.
const ManifestFile = "manifest.json"

// The only precision and compute units the Neural Engine path has. Anything else has no code
// path: it is refused, never mapped to something close.
const (
	PrecisionFP16        = "fp16"
	ComputeUnitsCPUAndNE = "CPU_AND_NE"
)

// Manifest describes one artifact.
type Manifest struct {
	SchemaVersion int `json:"schemaVersion"`
	// Model, Revision and CheckpointDigest name the checkpoint it was converted from.
	Model            string `json:"model"`
	Revision         string `json:"revision"`
	CheckpointDigest string `json:"checkpointDigest"`
	// ConversionPolicy (name and digest) and ConverterVersion say how.
	ConversionPolicy ConversionPolicy `json:"conversionPolicy"`
	ConverterVersion string           `json:"converterVersion"`
	// GraphDigest identifies the converted graph: equal graphs, equal digests.
	GraphDigest string `json:"graphDigest"`
	// Backend is the worker backend the artifact is for: ane or sim.
	Backend string `json:"backend"`
	// Rungs are the sequence lengths it holds, ascending.
	Rungs []int `json:"rungs"`
	// Layers and Dimensions are the model's per-layer programs and output width.
	Layers     int `json:"layers"`
	Dimensions int `json:"dimensions"`
	// Precision is fp16; ComputeUnits CPU_AND_NE.
	Precision    string `json:"precision"`
	ComputeUnits string `json:"computeUnits"`
	// Platform is the machine profile it was built and checked for.
	Platform Platform `json:"platform"`
	// Files maps every file of the artifact (relative, slash-separated) to its SHA-256.
	Files map[string]string `json:"files"`
	// Placement is what is known of where the programs run before they do: the backend's path
	// (PlacementWholeProgram or PlacementSimulated), not a measurement. The runtime placement
	// probe measures where each loaded rung runs.
	Placement string `json:"placement"`
	// Parity says whether the artifact's outputs matched the goldens it was checked against.
	Parity Parity `json:"parity"`
	// Tokenizer records what the converter removed from the checkpoint's tokenizer.json
	// (absent when nothing was): the artifact's own never truncates or pads.
	Tokenizer *TokenizerRecord `json:"tokenizer,omitempty"`
}

// TokenizerRecord is the checkpoint tokenizer's truncation and padding sections, as written,
// which the converter stripped: the library would have applied them silently, cutting a long
// text below the lane's ceiling check or padding every input to a larger bucket.
type TokenizerRecord struct {
	RemovedTruncation json.RawMessage `json:"removedTruncation,omitempty"`
	RemovedPadding    json.RawMessage `json:"removedPadding,omitempty"`
}

// ConversionPolicy names a conversion policy.
type ConversionPolicy struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// Platform is a machine profile.
type Platform struct {
	ChipFamily string `json:"chipFamily"`
	MacOSBuild string `json:"macOSBuild"`
}

// The placements an artifact can claim, one per backend.
const (
	// PlacementWholeProgram (ane): each layer is one MIL program that the private path compiles
	// for the Neural Engine as a whole, or fails to compile. Unlike Core ML, nothing splits a
	// program between devices and there is no per-operation plan to read, so none is claimed
	// or checked; whether a loaded program runs on the device is the placement probe's to
	// measure.
	PlacementWholeProgram = "ane-whole-program"
	// PlacementSimulated (sim): the stand-in runs nothing on any device.
	PlacementSimulated = "simulated"
)

// placementOf is the placement the backend's path gives.
var placementOf = map[string]string{"ane": PlacementWholeProgram, "sim": PlacementSimulated}

// Parity is the outcome of the parity gate.
type Parity struct {
	// Status is "passed" or "failed".
	Status string `json:"status"`
	// Goldens names the golden outputs it was checked against (a file of the artifact).
	Goldens string `json:"goldens"`
	// MaxAbsError is the largest difference found; MinCosine the smallest cosine between a
	// golden's embedding and the reference's (0 when the gate did not measure it).
	MaxAbsError float64 `json:"maxAbsError"`
	MinCosine   float64 `json:"minCosine,omitempty"`
	// Input says what the goldens were made of (the tokenizer's encoding of a fixed text, or
	// random token ids for a checkpoint without a tokenizer).
	Input string `json:"input,omitempty"`
	// Rungs are the rungs the gate ran at (a converted artifact's; a sim artifact's gate runs
	// at every rung and lists none).
	Rungs []int `json:"rungs,omitempty"`
}

var (
	digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)
	fileRE   = regexp.MustCompile(`^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$`)
)

// Parse reads a manifest strictly: unknown fields, a second JSON value or a schema other than
// SchemaVersion are refused, and so is every claim this package has no code path for. Its
// errors are *IntegrityError or *ComputeUnitMismatchError.
func Parse(data []byte) (*Manifest, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	m := &Manifest{}
	if err := dec.Decode(m); err != nil {
		return nil, integrity("manifest", "the manifest is not a valid manifest: %v", err)
	}
	if dec.More() {
		return nil, integrity("manifest", "the manifest holds more than one JSON value")
	}
	if err := m.validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// validate checks the manifest's own claims, before anything is compared with the directory.
func (m *Manifest) validate() error {
	switch {
	case m.SchemaVersion != SchemaVersion:
		return integrity("schema", "manifest schema %d; this agent reads schema %d", m.SchemaVersion, SchemaVersion)
	case m.Model == "" || m.Revision == "":
		return integrity("model", "the manifest names no model or revision")
	case !digestRE.MatchString(m.CheckpointDigest):
		return integrity("checkpoint", "checkpointDigest %q is not sha256:<64 hex>", m.CheckpointDigest)
	case m.ConversionPolicy.Name == "" || !digestRE.MatchString(m.ConversionPolicy.Digest):
		return integrity("conversion", "the conversion policy needs a name and a sha256 digest")
	case m.ConverterVersion == "":
		return integrity("conversion", "the manifest names no converter version")
	case !digestRE.MatchString(m.GraphDigest):
		return integrity("graph", "graphDigest %q is not sha256:<64 hex>", m.GraphDigest)
	case m.Backend != "ane" && m.Backend != "sim":
		return integrity("backend", "backend %q; ane or sim", m.Backend)
	case !ascendingPositive(m.Rungs):
		return integrity("shape", "rungs %v must be ascending, distinct and positive", m.Rungs)
	case m.Layers < 1 || m.Dimensions < 1:
		return integrity("shape", "layers %d and dimensions %d must be positive", m.Layers, m.Dimensions)
	case m.Platform.ChipFamily == "" || m.Platform.MacOSBuild == "":
		return integrity("platform", "the manifest names no chip family or macOS build")
	case len(m.Files) == 0:
		return integrity("files", "the manifest lists no files")
	case m.Parity.Status != "passed" && m.Parity.Status != "failed":
		return integrity("parity", "parity status %q; passed or failed", m.Parity.Status)
	}
	if m.Precision != PrecisionFP16 {
		return &PrecisionError{Precision: m.Precision}
	}
	if want := placementOf[m.Backend]; m.Placement != want {
		return &ComputeUnitMismatchError{Check: "placement", Message: fmt.Sprintf("placement %q has no code path on the %s backend; its programs are placed %q", m.Placement, m.Backend, want)}
	}
	if m.ComputeUnits != ComputeUnitsCPUAndNE {
		return &ComputeUnitMismatchError{Check: "computeUnits", Message: fmt.Sprintf("compute units %q have no code path; only %s", m.ComputeUnits, ComputeUnitsCPUAndNE)}
	}
	for name, sum := range m.Files {
		if !fileRE.MatchString(name) || name == ManifestFile || hasDotDot(name) {
			return integrity("files", "file name %q is not a plain relative path inside the artifact", name)
		}
		if !digestRE.MatchString(sum) {
			return integrity("files", "file %s: digest %q is not sha256:<64 hex>", name, sum)
		}
	}
	if m.Parity.Goldens != "" {
		if _, ok := m.Files[m.Parity.Goldens]; !ok {
			return integrity("parity", "the goldens %q are not a file of the artifact", m.Parity.Goldens)
		}
	}
	return nil
}

// ascendingPositive: at least one rung, each positive and larger than the one before.
func ascendingPositive(rs []int) bool {
	for i, r := range rs {
		if r < 1 || i > 0 && r <= rs[i-1] {
			return false
		}
	}
	return len(rs) > 0
}

func hasDotDot(name string) bool {
	for _, part := range bytes.Split([]byte(name), []byte("/")) {
		if string(part) == "." || string(part) == ".." {
			return true
		}
	}
	return false
}

// Marshal writes the manifest as the file holds it.
func (m *Manifest) Marshal() ([]byte, error) {
	data, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}
