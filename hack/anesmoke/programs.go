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

package main

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"

	"github.com/ck-synapse/synapse-fleet/node-agent/convert"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// smokeProgram is one program the ladder compiles, with its CPU reference and the inputs it
// is evaluated on.
type smokeProgram struct {
	name  string
	graph *mil.Graph
	out   mil.Value
	prog  mil.Program
	// inputs by name: x, and the key mask for a program that takes it.
	inputs map[string][]float32
}

// programSpec builds one program of a stage, the same each time (stage 6's second process
// rebuilds them to find them in aned's cache).
type programSpec struct {
	stage int
	name  string
	build func() (smokeProgram, error)
}

// The catalog models' full-size shapes (their published config.json), for stage 5.
var (
	gteModernBERTBase = family.Config{Kind: family.ModernBERT, Hidden: 768, Intermediate: 1152, Layers: 22, Heads: 12, KVHeads: 12, HeadDim: 64,
		Vocab: 50368, NormEps: 1e-5, RoPETheta: 160000, LocalRoPETheta: 10000, GlobalEvery: 3, LocalWindow: 128, Pooling: family.PoolCLS}
	qwen3Embedding06B = family.Config{Kind: family.Qwen3, Hidden: 1024, Intermediate: 3072, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128,
		Vocab: 151669, NormEps: 1e-6, RoPETheta: 1e6, Pooling: family.PoolLast}
)

// formSeq and formChannels are the shape of stage 4's programs.
const formSeq, formChannels = 64, 64

// specsFor are the ladder's programs for a run: with a checkpoint, stage 5's full layers are
// that checkpoint's, on the embedding of real text, instead of the catalog shapes with random
// weights.
func specsFor(checkpoint string) []programSpec {
	s := specs()
	if checkpoint == "" {
		return s
	}
	s = slices.DeleteFunc(s, func(p programSpec) bool { return p.stage == 5 && p.name != tiledAttentionSpec().name })
	return append(s, checkpointSpecs(checkpoint)...)
}

// checkpointSpecs are the first layer of the checkpoint at 128 and 512 positions, on the
// embedding of its tokenizer's encoding of the parity sample (random ids when it has no
// tokenizer), the activations a lane's text gives, not random ones.
func checkpointSpecs(dir string) []programSpec {
	var out []programSpec
	for _, seq := range []int{128, 512} {
		name := fmt.Sprintf("%s layer 0 at %d (its weights, real text)", filepath.Base(dir), seq)
		out = append(out, programSpec{5, name, func() (smokeProgram, error) {
			ck, err := convert.OpenCheckpoint(dir, convert.DefaultPolicy)
			if err != nil {
				return smokeProgram{}, err
			}
			defer ck.Close()
			g, y, err := family.Layer(ck.Config, 0, seq, ck.Weights)
			if err != nil {
				return smokeProgram{}, err
			}
			p, err := g.Program(y)
			if err != nil {
				return smokeProgram{}, err
			}
			sample, _, err := convert.ParityTokens(ck.Tokenizer, ck.Config.Vocab)
			if err != nil {
				return smokeProgram{}, err
			}
			toks := make([]int32, seq*3/4)
			for i := range toks {
				if sample != nil {
					toks[i] = sample[i%len(sample)]
				} else {
					toks[i] = int32(i % ck.Config.Vocab)
				}
			}
			e, err := family.NewEmbedder(ck.Config, ck.Weights)
			if err != nil {
				return smokeProgram{}, err
			}
			x, err := e.Input(toks, seq)
			if err != nil {
				return smokeProgram{}, err
			}
			return smokeProgram{name: name, graph: g, out: y, prog: p, inputs: map[string][]float32{"x": x, "mask": family.KeyMask(len(toks), seq)}}, nil
		}})
	}
	return out
}

