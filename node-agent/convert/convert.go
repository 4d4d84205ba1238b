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

// Package convert turns a checkpoint (safetensors, config.json, tokenizer.json) into an ane
// artifact under a named, versioned conversion policy: the fp16 weights, every layer's program
// at every rung, goldens from the CPU reference and a parity gate that compares the fp16
// programs with the same programs in float32, so an activation fp16 cannot hold fails the
// conversion instead of reaching a Mac.
package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

// ConverterVersion is this converter's version: an artifact converted by another is re-checked
// (the verification stamp is keyed on it) and its programs must still re-emit identically.
// Version 2 emits programs in the forms the public Neural Engine references run, each checked
// by mil.Validate; a version-1 artifact's programs no longer re-emit, so it must be converted
// again.
const ConverterVersion = "ane-convert-2"

// Policy is a conversion policy: its name (the artifact's directory) and every parameter that
// changes what is produced; its digest is recorded in the manifest.
type Policy struct {
	Name    string `json:"name"`
	Version int    `json:"version"`
	// Pooling overrides the family's pooling ("" keeps it: cls for ModernBERT, last for Qwen3).
	Pooling family.Pooling `json:"pooling,omitempty"`
	// Goldens is how many inputs the parity gate checks, at the smallest rung.
	Goldens int `json:"goldens"`
	// ParityMaxAbs bounds the difference between the fp16 programs and the float32
	// evaluation of the same programs, on the normalised embedding.
	ParityMaxAbs float64 `json:"parityMaxAbs"`
}

// DefaultPolicy is the policy the catalog's artifacts are converted under.
var DefaultPolicy = Policy{Name: "ane-fp16-v1", Version: 1, Goldens: 3, ParityMaxAbs: 0.02}

// Digest identifies the policy's parameters.
func (p Policy) Digest() string {
	data, _ := json.Marshal(p)
	return aneartifact.SHA256(data)
}

// Checkpoint is a checkpoint directory opened for conversion.
type Checkpoint struct {
	Dir     string
	Config  family.Config
	Weights *aneartifact.Tensors
	// Digest covers config.json, tokenizer.json and every safetensors file.
	Digest string
	// Tokenizer is the checkpoint's tokenizer.json with its truncation and padding stripped
	// (nil when the checkpoint has none: its lanes then take token ids only); TokenizerLimits
	// is what was stripped, which the manifest records.
	Tokenizer       []byte
	TokenizerLimits tokenizer.Limits
}

// OpenCheckpoint reads dir's config.json (under policy p's pooling), maps its safetensors
// files and checks that its tokenizer.json, if any, loads.
func OpenCheckpoint(dir string, p Policy) (*Checkpoint, error) {
	cfgData, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("the checkpoint needs a config.json: %w", err)
	}
	cfg, err := family.ParseConfig(cfgData, p.Pooling)
	if err != nil {
		return nil, err
	}
	shards, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(shards) == 0 {
		return nil, fmt.Errorf("the checkpoint %s has no .safetensors files", dir)
	}
	slices.Sort(shards)
	ck := &Checkpoint{Dir: dir, Config: cfg}
	files := append([]string{filepath.Join(dir, "config.json")}, shards...)
	if tk := filepath.Join(dir, aneartifact.TokenizerFile); exists(tk) {
		data, err := os.ReadFile(tk)
		if err != nil {
			return nil, err
		}
		if ck.Tokenizer, ck.TokenizerLimits, err = tokenizer.StripLimits(data); err != nil {
			return nil, err
		}
		if _, err := tokenizer.ParseHF(ck.Tokenizer); err != nil {
			return nil, err
		}
		files = append(files, tk)
	}
	h := sha256.New()
	for _, f := range files {
		sum, err := artifact.FileSHA256(f)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(h, "%s %s\n", filepath.Base(f), sum)
	}
	ck.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	if ck.Weights, err = aneartifact.OpenTensors("model.", shards...); err != nil {
		return nil, err
	}
	return ck, nil
}

// Close unmaps the checkpoint.
func (c *Checkpoint) Close() error { return c.Weights.Close() }

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// Options says what to convert the checkpoint into.
type Options struct {
	Model, Revision string
	Rungs           []int
	Platform        artifact.Platform
	Policy          Policy
}

// recorder remembers every tensor the family's programs read.
type recorder struct {
	w    family.Weights
	seen map[string]aneartifact.Tensor
}

