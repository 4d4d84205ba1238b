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
	"errors"
	"strings"
	"testing"
)

// sampleLayer is a small layer using every operation the families use: the norms, a GeGLU and
// a SwiGLU, grouped-query attention with q/k norms, the rotary embedding and a causal mask,
// and a local window.
func sampleLayer(t testing.TB) Program {
	t.Helper()
	const c, seq = 16, 64
	g, x := NewGraph(c, seq)
	mask := g.Mask()
	w := func(n int) []float32 { return weights(n, 1, 0.25) }
	gamma := make([]float32, c)
	for i := range gamma {
		gamma[i] = 1 + float32(i)/32
	}
	n := g.RMSNorm("in_norm", x, gamma, 1e-6)
	q := g.Linear("q_proj", n, 16, w(16*c))
	k := g.Linear("k_proj", n, 8, w(8*c))
	v := g.Linear("v_proj", n, 8, w(8*c))
	hg := []float32{1, 1.5, 0.5, 1, 1, 1, 1, 1}
	a := g.Attention("attn", q, k, v, mask, Attention{Heads: 2, KVHeads: 1, HeadDim: 8, RoPETheta: 10000, QNorm: hg, KNorm: hg, NormEps: 1e-6, Causal: true})
	x = g.Add("attn_res", x, g.Linear("o_proj", a, c, w(c*16)))
	l := g.Attention("local", g.Slice("lq", x, 0, 8), g.Slice("lk", x, 8, 16), g.Slice("lv", x, 0, 8), mask, Attention{Heads: 1, KVHeads: 1, HeadDim: 8, Window: 16})
	x = g.Add("local_res", x, g.Linear("l_proj", l, c, w(c*8)))
	m := g.LayerNorm("mlp_norm", x, gamma, 1e-5)
	gelu := g.Mul("geglu", g.GELUExact("gelu", g.Linear("up", m, 8, w(8*c))), g.SiLU("silu", g.Linear("gate", m, 8, w(8*c))))
	p, err := g.Program(g.Add("y", x, g.Linear("down", gelu, c, w(c*8))))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAProgramOfEveryOperationTheFamiliesUsePassesTheValidator(t *testing.T) {
	p := sampleLayer(t)
	if err := Validate(p); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"conv(", "pow(", "reduce_mean(", "sub(", "erf(", "silu(", "slice_by_size(", "concat(", "reshape(", "transpose(",
		"matmul(", "softmax(", "tile(", "abs(", "greater(", "select("} {
		if !strings.Contains(p.Text, op) {
			t.Errorf("the sample layer does not use %s: the validator is not tried on it", op)
		}
	}
}

// breaks rewrites a valid program into one that breaks a rule.
type breaks struct {
	rule Rule
	edit func(p Program) Program
}

func replace(old, new string) func(Program) Program {
	return func(p Program) Program {
		if !strings.Contains(p.Text, old) {
			panic("the sample has no " + old)
		}
		p.Text = strings.Replace(p.Text, old, new, 1)
		return p
	}
}