// specs are every program the ladder compiles, by stage.
func specs() []programSpec {
	s := []programSpec{
		{2, "linear 64x64", func() (smokeProgram, error) {
			g, x := mil.NewGraph(formChannels, formSeq)
			return finish("linear 64x64", g, g.Linear("y", x, formChannels, randomMatrix("linear", formChannels, formChannels)), false)
		}},
		// A plain add of the two inputs, so a binding failure is told apart from an attention
		// failure (attention comes in stage 4).
		{3, "two inputs: x plus the key mask", func() (smokeProgram, error) {
			g, x := mil.NewGraph(formChannels, formSeq)
			return finish("two inputs", g, g.AddMask("y", x, g.Mask()), true)
		}},
	}
	for _, f := range forms {
		s = append(s, programSpec{4, f.name, func() (smokeProgram, error) { return form(f.name, f.masked, f.build) }})
	}
	for _, l := range []struct {
		c     family.Config
		name  string
		layer int
	}{{gteModernBERTBase, "gte-modernbert-base", 1}, {qwen3Embedding06B, "qwen3-embedding-0.6b", 1}} {
		for _, seq := range []int{128, 512} {
			name := fmt.Sprintf("%s layer %d at %d", l.name, l.layer, seq)
			s = append(s, programSpec{5, name, func() (smokeProgram, error) {
				g, y, err := family.Layer(l.c, l.layer, seq, namedWeights{})
				if err != nil {
					return smokeProgram{}, err
				}
				p, err := g.Program(y)
				if err != nil {
					return smokeProgram{}, err
				}
				return smokeProgram{name: name, graph: g, out: y, prog: p, inputs: map[string][]float32{
					"x": randomVector(name, l.c.Hidden*seq, 1), "mask": family.KeyMask(seq*3/4, seq)}}, nil
			}})
		}
	}
	return append(s, tiledAttentionSpec())
}

// tiledSeq is the length at which stage 5's attention is tiled over query rows: two heads'
// scores over 4096 positions are 64 MiB, past mil.MaxWorkingSet, so it runs as 8 tiles of 512
// rows, each with its own slice of the structural mask.
const tiledSeq = 4096

// tiledAttentionSpec is causal attention at tiledSeq, the tiled form no other stage reaches.
func tiledAttentionSpec() programSpec {
	const name = "causal attention tiled over query rows at 4096 positions"
	return programSpec{5, name, func() (smokeProgram, error) {
		g, x := mil.NewGraph(3*formChannels, tiledSeq)
		mask := g.Mask()
		y := attention(g, x, mask, mil.Attention{Heads: 2, KVHeads: 2, HeadDim: 32, Causal: true})
		out := g.Add("doubled", y, y)
		p, err := g.Program(out)
		if err != nil {
			return smokeProgram{}, err
		}
		return smokeProgram{name: name, graph: g, out: out, prog: p, inputs: map[string][]float32{
			"x": randomVector(name, 3*formChannels*tiledSeq, 1), "mask": family.KeyMask(tiledSeq*3/4, tiledSeq)}}, nil
	}}
}

// forms are the building blocks the families' layers are made of, each alone (stage 4).
var forms = []struct {
	name   string
	masked bool
	build  func(g *mil.Graph, x, mask mil.Value) mil.Value
}{
	{"conv 1x1 (linear)", false, func(g *mil.Graph, x, _ mil.Value) mil.Value {
		return g.Linear("y", x, formChannels, randomMatrix("form linear", formChannels, x.Channels()))
	}},
	{"add", false, func(g *mil.Graph, x, _ mil.Value) mil.Value { return g.Add("y", x, x) }},
	{"mul", false, func(g *mil.Graph, x, _ mil.Value) mil.Value { return g.Mul("y", x, x) }},
	{"silu", false, func(g *mil.Graph, x, _ mil.Value) mil.Value { return g.SiLU("y", x) }},
	{"gelu from erf", false, func(g *mil.Graph, x, _ mil.Value) mil.Value { return g.GELUExact("y", x) }},
	{"slice_by_size", false, func(g *mil.Graph, x, _ mil.Value) mil.Value { return g.Slice("y", x, 16, 48) }},
	{"layer norm (reduce_mean, sub, abs, reduce_max, maximum, pow)", false, func(g *mil.Graph, x, _ mil.Value) mil.Value {
		return g.LayerNorm("y", x, randomVector("ln gamma", x.Channels(), 1), gteModernBERTBase.NormEps)
	}},
	{"rms norm (abs, reduce_max, maximum, reduce_mean, pow)", false, func(g *mil.Graph, x, _ mil.Value) mil.Value {
		return g.RMSNorm("y", x, randomVector("rms gamma", x.Channels(), 1), qwen3Embedding06B.NormEps)
	}},
	{"attention (reshape, transpose, matmul, softmax)", true, func(g *mil.Graph, x, mask mil.Value) mil.Value {
		return attention(g, x, mask, mil.Attention{Heads: 2, KVHeads: 2, HeadDim: 32})
	}},
	{"attention with the rotary embedding (slice, concat)", true, func(g *mil.Graph, x, mask mil.Value) mil.Value {
		return attention(g, x, mask, mil.Attention{Heads: 2, KVHeads: 2, HeadDim: 32, RoPETheta: 10000})
	}},
	{"attention with q/k norms", true, func(g *mil.Graph, x, mask mil.Value) mil.Value {
		gamma := randomVector("qk gamma", 32, 1)
		return attention(g, x, mask, mil.Attention{Heads: 2, KVHeads: 2, HeadDim: 32, QNorm: gamma, KNorm: gamma, NormEps: qwen3Embedding06B.NormEps})
	}},
	{"causal attention (tile, greater, select)", true, func(g *mil.Graph, x, mask mil.Value) mil.Value {
		return attention(g, x, mask, mil.Attention{Heads: 2, KVHeads: 2, HeadDim: 32, Causal: true})
	}},
	{"local-window attention (abs, greater, select)", true, func(g *mil.Graph, x, mask mil.Value) mil.Value {
		return attention(g, x, mask, mil.Attention{Heads: 2, KVHeads: 2, HeadDim: 32, Window: 16})
	}},
	{"grouped-query attention (slice, concat)", true, func(g *mil.Graph, x, mask mil.Value) mil.Value {
		return attention(g, x, mask, mil.Attention{Heads: 2, KVHeads: 1, HeadDim: 32})
	}},
}

