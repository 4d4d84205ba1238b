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
	"fmt"
	"math"
	"strings"
)

// MaskNegative is what the key mask adds to the score of a key a query must not see: far
// below any real score, yet finite in fp16 even when two masks add up, so a row with one
// visible key never divides by zero.
const MaskNegative = -1e4

// Attention describes one multi-head attention block's shape and rules.
type Attention struct {
	// Heads query heads and KVHeads key/value heads (grouped-query attention when fewer; each
	// key/value head serves Heads/KVHeads consecutive query heads), each HeadDim wide.
	Heads, KVHeads, HeadDim int
	// RoPETheta is the rotary embedding's base (0: no rotary embedding). The rotation is the
	// rotate-half form over each head's dimensions, at positions 0..Seq-1.
	RoPETheta float64
	// QNorm and KNorm, when set, are RMSNorm gammas (HeadDim values) applied to each query and
	// key head before the rotation (Qwen3); NormEps is their epsilon.
	QNorm, KNorm []float32
	NormEps      float32
	// Causal lets a query see only keys at or before it (a decoder); Window, when positive,
	// lets it see only keys within Window/2 positions either side (ModernBERT's local layers).
	Causal bool
	Window int
}

// Mask is the graph's second input: the key mask, [1, 1, 1, Seq], 0 for a real token and
// MaskNegative for padding. It is computed on the CPU for each request and added to every
// query's scores.
func (g *Graph) Mask() Value {
	if !g.masked {
		g.name("mask")
	}
	g.masked = true
	return Value{name: "mask", channels: 1}
}