func (r *recorder) Tensor(name string, shape ...int) ([]float32, error) {
	v, err := r.w.Tensor(name, shape...)
	if err == nil {
		r.seen[name] = aneartifact.Tensor{Values: v, Shape: shape}
	}
	return v, err
}

// Convert writes the artifact into dst (which must not exist): it is built beside dst and
// moved into place with one rename, so nothing half-written is ever at dst. A failed parity
// gate is an *artifact.ParityError and leaves nothing.
func Convert(dst string, ck *Checkpoint, o Options) (m *artifact.Manifest, err error) {
	c := ck.Config
	if len(o.Rungs) == 0 || !slices.IsSorted(o.Rungs) || o.Rungs[0] <= 0 || len(slices.Compact(slices.Clone(o.Rungs))) != len(o.Rungs) {
		return nil, fmt.Errorf("rungs %v must be ascending, distinct and positive", o.Rungs)
	}
	for _, r := range o.Rungs {
		if r%64 != 0 {
			return nil, fmt.Errorf("rung %d is not a multiple of 64, as Neural Engine tensors need", r)
		}
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return nil, err
	}
	dir, finish, err := artifact.Beside(dst)
	if err != nil {
		return nil, err
	}
	defer finish(&err)
	write := func(name string, data []byte) error {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		return os.WriteFile(path, data, 0o644)
	}

	// The weights the programs read, once, in fp16; the programs are emitted from them as a
	// loader will.
	rec := &recorder{w: ck.Weights, seen: map[string]aneartifact.Tensor{}}
	if _, err := family.NewEmbedder(c, rec); err != nil {
		return nil, err
	}
	for i := range c.Layers {
		if _, _, err := family.Layer(c, i, o.Rungs[0], rec); err != nil {
			return nil, err
		}
	}
	if err := aneartifact.WriteFP16(filepath.Join(dir, aneartifact.WeightsFile), rec.seen); err != nil {
		return nil, err
	}
	rec.seen = nil
	stored, err := aneartifact.OpenTensors("", filepath.Join(dir, aneartifact.WeightsFile))
	if err != nil {
		return nil, err
	}
	defer stored.Close()

	cfgData, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := write(aneartifact.ModelFile, cfgData); err != nil {
		return nil, err
	}
	if ck.Tokenizer != nil {
		if err := write(aneartifact.TokenizerFile, ck.Tokenizer); err != nil {
			return nil, err
		}
	}

	embed, err := family.NewEmbedder(c, stored)
	if err != nil {
		return nil, err
	}
	g := newGoldens(c, o.Policy, o.Rungs[0], embed)
	programs := aneartifact.Programs{Rungs: map[string][]aneartifact.ProgramDigest{}}
	for _, rung := range o.Rungs {
		for i := range c.Layers {
			graph, y, err := family.Layer(c, i, rung, stored)
			if err != nil {
				return nil, err
			}
			p, err := graph.Program(y)
			if err != nil {
				return nil, err
			}
			name := aneartifact.ProgramPath(rung, i)
			if err := write(name, []byte(p.Text)); err != nil {
				return nil, err
			}
			programs.Rungs[strconv.Itoa(rung)] = append(programs.Rungs[strconv.Itoa(rung)], aneartifact.ProgramDigest{
				Layer: i, MIL: name, MILSHA: aneartifact.SHA256([]byte(p.Text)), WeightsSHA: aneartifact.SHA256(p.Weights)})
			if rung == o.Rungs[0] {
				if err := g.step(graph, y); err != nil {
					return nil, fmt.Errorf("layer %d: %w", i, err)
				}
			}
		}
	}
	progData, err := json.MarshalIndent(programs, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := write(aneartifact.ProgramsFile, progData); err != nil {
		return nil, err
	}
	goldens, maxErr, perr := g.finish()
	if perr != nil {
		return nil, &artifact.ParityError{Message: perr.Error()}
	}
	goldenData, err := json.Marshal(goldens)
	if err != nil {
		return nil, err
	}
	if err := write(aneartifact.GoldensFile, goldenData); err != nil {
		return nil, err
	}

	m = &artifact.Manifest{SchemaVersion: artifact.SchemaVersion, Model: o.Model, Revision: o.Revision, CheckpointDigest: ck.Digest,
		ConversionPolicy: artifact.ConversionPolicy{Name: o.Policy.Name, Digest: o.Policy.Digest()}, ConverterVersion: ConverterVersion,
		GraphDigest: aneartifact.SHA256(progData), Backend: "ane", Rungs: o.Rungs, Layers: c.Layers, Dimensions: c.Hidden,
		Precision: artifact.PrecisionFP16, ComputeUnits: artifact.ComputeUnitsCPUAndNE, Platform: o.Platform, Files: map[string]string{},
		// Every operation the programs use is one the Neural Engine runs and the lookup and
		// pooling are outside them: the plan is the device's whole by construction. The
		// placement probe checks it on the machine.
		ComputePlan: artifact.ComputePlan{NeuralEnginePercent: 100},
		Parity:      artifact.Parity{Status: "passed", Goldens: aneartifact.GoldensFile, MaxAbsError: maxErr}}
	if l := ck.TokenizerLimits; !l.Empty() {
		m.Tokenizer = &artifact.TokenizerRecord{RemovedTruncation: l.Truncation, RemovedPadding: l.Padding}
	}
	if err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		sum, err := artifact.FileSHA256(path)
		m.Files[filepath.ToSlash(rel)] = sum
		return err
	}); err != nil {
		return nil, err
	}
	data, err := m.Marshal()
	if err != nil {
		return nil, err
	}
	if _, err := artifact.Parse(data); err != nil {
		return nil, fmt.Errorf("the converted manifest does not verify: %w", err)
	}
	return m, os.WriteFile(filepath.Join(dir, artifact.ManifestFile), data, 0o644)
}

