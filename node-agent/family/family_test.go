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

package family_test

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

var update = flag.Bool("update", false, "rewrite the golden files")

// mapWeights is a checkpoint in memory.
type mapWeights map[string][]float32

func (m mapWeights) Tensor(name string, shape ...int) ([]float32, error) {
	v, ok := m[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	if n := product(shape); len(v) != n {
		return nil, fmt.Errorf("tensor %s has %d values, want %v", name, len(v), shape)
	}
	return v, nil
}

// randomWeights is the tiny model's checkpoint in memory.
func randomWeights(c family.Config, seed uint64) mapWeights {
	w := mapWeights{}
	for name, t := range tinymodel.Weights(c, seed, 1) {
		w[name] = t.Values
	}
	return w
}

func tinyModernBERT() family.Config { return tinymodel.ModernBERT() }
func tinyQwen3() family.Config      { return tinymodel.Qwen3() }

// The independent float64 forward pass, written from the models' definitions, token-major
// ([position][channel]), over the real tokens only: no padding, no masks but the model's own.

type mat64 [][]float64

func linear(x mat64, w []float32, out int) mat64 {
	in := len(x[0])
	y := make(mat64, len(x))
	for s := range x {
		y[s] = make([]float64, out)
		for o := range out {
			for c := range in {
				y[s][o] += float64(w[o*in+c]) * x[s][c]
			}
		}
	}
	return y
}

func layerNorm(x mat64, gamma []float32, eps float64) mat64 {
	y := make(mat64, len(x))
	for s, row := range x {
		var mean, sq float64
		for _, v := range row {
			mean += v
		}
		mean /= float64(len(row))
		for _, v := range row {
			sq += (v - mean) * (v - mean)
		}
		inv := 1 / math.Sqrt(sq/float64(len(row))+eps)
		y[s] = make([]float64, len(row))
		for i, v := range row {
			y[s][i] = (v - mean) * inv * float64(gamma[i])
		}
	}
	return y
}

func rmsNorm(row []float64, gamma []float32, eps float64) []float64 {
	var sq float64
	for _, v := range row {
		sq += v * v
	}
	inv := 1 / math.Sqrt(sq/float64(len(row))+eps)
	out := make([]float64, len(row))
	for i, v := range row {
		out[i] = v * inv * float64(gamma[i])
	}
	return out
}

func add(a, b mat64) mat64 {
	y := make(mat64, len(a))
	for s := range a {
		y[s] = make([]float64, len(a[s]))
		for i := range a[s] {
			y[s][i] = a[s][i] + b[s][i]
		}
	}
	return y
}

// rotate applies the rotary embedding (rotate-half) to one head's vector at position pos.
func rotate(v []float64, pos int, theta float64) []float64 {
	d := len(v)
	out := make([]float64, d)
	for i := range d / 2 {
		f := float64(pos) * math.Pow(theta, -2*float64(i)/float64(d))
		c, s := math.Cos(f), math.Sin(f)
		out[i] = v[i]*c - v[i+d/2]*s
		out[i+d/2] = v[i+d/2]*c + v[i]*s
	}
	return out
}

// attend is multi-head attention over the rows of q, k, v; visible says which key a query sees.
func attend(q, k, v mat64, heads, kvHeads, d int, theta float64, qn, kn []float32, eps float64, visible func(t, s int) bool) mat64 {
	n := len(q)
	out := make(mat64, n)
	for t := range out {
		out[t] = make([]float64, heads*d)
	}
	head := func(m mat64, row, h int, gamma []float32) []float64 {
		x := m[row][h*d : (h+1)*d]
		if gamma != nil {
			x = rmsNorm(x, gamma, eps)
		}
		return rotate(x, row, theta)
	}
	for h := range heads {
		kvh := h / (heads / kvHeads)
		for t := range n {
			qt := head(q, t, h, qn)
			w := make([]float64, n)
			maxw := math.Inf(-1)
			for s := range n {
				if !visible(t, s) {
					w[s] = math.Inf(-1)
					continue
				}
				ks := head(k, s, kvh, kn)
				for i := range d {
					w[s] += qt[i] * ks[i]
				}
				w[s] /= math.Sqrt(float64(d))
				maxw = max(maxw, w[s])
			}
			var sum float64
			for s := range n {
				w[s] = math.Exp(w[s] - maxw)
				sum += w[s]
			}
			for s := range n {
				for i := range d {
					out[t][h*d+i] += w[s] / sum * v[s][kvh*d+i]
				}
			}
		}
	}
	return out
}

func pool(c family.Config, x mat64) []float32 {
	var v []float64
	switch c.Pooling {
	case family.PoolCLS:
		v = x[0]
	case family.PoolLast:
		v = x[len(x)-1]
	}
	var norm float64
	for _, e := range v {
		norm += e * e
	}
	out := make([]float32, len(v))
	for i, e := range v {
		out[i] = float32(e / math.Sqrt(norm))
	}
	return out
}

func forward64(c family.Config, w mapWeights, tokens []int32) []float32 {
	x := make(mat64, len(tokens))
	table := map[bool]string{true: "embeddings.tok_embeddings.weight", false: "embed_tokens.weight"}[c.Kind == family.ModernBERT]
	for s, tok := range tokens {
		x[s] = make([]float64, c.Hidden)
		for i := range c.Hidden {
			x[s][i] = float64(w[table][int(tok)*c.Hidden+i])
		}
	}
	eps := float64(c.NormEps)
	h, in := c.Hidden, c.Intermediate
	switch c.Kind {
	case family.ModernBERT:
		x = layerNorm(x, w["embeddings.norm.weight"], eps)
		for l := range c.Layers {
			p := fmt.Sprintf("layers.%d.", l)
			a := x
			if l > 0 {
				a = layerNorm(x, w[p+"attn_norm.weight"], eps)
			}
			qkv := linear(a, w[p+"attn.Wqkv.weight"], 3*h)
			q, k, v := make(mat64, len(x)), make(mat64, len(x)), make(mat64, len(x))
			for s := range qkv {
				q[s], k[s], v[s] = qkv[s][:h], qkv[s][h:2*h], qkv[s][2*h:]
			}
			theta, visible := c.RoPETheta, func(t, s int) bool { return true }
			if l%c.GlobalEvery != 0 {
				theta = c.LocalRoPETheta
				visible = func(t, s int) bool { return math.Abs(float64(t-s)) <= float64(c.LocalWindow/2) }
			}
			x = add(x, linear(attend(q, k, v, c.Heads, c.Heads, c.HeadDim, theta, nil, nil, eps, visible), w[p+"attn.Wo.weight"], h))
			wi := linear(layerNorm(x, w[p+"mlp_norm.weight"], eps), w[p+"mlp.Wi.weight"], 2*in)
			act := make(mat64, len(x))
			for s := range wi {
				act[s] = make([]float64, in)
				for i := range in {
					u := wi[s][i]
					act[s][i] = 0.5 * u * (1 + math.Erf(u/math.Sqrt2)) * wi[s][in+i]
				}
			}
			x = add(x, linear(act, w[p+"mlp.Wo.weight"], h))
		}
		x = layerNorm(x, w["final_norm.weight"], eps)
	case family.Qwen3:
		rms := func(m mat64, gamma []float32) mat64 {
			out := make(mat64, len(m))
			for s := range m {
				out[s] = rmsNorm(m[s], gamma, eps)
			}
			return out
		}
		for l := range c.Layers {
			p := fmt.Sprintf("layers.%d.", l)
			n := rms(x, w[p+"input_layernorm.weight"])
			q := linear(n, w[p+"self_attn.q_proj.weight"], c.Heads*c.HeadDim)
			k := linear(n, w[p+"self_attn.k_proj.weight"], c.KVHeads*c.HeadDim)
			v := linear(n, w[p+"self_attn.v_proj.weight"], c.KVHeads*c.HeadDim)
			att := attend(q, k, v, c.Heads, c.KVHeads, c.HeadDim, c.RoPETheta, w[p+"self_attn.q_norm.weight"], w[p+"self_attn.k_norm.weight"], eps,
				func(t, s int) bool { return s <= t })
			x = add(x, linear(att, w[p+"self_attn.o_proj.weight"], h))
			n = rms(x, w[p+"post_attention_layernorm.weight"])
			gate, up := linear(n, w[p+"mlp.gate_proj.weight"], in), linear(n, w[p+"mlp.up_proj.weight"], in)
			for s := range gate {
				for i := range in {
					g := gate[s][i]
					gate[s][i] = g / (1 + math.Exp(-g)) * up[s][i]
				}
			}
			x = add(x, linear(gate, w[p+"mlp.down_proj.weight"], h))
		}
		x = rms(x, w["norm.weight"])
	}
	return pool(c, x)
}

func TestTheCPUReferenceOfEachFamilyMatchesAnIndependentFloat64Pass(t *testing.T) {
	for _, c := range []family.Config{tinyModernBERT(), tinyQwen3()} {
		t.Run(string(c.Kind), func(t *testing.T) {
			w := randomWeights(c, 5)
			ref, err := family.NewReference(c, w, 64)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(9, 9))
			// Several lengths, the padded positions masked: a short input, one past the local
			// window, and the whole sequence.
			for _, n := range []int{3, 21, 64} {
				tokens := make([]int32, n)
				for i := range tokens {
					tokens[i] = int32(r.IntN(c.Vocab))
				}
				got, err := ref.Forward(tokens)
				if err != nil {
					t.Fatal(err)
				}
				want := forward64(c, w, tokens)
				var dot, maxDiff float64
				for i := range want {
					dot += float64(got[i]) * float64(want[i])
					maxDiff = max(maxDiff, math.Abs(float64(got[i]-want[i])))
				}
				t.Logf("%d tokens: cosine %.6f, largest difference %.4f", n, dot, maxDiff)
				if dot < 0.9999 || maxDiff > 0.005 {
					t.Errorf("%d tokens: the fp16 reference and the float64 pass differ: cosine %.6f, largest difference %.4f", n, dot, maxDiff)
				}
			}
		})
	}
}