// Attention is softmax(q k^T / sqrt(HeadDim) + masks) v over heads, from the projected q, k
// and v ([1, Heads*HeadDim, 1, Seq] and [1, KVHeads*HeadDim, 1, Seq]), as one composed
// operation: reshapes to [1, heads, HeadDim, Seq], the optional per-head norms and rotary
// embedding, batched matmuls and a softmax over the keys. The structural mask (causal or
// banded) is built in the program from positions, so no Seq x Seq constant is stored.
func (g *Graph) Attention(name string, q, k, v, mask Value, a Attention) Value {
	name = g.name(name)
	h, kvh, d, seq := a.Heads, a.KVHeads, a.HeadDim, g.seq
	out := Value{name: name, channels: h * d}
	switch {
	case h <= 0 || kvh <= 0 || d <= 0 || h%kvh != 0:
		g.fail("%s: %d query heads cannot share %d key/value heads of %d dimensions", name, h, kvh, d)
		return out
	case a.RoPETheta > 0 && d%2 != 0:
		g.fail("%s: the rotary embedding needs an even head dimension, got %d", name, d)
		return out
	case q.channels != h*d || k.channels != kvh*d || v.channels != kvh*d:
		g.fail("%s: q, k and v have %d, %d and %d channels, want %d, %d and %d", name, q.channels, k.channels, v.channels, h*d, kvh*d, kvh*d)
		return out
	case mask.name != "mask":
		g.fail("%s: the key mask must be the graph's mask input", name)
		return out
	case a.QNorm != nil && len(a.QNorm) != d || a.KNorm != nil && len(a.KNorm) != d:
		g.fail("%s: the query and key norms need %d values", name, d)
		return out
	case a.Window < 0 || a.Window%2 != 0:
		g.fail("%s: the local window must be even, got %d", name, a.Window)
		return out
	}
	t4 := func(dims ...int) string {
		s := make([]string, len(dims))
		for i, x := range dims {
			s[i] = fmt.Sprint(x)
		}
		return "tensor<fp16, [" + strings.Join(s, ", ") + "]>"
	}
	ints := func(suffix string, vals ...int) string {
		s := make([]string, len(vals))
		for i, x := range vals {
			s[i] = fmt.Sprint(x)
		}
		typ := fmt.Sprintf("tensor<int32, [%d]>", len(vals))
		return fmt.Sprintf(`%s %s_%s = const()[name = string("%s_%s"), val = %s([%s])];`, typ, name, suffix, name, suffix, typ, strings.Join(s, ", "))
	}
	scalar := func(suffix string, val float32) string {
		return fmt.Sprintf(`fp16 %s_%s = const()[name = string("%s_%s"), val = fp16(%s)];`, name, suffix, name, suffix, fp16Literal(val))
	}
	emit := func(typ, suffix, call string) string {
		return fmt.Sprintf(`%s %s_%s = %s[name = string("%s_%s")];`, typ, name, suffix, call, name, suffix)
	}
	var lines []string
	lines = append(lines,
		ints("qshape", 1, h, d, seq), ints("kvshape", 1, kvh, d, seq),
		emit(t4(1, h, d, seq), "q", fmt.Sprintf("reshape(shape = %s_qshape, x = %s)", name, q.name)),
		emit(t4(1, kvh, d, seq), "k", fmt.Sprintf("reshape(shape = %s_kvshape, x = %s)", name, k.name)),
		emit(t4(1, kvh, d, seq), "v", fmt.Sprintf("reshape(shape = %s_kvshape, x = %s)", name, v.name)))

	// The per-head norms, over each head's dimensions (axis 2).
	var qg, kg []float32
	qn, kn := name+"_q", name+"_k"
	if a.QNorm != nil || a.KNorm != nil {
		lines = append(lines, ints("normaxes", 2),
			fmt.Sprintf(`bool %s_normkeep = const()[name = string("%s_normkeep"), val = bool(true)];`, name, name),
			scalar("normeps", a.NormEps))
	}
	norm := func(which string, heads int, gamma []float32) (string, []float32) {
		in := name + "_" + which
		if gamma == nil {
			return in, nil
		}
		gline, gw := g.weightConst(fmt.Sprintf("%s_%snorm_gamma", name, which), fmt.Sprintf("[1, 1, %d, 1]", d), gamma)
		red := t4(1, heads, 1, seq)
		full := t4(1, heads, d, seq)
		lines = append(lines, gline,
			emit(full, which+"sq", fmt.Sprintf("mul(x = %s, y = %s)", in, in)),
			emit(red, which+"ms", fmt.Sprintf("reduce_mean(axes = %s_normaxes, keep_dims = %s_normkeep, x = %s_%ssq)", name, name, name, which)),
			emit(red, which+"var", fmt.Sprintf("add(x = %s_%sms, y = %s_normeps)", name, which, name)),
			emit(red, which+"inv", fmt.Sprintf("rsqrt(x = %s_%svar)", name, which)),
			emit(full, which+"n0", fmt.Sprintf("mul(x = %s, y = %s_%sinv)", in, name, which)),
			emit(full, which+"n", fmt.Sprintf("mul(x = %s_%sn0, y = %s_%snorm_gamma)", name, which, name, which)))
		return name + "_" + which + "n", gw
	}
	qn, qg = norm("q", h, a.QNorm)
	kn, kg = norm("k", kvh, a.KNorm)

	// The rotary embedding: x cos + rotate_half(x) sin, with cos and sin as [1, 1, d, seq]
	// constants shared by every head.
	var cos, sin []float32
	if a.RoPETheta > 0 {
		cos, sin = rope(a.RoPETheta, d, seq)
		cline, cw := g.weightConst(name+"_cos", fmt.Sprintf("[1, 1, %d, %d]", d, seq), cos)
		sline, sw := g.weightConst(name+"_sin", fmt.Sprintf("[1, 1, %d, %d]", d, seq), sin)
		cos, sin = cw, sw
		lines = append(lines, cline, sline, scalar("minus", -1),
			fmt.Sprintf(`int32 %s_ropeaxis = const()[name = string("%s_ropeaxis"), val = int32(2)];`, name, name),
			fmt.Sprintf(`bool %s_interleave = const()[name = string("%s_interleave"), val = bool(false)];`, name, name))
		rot := func(which, in string, heads int) string {
			lines = append(lines,
				ints(which+"lo_begin", 0, 0, 0, 0), ints(which+"lo_end", 1, heads, d/2, seq),
				ints(which+"hi_begin", 0, 0, d/2, 0), ints(which+"hi_end", 1, heads, d, seq),
				emit(t4(1, heads, d/2, seq), which+"lo", fmt.Sprintf("slice_by_index(begin = %s_%slo_begin, end = %s_%slo_end, x = %s)", name, which, name, which, in)),
				emit(t4(1, heads, d/2, seq), which+"hi", fmt.Sprintf("slice_by_index(begin = %s_%shi_begin, end = %s_%shi_end, x = %s)", name, which, name, which, in)),
				emit(t4(1, heads, d/2, seq), which+"hineg", fmt.Sprintf("mul(x = %s_%shi, y = %s_minus)", name, which, name)),
				emit(t4(1, heads, d, seq), which+"half", fmt.Sprintf("concat(axis = %s_ropeaxis, interleave = %s_interleave, values = (%s_%shineg, %s_%slo))", name, name, name, which, name, which)),
				emit(t4(1, heads, d, seq), which+"c", fmt.Sprintf("mul(x = %s, y = %s_cos)", in, name)),
				emit(t4(1, heads, d, seq), which+"s", fmt.Sprintf("mul(x = %s_%shalf, y = %s_sin)", name, which, name)),
				emit(t4(1, heads, d, seq), which+"r", fmt.Sprintf("add(x = %s_%sc, y = %s_%ss)", name, which, name, which)))
			return name + "_" + which + "r"
		}
		qn = rot("q", qn, h)
		kn = rot("k", kn, kvh)
	}

	// Grouped-query attention: each key/value head is repeated for its group of query heads.
	vn := name + "_v"
	if group := h / kvh; group > 1 {
		rep := func(which, in string) string {
			lines = append(lines,
				emit(t4(1, kvh, 1, d*seq), which+"flat", fmt.Sprintf("reshape(shape = %s_flatshape, x = %s)", name, in)),
				emit(t4(1, kvh, group, d*seq), which+"tiled", fmt.Sprintf("tile(reps = %s_reps, x = %s_%sflat)", name, name, which)),
				emit(t4(1, h, d, seq), which+"rep", fmt.Sprintf("reshape(shape = %s_qshape, x = %s_%stiled)", name, name, which)))
			return name + "_" + which + "rep"
		}
		lines = append(lines, ints("flatshape", 1, kvh, 1, d*seq), ints("reps", 1, 1, group, 1))
		kn, vn = rep("k", kn), rep("v", vn)
	}

	// Scores: (q / sqrt(d))^T k per head, [1, h, seq (queries), seq (keys)], plus the key mask
	// and the structural mask.
	scale := float32(1 / math.Sqrt(float64(d)))
	lines = append(lines, scalar("scale", scale),
		fmt.Sprintf(`bool %s_true = const()[name = string("%s_true"), val = bool(true)];`, name, name),
		fmt.Sprintf(`bool %s_false = const()[name = string("%s_false"), val = bool(false)];`, name, name),
		emit(t4(1, h, d, seq), "qscaled", fmt.Sprintf("mul(x = %s, y = %s_scale)", qn, name)),
		emit(t4(1, h, seq, seq), "scores", fmt.Sprintf("matmul(transpose_x = %s_true, transpose_y = %s_false, x = %s_qscaled, y = %s)", name, name, name, kn)),
		emit(t4(1, h, seq, seq), "masked", fmt.Sprintf("add(x = %s_scores, y = %s)", name, mask.name)))
	logits := name + "_masked"
	if a.Causal || a.Window > 0 {
		lines = append(lines,
			fmt.Sprintf(`int32 %s_zero = const()[name = string("%s_zero"), val = int32(0)];`, name, name),
			fmt.Sprintf(`int32 %s_seq = const()[name = string("%s_seq"), val = int32(%d)];`, name, name, seq),
			fmt.Sprintf(`int32 %s_one = const()[name = string("%s_one"), val = int32(1)];`, name, name),
			ints("colshape", seq, 1), ints("rowshape", 1, seq), ints("bandshape", 1, 1, seq, seq),
			scalar("hidden", MaskNegative), scalar("visible", 0),
			fmt.Sprintf(`tensor<int32, [%d]> %s_pos = range_1d(end = %s_seq, start = %s_zero, step = %s_one)[name = string("%s_pos")];`, seq, name, name, name, name, name),
			fmt.Sprintf(`tensor<int32, [%d, 1]> %s_qpos = reshape(shape = %s_colshape, x = %s_pos)[name = string("%s_qpos")];`, seq, name, name, name, name),
			fmt.Sprintf(`tensor<int32, [1, %d]> %s_kpos = reshape(shape = %s_rowshape, x = %s_pos)[name = string("%s_kpos")];`, seq, name, name, name, name),
			fmt.Sprintf(`tensor<int32, [%d, %d]> %s_dist = sub(x = %s_kpos, y = %s_qpos)[name = string("%s_dist")];`, seq, seq, name, name, name, name))
		var far string
		if a.Causal {
			far = fmt.Sprintf(`tensor<bool, [%d, %d]> %s_far = greater(x = %s_dist, y = %s_zero)[name = string("%s_far")];`, seq, seq, name, name, name, name)
		} else {
			lines = append(lines,
				fmt.Sprintf(`int32 %s_halfwindow = const()[name = string("%s_halfwindow"), val = int32(%d)];`, name, name, a.Window/2),
				fmt.Sprintf(`tensor<int32, [%d, %d]> %s_absdist = abs(x = %s_dist)[name = string("%s_absdist")];`, seq, seq, name, name, name))
			far = fmt.Sprintf(`tensor<bool, [%d, %d]> %s_far = greater(x = %s_absdist, y = %s_halfwindow)[name = string("%s_far")];`, seq, seq, name, name, name, name)
		}
		lines = append(lines, far,
			fmt.Sprintf(`tensor<fp16, [%d, %d]> %s_band = select(a = %s_hidden, b = %s_visible, cond = %s_far)[name = string("%s_band")];`, seq, seq, name, name, name, name, name),
			emit(t4(1, 1, seq, seq), "band4", fmt.Sprintf("reshape(shape = %s_bandshape, x = %s_band)", name, name)),
			emit(t4(1, h, seq, seq), "banded", fmt.Sprintf("add(x = %s_masked, y = %s_band4)", name, name)))
		logits = name + "_banded"
	}
	lines = append(lines,
		fmt.Sprintf(`int32 %s_softmaxaxis = const()[name = string("%s_softmaxaxis"), val = int32(-1)];`, name, name),
		emit(t4(1, h, seq, seq), "probs", fmt.Sprintf("softmax(axis = %s_softmaxaxis, x = %s)", name, logits)),
		emit(t4(1, h, d, seq), "heads", fmt.Sprintf("matmul(transpose_x = %s_false, transpose_y = %s_true, x = %s, y = %s_probs)", name, name, vn, name)),
		ints("outshape", 1, h*d, 1, seq),
		fmt.Sprintf(`%s %s = reshape(shape = %s_outshape, x = %s_heads)[name = string("%s")];`, g.tensor(h*d), name, name, name, name))

	ref := attentionRef{a: a, seq: seq, qg: qg, kg: kg, cos: cos, sin: sin, scale: float64(fp16(scale)), eps: fp16(a.NormEps)}
	return g.add(op{lines: lines, out: out, eval: func(env map[string][]float32, p precision) []float32 {
		return ref.eval(env[q.name], env[k.name], env[v.name], env[mask.name], p)
	}})
}

