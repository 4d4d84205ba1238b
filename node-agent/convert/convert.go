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

// Package convert turns a checkpoint (safetensors, config.json, tokenizer.json and its
// sentence-transformers pooling) into an ane artifact under a named, versioned conversion
// policy: the fp16 weights (a weight fp16 cannot hold is refused by name), every layer's program
// at every rung, goldens from the CPU reference and a parity gate that compares the fp16
// programs, at several rungs, with the same layers evaluated in float32 on the checkpoint's own
// weights, so neither the cast of the weights nor an activation fp16 cannot hold reaches a Mac
// unmeasured.
package convert

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
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
	// Pooling, if set, is the pooling the policy requires: the checkpoint's own
	// sentence-transformers configuration must agree with it, and it is used only for a
	// checkpoint that has none. "" takes the checkpoint's, and refuses one that says none.
	Pooling family.Pooling `json:"pooling,omitempty"`
	// Goldens is how many inputs the parity gate checks at the smallest rung; every other
	// gated rung checks one input that fills it.
	Goldens int `json:"goldens"`
	// ParityMaxAbs bounds the difference, on the normalised embedding, between the fp16
	// programs and the float32 evaluation of the same programs with the checkpoint's own
	// weights (as it stores them: F32, BF16 or F16), so both the weights' cast to fp16 and
	// activations fp16 cannot hold are measured.
	ParityMaxAbs float64 `json:"parityMaxAbs"`
	// ParityMinCosine is the least cosine similarity, per golden, between the fp16 embedding and
	// the checkpoint's own: 0.02 per component alone lets through a vector at cosine 0.8 over
	// 1,024 dimensions.
	ParityMinCosine float64 `json:"parityMinCosine,omitempty"`
	// ParityMaxRung is the largest rung the CPU reference evaluates in reasonable time: the
	// gate runs at the smallest rung, at the largest rung up to this one, and at ParitySampled
	// of the rungs between them, chosen by a seed of the policy's version. Larger rungs are not
	// gated on the CPU (the manifest lists the gated rungs); their programs are re-emitted and
	// checked like every other, and the placement probe runs on each as it loads.
	ParityMaxRung int `json:"parityMaxRung"`
	ParitySampled int `json:"paritySampled"`
}

// DefaultPolicy is the policy the catalog's artifacts are converted under. Version 2 gates
// parity against the checkpoint's own weights at more than the smallest rung, reads the
// pooling from the checkpoint, and refuses weights fp16 cannot hold.
//
// Version 3 feeds the gate real text (the checkpoint tokenizer's own encoding of
// ParitySample) and judges each golden by its cosine too; its programs pre-scale the norms and
// scale the down projection, so its artifacts differ from version 2's.
var DefaultPolicy = Policy{Name: "ane-fp16-v3", Version: 3, Goldens: 3, ParityMaxAbs: 0.02, ParityMinCosine: 0.999, ParityMaxRung: 2048, ParitySampled: 1}

// ParitySample is the text the parity gate's goldens are made of, repeated to fill a rung:
// prose with numbers, punctuation and a few words outside English, so the embeddings the gate
// measures are of text like a lane's, not of random token ids (whose activations a trained
// model never produces).
const ParitySample = "The Neural Engine runs each layer as one program in half precision. " +
	"On 4 December 2026, 1,024 requests were embedded in 3.5 seconds; a retry came 250 ms later. " +
	"Les résumés, die Übersetzungen und los índices: everything a search index holds! " +
	"Why would a norm overflow? Because late residuals grow past 256, and 256 squared is more than 65,504."

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
	// Digest covers config.json, tokenizer.json, the sentence-transformers pooling files and
	// every safetensors file.
	Digest string
	// Tokenizer is the checkpoint's tokenizer.json with its truncation and padding stripped
	// (nil when the checkpoint has none: its lanes then take token ids only); TokenizerLimits
	// is what was stripped, which the manifest records.
	Tokenizer       []byte
	TokenizerLimits tokenizer.Limits
}