func TestTheValidatorRefusesWhatTheDeviceIsReportedToRefuse(t *testing.T) {
	base := sampleLayer(t)
	for name, tc := range map[string]breaks{
		"no buildInfo block": {RuleStructure, replace(buildInfo+"\n", "")},
		"a variable declared twice (ModernBERT's attn_q)": {RuleNames, replace(
			`tensor<fp16, [1, 8, 1, 64]> lk = slice_by_size(`, `tensor<fp16, [1, 8, 1, 64]> lq = slice_by_size(`)},
		"an operation named after another variable": {RuleNames, replace(`[name = string("y")]`, `[name = string("down")]`)},
		"an argument naming nothing":                {RuleReference, replace(`silu(x = gate)`, `silu(x = gates)`)},
		"rsqrt without epsilon": {RuleOp, replace(
			`in_norm_inv = pow(x = in_norm_var, y = in_norm_nhalf)`, `in_norm_inv = rsqrt(x = in_norm_var)`)},
		"the gelu operation":      {RuleOp, replace(`gelu_erf = erf(x = gelu_scaled)`, `gelu_erf = gelu(x = gelu_scaled)`)},
		"an operation it lacks":   {RuleOp, replace(`silu(x = gate)`, `swish(x = gate)`)},
		"pow with a tensor power": {RuleDType, replace(`pow(x = in_norm_var, y = in_norm_nhalf)`, `pow(x = in_norm_var, y = in_norm_var)`)},
		"integer arithmetic": {RuleDType, replace(`        tensor<fp16, [1, 1, 64, 64]> attn_band_dhi =`,
			"        tensor<int32, [4]> bad = add(x = attn_band_reps, y = attn_band_reps)[name = string(\"bad\")];\n        tensor<fp16, [1, 1, 64, 64]> attn_band_dhi =")},
		"a range of integers": {RuleOp, replace(`        tensor<fp16, [1, 1, 64, 64]> attn_band_dhi =`,
			"        tensor<fp16, [1, 1, 1, 64]> pos = range_1d(x = attn_band_khi)[name = string(\"pos\")];\n        tensor<fp16, [1, 1, 64, 64]> attn_band_dhi =")},
		"a 2-D fp16 tensor": {RuleRank, replace(`tensor<fp16, [1, 1, 64, 64]> attn_band_khit = tile(`, `tensor<fp16, [64, 64]> attn_band_khit = tile(`)},
		"a dimension over 16384 (the old grouped-query reshape)": {RuleDims, replace(
			`tensor<fp16, [1, 2, 8, 64]> attn_q4 = reshape(`, `tensor<fp16, [1, 1, 1, 32768]> attn_q4 = reshape(`)},
		"a declared type the operation does not give": {RuleShape, replace(`tensor<fp16, [1, 16, 1, 64]> attn_res =`, `tensor<fp16, [1, 16, 1, 128]> attn_res =`)},
		"a literal in exponent notation":              {RuleLiteral, replace(`val = fp16(0.00006103515625)`, `val = fp16(6.103515625e-05)`)},
		"an epsilon the device flushes to zero":       {RuleLiteral, replace(`val = fp16(0.00006103515625)`, `val = fp16(0.00000095367431640625)`)},
		"a literal that is no fp16 value":             {RuleLiteral, replace(`val = fp16(0.00006103515625)`, `val = fp16(0.000001)`)},
		"a literal beyond fp16":                       {RuleLiteral, replace(`val = fp16(-10000)`, `val = fp16(-100000)`)},
		"inputs not in binding order": {RuleIO, replace(
			`main<ios18>(tensor<fp16, [1, 1, 1, 64]> mask, tensor<fp16, [1, 16, 1, 64]> x)`, `main<ios18>(tensor<fp16, [1, 16, 1, 64]> x, tensor<fp16, [1, 1, 1, 64]> mask)`)},
		"a weight read from another file":     {RuleBlob, replace(`@model_path/weights/weight.bin"), offset = uint64(64)`, `@model_path/weights/other.bin"), offset = uint64(64)`)},
		"a weight read from the wrong record": {RuleBlob, replace(`offset = uint64(64)`, `offset = uint64(128)`)},
		"a record no constant uses": {RuleBlob, func(p Program) Program {
			b := &Blob{buf: append([]byte(nil), p.Weights...), size: uint64(len(p.Weights)), count: uint32(strings.Count(p.Text, "BLOBFILE"))}
			b.AddFP16([]float32{1})
			p.Weights = b.Bytes()
			return p
		}},
	} {
		t.Run(name, func(t *testing.T) {
			err := Validate(tc.edit(base))
			var ve *ValidationError
			if !errors.As(err, &ve) || ve.Rule != tc.rule {
				t.Fatalf("got %v, want a %s error", err, tc.rule)
			}
		})
	}
}

func TestAGraphWhoseOperationsShareAVariableNameIsRefused(t *testing.T) {
	g, x := NewGraph(16, 64)
	mask := g.Mask()
	// attn_qt is the attention's own transposed query; a slice may not take its name.
	q := g.Slice("attn_qt", x, 0, 8)
	g.Attention("attn", q, g.Slice("k", x, 8, 16), g.Slice("v", x, 0, 8), mask, Attention{Heads: 1, KVHeads: 1, HeadDim: 8})
	if _, err := g.Program(q); err == nil || !strings.Contains(err.Error(), "attn_qt") {
		t.Fatalf("a variable declared twice: %v", err)
	}
}

func TestGroupedQueryAttentionAtQwen3sShapeStaysWithinTheDevicesDimensions(t *testing.T) {
	// Qwen3-Embedding-0.6B: 16 query heads, 8 key/value heads of 128, here at S = 256 and 8192.
	for _, seq := range []int{256, 8192} {
		g, x := NewGraph(4096, seq)
		mask := g.Mask()
		y := g.Attention("attn", g.Slice("q", x, 0, 2048), g.Slice("k", x, 2048, 3072), g.Slice("v", x, 3072, 4096), mask,
			Attention{Heads: 16, KVHeads: 8, HeadDim: 128, Causal: true})
		if _, err := g.Program(y); err != nil {
			t.Fatalf("S = %d: %v", seq, err)
		}
	}
}

// FuzzValidate: no text and no weights make the validator panic; what it accepts keeps its
// promises (unique names, inputs in name order).
func FuzzValidate(f *testing.F) {
	p, err := Linear{In: 4, Out: 8, Seq: 64, Weights: weights(4, 8, 1)}.Program()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(p.Text, p.Weights)
	f.Add(strings.Replace(p.Text, "[8, 4, 1, 1]", "[8, 4]", 1), p.Weights)
	f.Add(strings.Replace(p.Text, "conv(", "concat(", 1), p.Weights[:70])
	f.Add("program(1.3)\n"+buildInfo+"\n{\n    func main<ios18>(tensor<fp16, []> x) {\n    } -> (x);\n}\n", []byte{})
	f.Fuzz(func(t *testing.T, text string, w []byte) {
		q := Program{Text: text, Weights: w}
		if err := Validate(q); err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("an untyped error: %v", err)
			}
			return
		}
		names := map[string]bool{}
		for _, line := range strings.Split(text, "\n") {
			if n, _, ok := strings.Cut(strings.TrimSpace(line), " = "); ok {
				f := strings.Fields(n)
				if v := f[len(f)-1]; names[v] {
					t.Fatalf("accepted %s declared twice", v)
				} else {
					names[v] = true
				}
			}
		}
	})
}

// BenchmarkValidate is the validator alone on a layer of every operation the families use.
func BenchmarkValidate(b *testing.B) {
	p := sampleLayer(b)
	for b.Loop() {
		if err := Validate(p); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(strings.Count(p.Text, "\n")), "lines")
}