// rope is the rotary embedding's cos and sin tables, [d, seq] channel-major: dimension i and
// i + d/2 rotate together at frequency theta^(-2i/d).
func rope(theta float64, d, seq int) (cos, sin []float32) {
	cos, sin = make([]float32, d*seq), make([]float32, d*seq)
	for i := range d / 2 {
		freq := math.Pow(theta, -2*float64(i)/float64(d))
		for s := range seq {
			c, n := math.Cos(float64(s)*freq), math.Sin(float64(s)*freq)
			cos[i*seq+s], cos[(i+d/2)*seq+s] = float32(c), float32(c)
			sin[i*seq+s], sin[(i+d/2)*seq+s] = float32(n), float32(n)
		}
	}
	return cos, sin
}

// attentionRef is the CPU reference of one Attention: every MIL operation's result rounded to
// fp16 as the device holds it; a composed step (a norm, a dot product, the softmax) runs in
// float64 and is rounded once.
type attentionRef struct {
	a        Attention
	seq      int
	qg, kg   []float32
	cos, sin []float32
	scale    float64
	eps      float32
}

func (r attentionRef) eval(q, k, v, mask []float32, p precision) []float32 {
	fp16 := p.v
	a, seq, d := r.a, r.seq, r.a.HeadDim
	// heads splits a [heads*d, seq] value into per-head [d][seq] rows.
	heads := func(x []float32, n int) [][][]float32 {
		out := make([][][]float32, n)
		for hh := range n {
			out[hh] = make([][]float32, d)
			for i := range d {
				out[hh][i] = append([]float32(nil), x[(hh*d+i)*seq:(hh*d+i+1)*seq]...)
			}
		}
		return out
	}
	qs, ks, vs := heads(q, a.Heads), heads(k, a.KVHeads), heads(v, a.KVHeads)
	norm := func(hs [][][]float32, gamma []float32) {
		if gamma == nil {
			return
		}
		col := make([]float32, d)
		for _, h := range hs {
			for s := range seq {
				for i := range d {
					col[i] = h[i][s]
				}
				inv := p.rmsInv(col, r.eps)
				for i := range d {
					h[i][s] = fp16(fp16(h[i][s]*inv) * gamma[i])
				}
			}
		}
	}
	norm(qs, r.qg)
	norm(ks, r.kg)
	rotate := func(hs [][][]float32) {
		if r.cos == nil {
			return
		}
		for _, h := range hs {
			rot := make([][]float32, d)
			for i := range d / 2 {
				rot[i] = make([]float32, seq)
				for s := range seq {
					rot[i][s] = -h[i+d/2][s]
				}
				rot[i+d/2] = h[i]
			}
			out := make([][]float32, d)
			for i := range d {
				out[i] = make([]float32, seq)
				for s := range seq {
					c := fp16(h[i][s] * r.cos[i*seq+s])
					n := fp16(rot[i][s] * r.sin[i*seq+s])
					out[i][s] = fp16(c + n)
				}
			}
			copy(h, out)
		}
	}
	rotate(qs)
	rotate(ks)
	group := a.Heads / a.KVHeads
	out := make([]float32, a.Heads*d*seq)
	// Keys position-major, so a score is one contiguous dot product.
	keys := make([][][]float32, a.KVHeads)
	for kh := range keys {
		keys[kh] = make([][]float32, seq)
		for s := range seq {
			keys[kh][s] = make([]float32, d)
			for i := range d {
				keys[kh][s][i] = ks[kh][i][s]
			}
		}
	}
	// Heads are independent: each writes only its own rows of out.
	parallel(a.Heads, func(hh int) {
		qh, kh, vh := qs[hh], keys[hh/group], vs[hh/group]
		scores := make([]float64, seq)
		q := make([]float64, d)
		for t := range seq { // the query position
			for i := range d {
				q[i] = float64(fp16(float32(float64(qh[i][t]) * r.scale)))
			}
			maxScore := math.Inf(-1)
			for s := range seq { // the key position
				var dot float64
				for i, k := range kh[s] {
					dot += q[i] * float64(k)
				}
				x := fp16(fp16(float32(dot)) + mask[s])
				if a.Causal && s > t || a.Window > 0 && abs(s-t) > a.Window/2 {
					x = fp16(x + MaskNegative)
				}
				scores[s] = float64(x)
				maxScore = max(maxScore, scores[s])
			}
			var sum float64
			for s := range seq {
				scores[s] = math.Exp(scores[s] - maxScore)
				sum += scores[s]
			}
			for s := range seq {
				scores[s] = float64(fp16(float32(scores[s] / sum)))
			}
			for i := range d {
				var acc float64
				for s, v := range vh[i] {
					acc += float64(v) * scores[s]
				}
				out[(hh*d+i)*seq+t] = fp16(float32(acc))
			}
		}
	})
	return out
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