func TestPaddingNeverChangesAnEmbedding(t *testing.T) {
	for _, c := range []family.Config{tinyModernBERT(), tinyQwen3()} {
		w := randomWeights(c, 6)
		short, err := family.NewReference(c, w, 64)
		if err != nil {
			t.Fatal(err)
		}
		long, err := family.NewReference(c, w, 128)
		if err != nil {
			t.Fatal(err)
		}
		tokens := []int32{1, 7, 3, 9, 2}
		a, _ := short.Forward(tokens)
		b, _ := long.Forward(tokens)
		for i := range a {
			if math.Abs(float64(a[i]-b[i])) > 2e-3 {
				t.Fatalf("%s: value %d is %v at 64 positions and %v at 128", c.Kind, i, a[i], b[i])
			}
		}
	}
}

func TestEachFamilysLayerEmitsItsGoldenSources(t *testing.T) {
	for _, c := range []family.Config{tinyModernBERT(), tinyQwen3()} {
		w := randomWeights(c, 7)
		for _, layer := range []int{1, c.Layers - 1} {
			g, y, err := family.Layer(c, layer, 64, w)
			if err != nil {
				t.Fatal(err)
			}
			p, err := g.Program(y)
			if err != nil {
				t.Fatal(err)
			}
			g2, y2, _ := family.Layer(c, layer, 64, w)
			p2, _ := g2.Program(y2)
			if p.Digest() != p2.Digest() {
				t.Fatalf("%s layer %d emitted different sources twice", c.Kind, layer)
			}
			name := fmt.Sprintf("%s_layer%d_s64", c.Kind, layer)
			golden(t, name+".mil", []byte(p.Text))
			golden(t, name+".bin", p.Weights)
		}
	}
}

