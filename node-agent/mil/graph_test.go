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

package mil

import (
	"math"
	"math/rand/v2"
	"testing"
)

// mlpWeights are the weights of one MLP block with channels c and hidden width h.
type mlpWeights struct {
	c, h          int
	norm          []float32
	up, gate, out []float32 // up is [2h, c] for GeGLU (value then gate halves), [h, c] for SwiGLU
}

func randomMLP(c, h int, seed uint64, geglu bool) mlpWeights {
	r := rand.New(rand.NewPCG(seed, 7))
	vec := func(n int, scale float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = scale * (2*r.Float32() - 1)
		}
		return v
	}
	w := mlpWeights{c: c, h: h, norm: vec(c, 1), out: vec(c*h, 0.3)}
	for i := range w.norm {
		w.norm[i] += 1
	}
	if geglu {
		w.up = vec(2*h*c, 0.3)
	} else {
		w.up, w.gate = vec(h*c, 0.3), vec(h*c, 0.3)
	}
	return w
}

// encoderMLP is a ModernBERT-style block: LayerNorm, a GeGLU of width h, the residual.
func encoderMLP(w mlpWeights, seq int) (*Graph, Value) {
	g, x := NewGraph(w.c, seq)
	n := g.LayerNorm("mlp_norm", x, w.norm, 1e-5)
	up := g.Linear("mlp_wi", n, 2*w.h, w.up)
	a := g.Slice("mlp_input", up, 0, w.h)
	b := g.Slice("mlp_gate", up, w.h, 2*w.h)
	act := g.Mul("mlp_act", g.GELUExact("mlp_gelu", a), b)
	return g, g.Add("y", x, g.Linear("mlp_wo", act, w.c, w.out))
}

// decoderMLP is a Qwen3-style block: RMSNorm, a SwiGLU of width h, the residual.
func decoderMLP(w mlpWeights, seq int) (*Graph, Value) {
	g, x := NewGraph(w.c, seq)
	n := g.RMSNorm("mlp_norm", x, w.norm, 1e-6)
	gate := g.SiLU("mlp_silu", g.Linear("mlp_gate_proj", n, w.h, w.gate))
	up := g.Linear("mlp_up_proj", n, w.h, w.up)
	return g, g.Add("y", x, g.Linear("mlp_down_proj", g.Mul("mlp_act", gate, up), w.c, w.out))
}

// The independent float64 forward passes, written out directly from the models' definitions.

func matvec(w []float32, rows, cols int, x []float64) []float64 {
	y := make([]float64, rows)
	for r := range rows {
		for c := range cols {
			y[r] += float64(w[r*cols+c]) * x[c]
		}
	}
	return y
}

func refEncoder(w mlpWeights, x []float64) []float64 {
	var mean, v float64
	for _, a := range x {
		mean += a
	}
	mean /= float64(w.c)
	for _, a := range x {
		v += (a - mean) * (a - mean)
	}
	n := make([]float64, w.c)
	for i := range n {
		n[i] = (x[i] - mean) / math.Sqrt(v/float64(w.c)+1e-5) * float64(w.norm[i])
	}
	up := matvec(w.up, 2*w.h, w.c, n)
	act := make([]float64, w.h)
	for i := range act {
		a := up[i]
		act[i] = 0.5 * a * (1 + math.Erf(a/math.Sqrt2)) * up[w.h+i]
	}
	out := matvec(w.out, w.c, w.h, act)
	for i := range out {
		out[i] += x[i]
	}
	return out
}

func refDecoder(w mlpWeights, x []float64) []float64 {
	var sq float64
	for _, a := range x {
		sq += a * a
	}
	n := make([]float64, w.c)
	for i := range n {
		n[i] = x[i] / math.Sqrt(sq/float64(w.c)+1e-6) * float64(w.norm[i])
	}
	gate, up := matvec(w.gate, w.h, w.c, n), matvec(w.up, w.h, w.c, n)
	act := make([]float64, w.h)
	for i := range act {
		act[i] = gate[i] / (1 + math.Exp(-gate[i])) * up[i]
	}
	out := matvec(w.out, w.c, w.h, act)
	for i := range out {
		out[i] += x[i]
	}
	return out
}

func TestTheCPUReferenceOfEachFamilysMLPMatchesAnIndependentFloat64Pass(t *testing.T) {
	const c, h, seq = 16, 32, 64
	for _, tc := range []struct {
		name  string
		geglu bool
		build func(mlpWeights, int) (*Graph, Value)
		ref   func(mlpWeights, []float64) []float64
	}{
		{"encoder (LayerNorm, GeGLU)", true, encoderMLP, refEncoder},
		{"decoder (RMSNorm, SwiGLU)", false, decoderMLP, refDecoder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := randomMLP(c, h, 42, tc.geglu)
			g, y := tc.build(w, seq)
			r := rand.New(rand.NewPCG(1, 2))
			x := make([]float32, c*seq)
			for i := range x {
				x[i] = 2*r.Float32() - 1
			}
			got, err := g.Eval(x, y)
			if err != nil {
				t.Fatal(err)
			}
			var worst float64
			for s := range seq {
				col := make([]float64, c)
				for i := range c {
					col[i] = float64(x[i*seq+s])
				}
				want := tc.ref(w, col)
				for i := range c {
					worst = max(worst, math.Abs(float64(got[i*seq+s])-want[i]))
				}
			}
			// fp16 holds about three decimal digits; the block's values are of order one.
			if worst > 0.02 {
				t.Fatalf("the CPU reference is %.4f away from the float64 pass", worst)
			}
			if worst == 0 {
				t.Fatal("no fp16 rounding at all: the reference does not model the device")
			}
		})
	}
}

func TestEachFamilysMLPEmitsItsGoldenSourcesDeterministically(t *testing.T) {
	for _, tc := range []struct {
		file  string
		geglu bool
		build func(mlpWeights, int) (*Graph, Value)
	}{
		{"encoder_mlp_c8_h16_s64", true, encoderMLP},
		{"decoder_mlp_c8_h16_s64", false, decoderMLP},
	} {
		p := func() Program {
			g, y := tc.build(randomMLP(8, 16, 3, tc.geglu), 64)
			p, err := g.Program(y)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		a, b := p(), p()
		if a.Text != b.Text || a.Digest() != b.Digest() {
			t.Fatalf("%s: the same block emitted different sources", tc.file)
		}
		golden(t, tc.file+".mil", []byte(a.Text))
		golden(t, tc.file+".bin", a.Weights)
	}
}

func TestAGraphTheDeviceCannotTakeIsRefused(t *testing.T) {
	g, x := NewGraph(8, 64)
	g.Add("y", x, g.Slice("half", x, 0, 4))
	if _, err := g.Program(x); err == nil {
		t.Fatal("adding 8 and 4 channels was accepted")
	}
	g, x = NewGraph(8, 64)
	y := g.SiLU("a", x)
	g.SiLU("a", y)
	if _, err := g.Program(y); err == nil {
		t.Fatal("a name used twice was accepted")
	}
	g, x = NewGraph(8, 64)
	if _, err := g.Program(g.Slice("s", x, 4, 12)); err == nil {
		t.Fatal("a slice past the channels was accepted")
	}
	if _, err := g.Eval(make([]float32, 3), x); err == nil {
		t.Fatal("an input of the wrong size was evaluated")
	}
}