// goldens runs the parity inputs through the layers at the smallest rung, in fp16 and in
// float32, one layer at a time.
type goldens struct {
	c        family.Config
	p        Policy
	rung     int
	tokens   [][]int32
	x16, x32 [][]float32
	err      error
}

func newGoldens(c family.Config, p Policy, rung int, e *family.Embedder) *goldens {
	g := &goldens{c: c, p: p, rung: rung}
	r := rand.New(rand.NewPCG(uint64(p.Version), 0x5eed))
	for i := range max(p.Goldens, 1) {
		// Lengths from a handful of tokens to the whole rung.
		n := max(1, min(rung, []int{7, rung / 2, rung}[i%3]))
		toks := make([]int32, n)
		for j := range toks {
			toks[j] = int32(r.IntN(c.Vocab))
		}
		x, err := e.Input(toks, rung)
		if err != nil {
			g.err = err
			return g
		}
		g.tokens = append(g.tokens, toks)
		g.x16 = append(g.x16, x)
		g.x32 = append(g.x32, slices.Clone(x))
	}
	return g
}

func (g *goldens) step(graph *mil.Graph, y mil.Value) error {
	if g.err != nil {
		return g.err
	}
	for j, toks := range g.tokens {
		mask := family.KeyMask(len(toks), g.rung)
		var err error
		if g.x16[j], err = graph.EvalMasked(g.x16[j], mask, y); err != nil {
			return err
		}
		if g.x32[j], err = graph.EvalExact(g.x32[j], mask, y); err != nil {
			return err
		}
	}
	return nil
}

// finish pools the outputs and applies the parity gate: every golden's fp16 embedding within
// ParityMaxAbs of its float32 one, and nothing that is not a number.
func (g *goldens) finish() ([]aneartifact.Golden, float64, error) {
	var out []aneartifact.Golden
	var worst float64
	for j, toks := range g.tokens {
		e16 := family.Pool(g.c, g.x16[j], len(toks), g.rung)
		e32 := family.Pool(g.c, g.x32[j], len(toks), g.rung)
		for i := range e16 {
			d := math.Abs(float64(e16[i] - e32[i]))
			if math.IsNaN(d) || math.IsInf(d, 0) {
				return nil, 0, fmt.Errorf("golden %d (%d tokens at rung %d): the fp16 programs give %v where float32 gives %v: an activation overflows fp16", j, len(toks), g.rung, e16[i], e32[i])
			}
			worst = max(worst, d)
		}
		ids := make([]uint32, len(toks))
		for i, t := range toks {
			ids[i] = uint32(t)
		}
		out = append(out, aneartifact.Golden{Rung: g.rung, Tokens: ids, Output: e16})
	}
	if worst > g.p.ParityMaxAbs {
		return nil, worst, fmt.Errorf("the fp16 programs differ from their float32 evaluation by %.4f on the goldens, over the policy's %.4f", worst, g.p.ParityMaxAbs)
	}
	return out, worst, nil
}