// attention is an attention block over x's channels: q, k and v sliced from x.
func attention(g *mil.Graph, x, mask mil.Value, a mil.Attention) mil.Value {
	q, kv := a.Heads*a.HeadDim, a.KVHeads*a.HeadDim
	return g.Attention("attn", g.Slice("q", x, 0, q), g.Slice("k", x, q, q+kv), g.Slice("v", x, q+kv, q+2*kv), mask, a)
}

// form builds one form's program: its block over x (and the key mask, when it takes one:
// an input the program never reads might not be an input of the compiled program), doubled
// by an add so that no program ends in a reshape or a slice (which the device is reported
// not to compile alone, jafreck/ironmill ane-op-support-matrix.md).
func form(name string, masked bool, build func(g *mil.Graph, x, mask mil.Value) mil.Value) (smokeProgram, error) {
	g, x := mil.NewGraph(3*formChannels, formSeq)
	var mask mil.Value
	if masked {
		mask = g.Mask()
	}
	y := build(g, x, mask)
	return finish(name, g, g.Add("doubled", y, y), masked)
}

func finish(name string, g *mil.Graph, y mil.Value, masked bool) (smokeProgram, error) {
	p, err := g.Program(y)
	if err != nil {
		return smokeProgram{}, err
	}
	in, _ := p.Input("x")
	s := smokeProgram{name: name, graph: g, out: y, prog: p, inputs: map[string][]float32{"x": randomVector(name, in.Values(), 1)}}
	if masked {
		s.inputs["mask"] = family.KeyMask(formSeq*3/4, formSeq)
	}
	return s, nil
}

// reference evaluates the program on the CPU.
func (s smokeProgram) reference() ([]float32, error) {
	return s.graph.EvalMasked(s.inputs["x"], s.inputs["mask"], s.out)
}

// record compares the device's output with the reference's into c and reports whether it is
// within the bound.
func (c *Check) record(got, want []float32) bool {
	d, ok := compare(got, want)
	if math.IsInf(d, 1) {
		c.MaxDiff, c.NonFinite = 0, true
		return false
	}
	c.MaxDiff = d
	return ok
}

// compare is the largest difference between the device's output and the reference's, and
// whether it is within what fp16 steps allow: 0.05 plus 2% of the reference's magnitude.
// A non-finite output is an infinite difference.
func compare(got, want []float32) (float64, bool) {
	var worst, scale float64
	for i, w := range want {
		g := float64(got[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return math.Inf(1), false
		}
		worst = max(worst, math.Abs(g-float64(w)))
		scale = max(scale, math.Abs(float64(w)))
	}
	return worst, worst <= 0.05+0.02*scale
}

// randomVector is n values in [-scale, scale], fixed by name.
func randomVector(name string, n int, scale float64) []float32 {
	h := fnv.New64a()
	h.Write([]byte(name))
	r := rand.New(rand.NewPCG(h.Sum64(), 19))
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(scale * (2*r.Float64() - 1))
	}
	return v
}

// randomMatrix is rows x cols weights scaled by the fan-in, fixed by name.
func randomMatrix(name string, rows, cols int) []float32 {
	return randomVector(name, rows*cols, 1/math.Sqrt(float64(cols)))
}

// namedWeights gives every tensor random values fixed by its name: matrices scaled by their
// fan-in, norms around 1.
type namedWeights struct{}

func (namedWeights) Tensor(name string, shape ...int) ([]float32, error) {
	n := 1
	for _, d := range shape {
		n *= d
	}
	if len(shape) == 1 {
		v := randomVector(name, n, 0.1)
		for i := range v {
			v[i]++
		}
		return v, nil
	}
	return randomMatrix(name, n/shape[len(shape)-1], shape[len(shape)-1]), nil
}
