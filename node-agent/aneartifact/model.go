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

// Package aneartifact is the ane backend's part of a model artifact: the family config, the
// fp16 weights once, and per rung and layer the MIL text with the digests of the program and
// its weight blob. A loader re-emits each program from the weights with the same emitter and
// refuses it unless both digests match what the conversion checked, so what compiles is
// exactly what passed the parity gate, and the weights are stored once, not once per rung.
package aneartifact

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// The files of an ane artifact, beside its manifest.
const (
	ModelFile     = "model.json"
	WeightsFile   = "weights.safetensors"
	ProgramsFile  = "programs.json"
	TokenizerFile = "tokenizer.json"
	GoldensFile   = "goldens.json"
)

// ProgramDir is where the MIL text of a rung's layers is.
func ProgramDir(rung int) string { return fmt.Sprintf("programs/r%05d", rung) }

// ProgramPath is the MIL text of one layer at one rung.
func ProgramPath(rung, layer int) string {
	return fmt.Sprintf("%s/layer-%03d.mil", ProgramDir(rung), layer)
}

// Programs indexes every program of the artifact by rung.
type Programs struct {
	Rungs map[string][]ProgramDigest `json:"rungs"`
}

// ProgramDigest is one layer's program at one rung.
type ProgramDigest struct {
	Layer      int    `json:"layer"`
	MIL        string `json:"mil"`
	MILSHA     string `json:"milSHA256"`
	WeightsSHA string `json:"weightsSHA256"`
}

// Golden is an input and the embedding the CPU reference gives for it at a rung.
type Golden struct {
	Rung   int       `json:"rung"`
	Tokens []uint32  `json:"tokens"`
	Output []float32 `json:"output"`
}

// Model is a loaded ane artifact.
type Model struct {
	Dir      string
	Config   family.Config
	Weights  *Tensors
	Embedder *family.Embedder
	programs Programs
	// goldens are the parity gate's inputs and outputs (none for an artifact without them).
	goldens []Golden
}

// Load reads an artifact directory the verifier has passed.
func Load(dir string) (*Model, error) {
	m := &Model{Dir: dir}
	if err := readJSON(filepath.Join(dir, ModelFile), &m.Config); err != nil {
		return nil, err
	}
	if err := m.Config.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", ModelFile, err)
	}
	if err := readJSON(filepath.Join(dir, ProgramsFile), &m.programs); err != nil {
		return nil, err
	}
	if gp := filepath.Join(dir, GoldensFile); fileExists(gp) {
		if err := readJSON(gp, &m.goldens); err != nil {
			return nil, err
		}
	}
	w, err := OpenTensors("", filepath.Join(dir, WeightsFile))
	if err != nil {
		return nil, err
	}
	m.Weights = w
	if m.Embedder, err = family.NewEmbedder(m.Config, w); err != nil {
		w.Close()
		return nil, err
	}
	return m, nil
}

// Goldens are the goldens at rung: the converter's gate ran there and these are its fp16
// outputs (none for a rung the gate did not run at).
func (m *Model) Goldens(rung int) []Golden {
	var out []Golden
	for _, g := range m.goldens {
		if g.Rung == rung {
			out = append(out, g)
		}
	}
	return out
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// Close releases the weights.
func (m *Model) Close() error { return m.Weights.Close() }

// Layer is one layer's program at one rung and its CPU reference.
type Layer struct {
	Program mil.Program
	Graph   *mil.Graph
	Out     mil.Value
}

// Layer re-emits layer i at rung and checks it against the conversion's digests.
func (m *Model) Layer(i, rung int) (*Layer, error) {
	index := m.programs.Rungs[strconv.Itoa(rung)]
	if i < 0 || i >= len(index) || index[i].Layer != i {
		return nil, fmt.Errorf("the artifact has no program for layer %d at rung %d", i, rung)
	}
	g, y, err := family.Layer(m.Config, i, rung, m.Weights)
	if err != nil {
		return nil, err
	}
	p, err := g.Program(y)
	if err != nil {
		return nil, err
	}
	want := index[i]
	stored, err := os.ReadFile(filepath.Join(m.Dir, filepath.FromSlash(want.MIL)))
	if err != nil {
		return nil, err
	}
	if got := SHA256([]byte(p.Text)); got != want.MILSHA || string(stored) != p.Text {
		return nil, fmt.Errorf("layer %d at rung %d: the emitted program differs from the converted one (%s, converted %s): this emitter is not the converter's", i, rung, got, want.MILSHA)
	}
	if got := SHA256(p.Weights); got != want.WeightsSHA {
		return nil, fmt.Errorf("layer %d at rung %d: the emitted weights differ from the converted ones (%s, converted %s)", i, rung, got, want.WeightsSHA)
	}
	return &Layer{Program: p, Graph: g, Out: y}, nil
}

// Rungs are the rungs the artifact has programs for.
func (m *Model) Rungs() []int {
	var out []int
	for r := range m.programs.Rungs {
		n, err := strconv.Atoi(r)
		if err == nil {
			out = append(out, n)
		}
	}
	return out
}

// SHA256 is "sha256:" and the hex digest of data.
func SHA256(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func readJSON(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return nil
}