// OpenCheckpoint reads dir's config.json and its sentence-transformers pooling (which policy
// p's must agree with), maps its safetensors files and checks that its tokenizer.json, if any,
// loads once its truncation and padding are stripped.
func OpenCheckpoint(dir string, p Policy) (*Checkpoint, error) {
	cfgData, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("the checkpoint needs a config.json: %w", err)
	}
	cfg, err := family.ParseConfig(cfgData, family.PoolCLS) // the pooling is decided below
	if err != nil {
		return nil, err
	}
	own, poolingFiles, err := checkpointPooling(dir, cfg.Hidden)
	if err != nil {
		return nil, err
	}
	if cfg.Pooling, err = resolvePooling(own, p.Pooling); err != nil {
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	shards, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil || len(shards) == 0 {
		return nil, fmt.Errorf("the checkpoint %s has no .safetensors files", dir)
	}
	slices.Sort(shards)
	ck := &Checkpoint{Dir: dir, Config: cfg}
	files := append(append([]string{filepath.Join(dir, "config.json")}, shards...), poolingFiles...)
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
		rel, err := filepath.Rel(dir, f)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(h, "%s %s\n", filepath.ToSlash(rel), sum)
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

// FP16Max is the largest finite fp16 value.
const FP16Max = 65504

// RangeError refuses a checkpoint weight that fp16 cannot hold: cast, it would become infinite
// (or be clamped), a different model that no parity gate is sure to catch.
type RangeError struct {
	Tensor string
	Index  int
	Value  float32
}

func (e *RangeError) Error() string {
	return fmt.Sprintf("tensor %s holds %g at index %d, outside fp16's range (±%d): cast to fp16 it would not be that value; the checkpoint is not converted",
		e.Tensor, e.Value, e.Index, FP16Max)
}

// recorder remembers every tensor the family's programs read, each checked to fit fp16.
type recorder struct {
	w    family.Weights
	seen map[string]aneartifact.Tensor
}

func (r *recorder) Tensor(name string, shape ...int) ([]float32, error) {
	v, err := r.w.Tensor(name, shape...)
	if err != nil {
		return nil, err
	}
	for i, x := range v {
		if x > FP16Max || x < -FP16Max {
			return nil, &RangeError{Tensor: name, Index: i, Value: x}
		}
	}
	r.seen[name] = aneartifact.Tensor{Values: v, Shape: shape}
	return v, nil
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
	// The reference the gate compares with: the checkpoint's own weights, as it stores them.
	original, err := family.NewEmbedder(c, ck.Weights)
	if err != nil {
		return nil, err
	}
	gated := ParityRungs(o.Rungs, o.Policy)
	sample, input, err := ParityTokens(ck.Tokenizer, c.Vocab)
	if err != nil {
		return nil, err
	}
	g := newGoldens(c, o.Policy, gated, embed, original, sample)
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
			if slices.Contains(gated, rung) {
				ref, refY, err := family.OriginalLayer(c, i, rung, ck.Weights)
				if err != nil {
					return nil, err
				}
				if err := g.step(rung, graph, y, ref, refY); err != nil {
					return nil, fmt.Errorf("layer %d at rung %d: %w", i, rung, err)
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
	goldens, maxErr, minCos, perr := g.finish()
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
		// What is known of the placement is the path: each layer one program, compiled for the
		// Neural Engine whole or not at all. No plan is computed or checked; the placement
		// probe measures each loaded rung.
		Placement: artifact.PlacementWholeProgram,
		Parity: artifact.Parity{Status: "passed", Goldens: aneartifact.GoldensFile, MaxAbsError: maxErr, MinCosine: minCos, Rungs: gated,
			Input: input}}
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

// ParityRungs are the rungs the parity gate runs at: the smallest, the largest up to the
// policy's ParityMaxRung, and ParitySampled of those between, chosen by a seed of the policy's
// version (so a conversion under one policy always gates the same rungs).
func ParityRungs(rungs []int, p Policy) []int {
	gated := []int{rungs[0]}
	var upTo []int
	for _, r := range rungs[1:] {
		if r <= p.ParityMaxRung {
			upTo = append(upTo, r)
		}
	}
	if len(upTo) == 0 {
		return gated
	}
	between := slices.Clone(upTo[:len(upTo)-1])
	rand.New(rand.NewPCG(uint64(p.Version), 0x9a7e)).Shuffle(len(between), func(i, j int) { between[i], between[j] = between[j], between[i] })
	gated = append(append(gated, between[:min(max(p.ParitySampled, 0), len(between))]...), upTo[len(upTo)-1])
	slices.Sort(gated)
	return gated
}

// parityCase is one golden input on its way through the layers: in fp16 on the programs, and
// in float32 with the checkpoint's own weights.
type parityCase struct {
	rung    int
	tokens  []int32
	x16, xo []float32
}

// goldens runs the parity inputs through the layers at every gated rung, one layer at a time.
type goldens struct {
	c     family.Config
	p     Policy
	cases []*parityCase
	err   error
}

// ParityTokens are the gate's input: the tokenizer's encoding of ParitySample, or nil (random
// token ids) for a checkpoint without a tokenizer, whose lanes take token ids only; input says
// which, for the manifest.
func ParityTokens(tk []byte, vocab int) ([]int32, string, error) {
	if tk == nil {
		return nil, "random token ids: the checkpoint has no tokenizer", nil
	}
	hf, err := tokenizer.ParseHF(tk)
	if err != nil {
		return nil, "", err
	}
	ids, err := hf.Encode(ParitySample)
	if err != nil {
		return nil, "", fmt.Errorf("encoding the parity sample: %w", err)
	}
	if len(ids) == 0 {
		return nil, "", errors.New("the tokenizer encodes the parity sample as no tokens")
	}
	out := make([]int32, len(ids))
	for i, id := range ids {
		if id >= uint32(vocab) {
			return nil, "", fmt.Errorf("the tokenizer gives token %d for the parity sample, outside the model's vocabulary of %d", id, vocab)
		}
		out[i] = int32(id)
	}
	return out, fmt.Sprintf("the tokenizer's encoding of the parity sample (%d tokens, repeated to fill a rung)", len(out)), nil
}

func newGoldens(c family.Config, p Policy, gated []int, e16, original *family.Embedder, sample []int32) *goldens {
	g := &goldens{c: c, p: p}
	r := rand.New(rand.NewPCG(uint64(p.Version), 0x5eed))
	for _, rung := range gated {
		// At the smallest rung, lengths from a handful of tokens to the whole rung; at every
		// other, one input that fills it.
		lengths := []int{rung}
		if rung == gated[0] {
			lengths = nil
			for i := range max(p.Goldens, 1) {
				lengths = append(lengths, max(1, min(rung, []int{7, rung / 2, rung}[i%3])))
			}
		}
		for _, n := range lengths {
			toks := make([]int32, n)
			for j := range toks {
				if sample != nil {
					toks[j] = sample[j%len(sample)]
				} else {
					toks[j] = int32(r.IntN(c.Vocab))
				}
			}
			x16, err := e16.Input(toks, rung)
			if err != nil {
				g.err = err
				return g
			}
			xo, err := original.InputOriginal(toks, rung)
			if err != nil {
				g.err = err
				return g
			}
			g.cases = append(g.cases, &parityCase{rung: rung, tokens: toks, x16: x16, xo: xo})
		}
	}
	return g
}

// step runs the cases of rung through one layer: its program's fp16 evaluation and the
// original-precision evaluation of the same layer.
func (g *goldens) step(rung int, graph *mil.Graph, y mil.Value, ref *mil.Graph, refY mil.Value) error {
	if g.err != nil {
		return g.err
	}
	for _, pc := range g.cases {
		if pc.rung != rung {
			continue
		}
		mask := family.KeyMask(len(pc.tokens), rung)
		var err error
		if pc.x16, err = graph.EvalMasked(pc.x16, mask, y); err != nil {
			return err
		}
		if pc.xo, err = ref.EvalOriginal(pc.xo, mask, refY); err != nil {
			return err
		}
	}
	return nil
}

// finish pools the outputs and applies the parity gate: every golden's fp16 embedding within
// ParityMaxAbs of the checkpoint's own in every component, at a cosine of at least
// ParityMinCosine, and nothing that is not a number. It returns the worst difference and the
// worst cosine.
func (g *goldens) finish() ([]aneartifact.Golden, float64, float64, error) {
	var out []aneartifact.Golden
	worst, minCos := 0.0, 1.0
	for j, pc := range g.cases {
		e16 := family.Pool(g.c, pc.x16, len(pc.tokens), pc.rung)
		eo := family.Pool(g.c, pc.xo, len(pc.tokens), pc.rung)
		var dot, n16, no float64
		for i := range e16 {
			d := math.Abs(float64(e16[i] - eo[i]))
			if math.IsNaN(d) || math.IsInf(d, 0) {
				return nil, 0, 0, fmt.Errorf("golden %d (%d tokens at rung %d): the fp16 programs give %v where the checkpoint's own precision gives %v: an activation overflows fp16",
					j, len(pc.tokens), pc.rung, e16[i], eo[i])
			}
			worst = max(worst, d)
			dot, n16, no = dot+float64(e16[i])*float64(eo[i]), n16+float64(e16[i])*float64(e16[i]), no+float64(eo[i])*float64(eo[i])
		}
		cos := dot / math.Sqrt(n16*no)
		if n16 == 0 || no == 0 {
			cos = 0
		}
		if cos < g.p.ParityMinCosine {
			return nil, worst, cos, fmt.Errorf("golden %d (%d tokens at rung %d): the fp16 embedding is at cosine %.5f to the checkpoint's own precision's, under the policy's %.4f",
				j, len(pc.tokens), pc.rung, cos, g.p.ParityMinCosine)
		}
		minCos = min(minCos, cos)
		ids := make([]uint32, len(pc.tokens))
		for i, t := range pc.tokens {
			ids[i] = uint32(t)
		}
		out = append(out, aneartifact.Golden{Rung: pc.rung, Tokens: ids, Output: e16})
	}
	if worst > g.p.ParityMaxAbs {
		return nil, worst, minCos, fmt.Errorf("the fp16 programs differ from the checkpoint's own precision by %.4f on the goldens, over the policy's %.4f", worst, g.p.ParityMaxAbs)
	}
	return out, worst, minCos, nil
}