func TestAMissingOrMisshapenTensorIsRefusedByName(t *testing.T) {
	c := tinyQwen3()
	w := randomWeights(c, 8)
	delete(w, "layers.1.self_attn.k_norm.weight")
	if _, _, err := family.Layer(c, 1, 64, w); err == nil || !strings.Contains(err.Error(), "layers.1.self_attn.k_norm.weight") {
		t.Fatalf("a missing tensor: %v", err)
	}
	w = randomWeights(c, 8)
	w["layers.0.mlp.up_proj.weight"] = w["layers.0.mlp.up_proj.weight"][:10]
	if _, _, err := family.Layer(c, 0, 64, w); err == nil || !strings.Contains(err.Error(), "up_proj") {
		t.Fatalf("a misshapen tensor: %v", err)
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if string(want) != string(got) {
		t.Fatalf("%s differs from its golden file (run with -update if the change is intended)", name)
	}
}

func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// ladder is every rung a catalog lane may have.
var ladder = []int{64, 128, 256, 512, 1024, 2048, 4096, 8192}

// zeroWeights gives every tensor zeros from one shared buffer: the programs' text and shapes
// do not depend on the values.
type zeroWeights struct{ buf []float32 }

func (z *zeroWeights) Tensor(name string, shape ...int) ([]float32, error) {
	n := product(shape)
	if len(z.buf) < n {
		z.buf = make([]float32, n)
	}
	return z.buf[:n], nil
}

// TestEveryLayerOfBothFamiliesPassesTheValidatorAtEveryRung emits every layer of the tiny
// models at every rung, and every form of layer of the full-size catalog models (gte-modernbert-
// base, qwen3-embedding-0.6b) at every rung, through the validator that family.Layer's
// programs pass before they are written (Program returns its error). Under the race detector
// the full-size models take the smallest rung, 256 (where a grouped-query reshape to d*S
// first passes 16384) and the largest: every dimension grows with S, and nothing else in a
// program depends on it.
func TestEveryLayerOfBothFamiliesPassesTheValidatorAtEveryRung(t *testing.T) {
	gte, err := family.ParseConfig([]byte(gteModernBERTConfig), "")
	if err != nil {
		t.Fatal(err)
	}
	qwen, err := family.ParseConfig([]byte(qwen3EmbeddingConfig), "")
	if err != nil {
		t.Fatal(err)
	}
	// form is what a layer's program depends on besides its weights (layer.go): the first
	// ModernBERT layer has no attention norm, global and local layers differ, the last layer
	// adds the final norm. Full-size layers of one form emit the same text, so each form is
	// emitted once per rung; the tiny models' every layer is.
	form := func(c family.Config, i int) string {
		if c.Kind == family.ModernBERT {
			return fmt.Sprint(i == 0, i%c.GlobalEvery == 0, i == c.Layers-1)
		}
		return fmt.Sprint(i == c.Layers-1)
	}
	for _, tc := range []struct {
		c    family.Config
		full bool
	}{{tinyModernBERT(), false}, {tinyQwen3(), false}, {gte, true}, {qwen, true}} {
		w, rungs := &zeroWeights{}, ladder
		if tc.full && raceEnabled {
			rungs = []int{64, 256, 8192}
		}
		for _, seq := range rungs {
			seen := map[string]bool{}
			for i := range tc.c.Layers {
				if tc.full && seen[form(tc.c, i)] {
					continue
				}
				seen[form(tc.c, i)] = true
				g, y, err := family.Layer(tc.c, i, seq, w)
				if err != nil {
					t.Fatal(err)
				}
				p, err := g.Program(y)
				if err != nil {
					t.Fatalf("%s (hidden %d) layer %d at %d: %v", tc.c.Kind, tc.c.Hidden, i, seq, err)
				}
				if err := mil.Validate(p); err != nil {
					t.Fatalf("%s layer %d at %d: %v", tc.c.Kind, i, seq, err)
				}
			}
		}
	}
}

// TestTheDownProjectionIsScaledAroundItsConvolution: in both families the MLP's activation is
// divided by 16 before the down projection's convolution and its result multiplied by 16
// after (maderix/h3.c-ane h3_ane_block.m), so the accumulator holds a sixteenth of the sums.
func TestTheDownProjectionIsScaledAroundItsConvolution(t *testing.T) {
	for _, tc := range []struct {
		c    family.Config
		down string
	}{{tinyModernBERT(), "mlp_wo"}, {tinyQwen3(), "mlp_down_proj"}} {
		g, y, err := family.Layer(tc.c, 1, 64, randomWeights(tc.c, 7))
		if err != nil {
			t.Fatal(err)
		}
		p, err := g.Program(y)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{
			tc.down + "_in_by = const()[name = string(\"" + tc.down + "_in_by\"), val = fp16(0.0625)]",
			tc.down + "_in = mul(x = mlp_act, y = " + tc.down + "_in_by)",
			"x = " + tc.down + "_in)[name = string(\"" + tc.down + "\")]",
			tc.down + "_out_by = const()[name = string(\"" + tc.down + "_out_by\"), val = fp16(16)]",
			tc.down + "_out = mul(x = " + tc.down + ", y = " + tc.down + "_out_by)",
			"add(x = attn_residual, y = " + tc.down + "_out)",
		} {
			if !strings.Contains(p.Text, want) {
				t.Errorf("%s: the program lacks %q", tc.c.Kind, want)
			}
		}
	}
}
