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

// bandRadix splits a position into two fp16 digits, p = hi*bandRadix + lo, both small enough
// to be exact in fp16 (which holds every integer only up to 2048). See band.
const bandRadix = 64

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
		g.reserve("mask")
	}
	g.masked = true
	return Value{name: "mask", channels: 1}
}

// Attention is softmax(q kᵀ / sqrt(HeadDim) + masks) v over heads, from the projected q, k and
// v ([1, Heads*HeadDim, 1, Seq] and [1, KVHeads*HeadDim, 1, Seq]), as one composed operation
// in the form maderix/h3.c-ane h3_ane_block.m and maderix/ANE training/stories_mil.h run on
// the device: heads reshaped to [1, h, d, S] and transposed to [1, h, S, d]; the optional
// per-head norms and rotary embedding over the last axis; scores by matmul with transpose_y,
// scaled, plus the key mask [1, 1, 1, S] and the structural mask [1, 1, S, S]; softmax over
// the keys; the values by matmul; transposed and reshaped back.
func (g *Graph) Attention(name string, q, k, v, mask Value, a Attention) Value {
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
	b := g.block()
	n := func(suffix string) string { return name + "_" + suffix }
	heads4 := t4(1, h, seq, d)

	// Grouped-query attention: each key/value head is repeated for its group of query heads
	// while the tensors are still [1, C, 1, S], by slicing the heads and concatenating the
	// copies. (Flattening a head to [1, kvh, 1, d*S] to tile it would exceed the device's
	// 16384 per dimension from S = 256 at d = 128.)
	kin, vin := k.name, v.name
	if group := h / kvh; group > 1 {
		kin = b.repeatHeads(n("krep"), k.name, kvh, group, d, seq)
		vin = b.repeatHeads(n("vrep"), v.name, kvh, group, d, seq)
	}

	hshape := b.ints(n("hshape"), 1, h, d, seq)
	perm := b.ints(n("perm"), 0, 1, 3, 2)
	heads := func(which, src string) string {
		r := b.op(t4(1, h, d, seq), n(which+"4"), fmt.Sprintf("reshape(shape = %s, x = %s)", hshape, src))
		return b.op(heads4, n(which+"t"), fmt.Sprintf("transpose(perm = %s, x = %s)", perm, r))
	}
	qn, kn, vn := heads("q", q.name), heads("k", kin), heads("v", vin)

	// The per-head norms, over each head's dimensions (the last axis), as h3.c-ane's
	// emit_head_norm_rope, scaled by each row's largest magnitude first as the channel norms
	// are (scaledNorm): a query or key head's squares overflow fp16 as a residual's do.
	var qg, kg stored
	if a.QNorm != nil || a.KNorm != nil {
		norm := func(which, src string, gamma []float32) (string, stored) {
			if gamma == nil {
				return src, stored{}
			}
			gname, gw := b.weight(n(which+"norm_gamma"), [4]int{1, 1, 1, d}, gamma)
			z, inv := b.scaledNorm(n(which+"norm"), src, heads4, t4(1, h, seq, 1), 3, a.NormEps)
			n0 := b.op(heads4, n(which+"n0"), fmt.Sprintf("mul(x = %s, y = %s)", z, inv))
			return b.op(heads4, n(which+"n"), fmt.Sprintf("mul(x = %s, y = %s)", n0, gname)), gw
		}
		qn, qg = norm("q", qn, a.QNorm)
		kn, kg = norm("k", kn, a.KNorm)
	}

	// The rotary embedding: x cos + rotate_half(x) sin, with cos and sin as [1, 1, S, d]
	// constants shared by every head.
	var cos, sin stored
	if a.RoPETheta > 0 {
		c, s := rope(a.RoPETheta, d, seq)
		var cname, sname string
		cname, cos = b.weight(n("cos"), [4]int{1, 1, seq, d}, c)
		sname, sin = b.weight(n("sin"), [4]int{1, 1, seq, d}, s)
		minus := b.scalar(n("minus"), -1)
		axis := b.int32(n("ropeaxis"), 3)
		interleave := b.boolean(n("interleave"), false)
		lo := b.ints(n("lobegin"), 0, 0, 0, 0)
		hi := b.ints(n("hibegin"), 0, 0, 0, d/2)
		size := b.ints(n("halfsize"), 1, h, seq, d/2)
		halves := t4(1, h, seq, d/2)
		rot := func(which, src string) string {
			l := b.op(halves, n(which+"lo"), fmt.Sprintf("slice_by_size(begin = %s, size = %s, x = %s)", lo, size, src))
			u := b.op(halves, n(which+"hi"), fmt.Sprintf("slice_by_size(begin = %s, size = %s, x = %s)", hi, size, src))
			neg := b.op(halves, n(which+"hineg"), fmt.Sprintf("mul(x = %s, y = %s)", u, minus))
			half := b.op(heads4, n(which+"half"), fmt.Sprintf("concat(axis = %s, interleave = %s, values = (%s, %s))", axis, interleave, neg, l))
			c := b.op(heads4, n(which+"c"), fmt.Sprintf("mul(x = %s, y = %s)", src, cname))
			s := b.op(heads4, n(which+"s"), fmt.Sprintf("mul(x = %s, y = %s)", half, sname))
			return b.op(heads4, n(which+"r"), fmt.Sprintf("add(x = %s, y = %s)", c, s))
		}
		qn, kn = rot("q", qn), rot("k", kn)
	}

	// Scores [1, h, rows (queries), S (keys)], scaled, plus the key mask and the structural
	// mask, softmax over the keys, times the values: for all queries at once when the scores
	// fit the working set, else for tiles of query rows, concatenated back (h3.c-ane
	// h3_ane_block.m tiles 512 query rows; tileRows picks the tile).
	scale := fp16(float32(1 / math.Sqrt(float64(d))))
	yes := b.boolean(n("true"), true)
	no := b.boolean(n("false"), false)
	sc := b.scalar(n("scale"), scale)
	var smax string
	var keys bandKeys
	b.work = append(b.work, matmulWork{Matmul: Matmul{M: seq, N: seq, K: d, Count: h, TransB: true}},
		matmulWork{Matmul: Matmul{M: seq, N: d, K: seq, Count: h}})
	rows := tileRows(h, seq)
	// attend is attention for the queries q4 ([1, h, r, d], rows r0..r0+r-1); sfx names the
	// tile's operations ("" when there is one tile, so an untiled program is as before).
	attend := func(q4 string, r0, r int, sfx string) string {
		scores4 := t4(1, h, r, seq)
		scores := b.op(scores4, n("scores"+sfx), fmt.Sprintf("matmul(transpose_x = %s, transpose_y = %s, x = %s, y = %s)", no, yes, q4, kn))
		scaled := b.op(scores4, n("scaled"+sfx), fmt.Sprintf("mul(x = %s, y = %s)", scores, sc))
		logits := b.op(scores4, n("masked"+sfx), fmt.Sprintf("add(x = %s, y = %s)", scaled, mask.name))
		if a.Causal || a.Window > 0 {
			band := b.band(n("band"+sfx), &keys, seq, r0, r, a.Causal, a.Window)
			logits = b.op(scores4, n("banded"+sfx), fmt.Sprintf("add(x = %s, y = %s)", logits, band))
		}
		if smax == "" {
			smax = b.int32(n("softmaxaxis"), -1)
		}
		probs := b.op(scores4, n("probs"+sfx), fmt.Sprintf("softmax(axis = %s, x = %s)", smax, logits))
		return b.op(t4(1, h, r, d), n("heads"+sfx), fmt.Sprintf("matmul(transpose_x = %s, transpose_y = %s, x = %s, y = %s)", no, no, probs, vn))
	}
	var att string
	if rows >= seq {
		att = attend(qn, 0, seq, "")
	} else {
		var parts []string
		for r0 := 0; r0 < seq; r0 += rows {
			r := min(rows, seq-r0)
			sfx := fmt.Sprintf("_tile%d", r0/rows)
			begin := b.ints(n("qbegin"+sfx), 0, 0, r0, 0)
			size := b.ints(n("qsize"+sfx), 1, h, r, d)
			q4 := b.op(t4(1, h, r, d), n("q"+sfx), fmt.Sprintf("slice_by_size(begin = %s, size = %s, x = %s)", begin, size, qn))
			parts = append(parts, attend(q4, r0, r, sfx))
		}
		axis := b.int32(n("tileaxis"), 2)
		interleave := b.boolean(n("tileinterleave"), false)
		att = b.op(heads4, n("heads"), fmt.Sprintf("concat(axis = %s, interleave = %s, values = (%s))", axis, interleave, strings.Join(parts, ", ")))
	}
	back := b.op(t4(1, h, d, seq), n("headst"), fmt.Sprintf("transpose(perm = %s, x = %s)", perm, att))
	oshape := b.ints(n("outshape"), 1, h*d, 1, seq)
	b.op(g.tensor(h*d), name, fmt.Sprintf("reshape(shape = %s, x = %s)", oshape, back))

	ref := attentionRef{a: a, seq: seq, qg: qg, kg: kg, cos: cos, sin: sin, scale: scale, eps: a.NormEps}
	return g.add(b, out, func(env map[string][]float32, p precision) []float32 {
		return ref.eval(env[q.name], env[k.name], env[v.name], env[mask.name], p)
	})
}

// maxTileRows is the most query rows one tile takes (maderix/h3.c-ane h3_ane_block.m
// BLK_ATTN_TILE = 512).
const maxTileRows = 512

// tileRows is how many query rows attention over seq positions with h heads computes at once:
// every query when the scores [1, h, S, S] and the structural mask fit MaxWorkingSet, else the
// largest power of two up to maxTileRows whose scores [1, h, rows, S] do (at least 1).
func tileRows(h, seq int) int {
	if h*seq*seq*2 <= MaxWorkingSet {
		return seq
	}
	rows := maxTileRows
	for rows > 1 && h*rows*seq*2 > MaxWorkingSet {
		rows /= 2
	}
	return rows
}

// repeatHeads repeats each of src's kvh heads (d channels each) group times, in order:
// [k0 k0 k1 k1 ...] for a group of two.
func (b *block) repeatHeads(prefix, src string, kvh, group, d, seq int) string {
	size := b.ints(prefix+"_size", 1, d, 1, seq)
	var parts []string
	for j := range kvh {
		begin := b.ints(fmt.Sprintf("%s_begin%d", prefix, j), 0, j*d, 0, 0)
		head := b.op(t4(1, d, 1, seq), fmt.Sprintf("%s_head%d", prefix, j), fmt.Sprintf("slice_by_size(begin = %s, size = %s, x = %s)", begin, size, src))
		for range group {
			parts = append(parts, head)
		}
	}
	axis := b.int32(prefix+"_axis", 1)
	interleave := b.boolean(prefix+"_interleave", false)
	return b.op(t4(1, kvh*group*d, 1, seq), prefix, fmt.Sprintf("concat(axis = %s, interleave = %s, values = (%s))", axis, interleave, strings.Join(parts, ", ")))
}

// band is the structural mask of query rows r0..r0+rows-1, [1, 1, rows, S]: MaskNegative
// where query t may not see key s
// (s > t when causal; |s - t| > window/2 for a local window), 0 elsewhere. No reference shows
// integer arithmetic compiling for the device (jafreck/ironmill ane-op-support-matrix.md:
// "only on fp16/fp32 - integer arithmetic rejected"), and an S x S constant would be 128 MiB
// at S = 8192, so the mask is computed in fp16 from position ramps and chosen with select
// (greater and select are verified there). fp16 holds every integer only up to 2048, so each
// position is two exact digits base 64 and the distance is (khi - qhi)*64 + (klo - qlo): every
// distance under 2048 in magnitude comes out exact and a larger one keeps its sign and stays
// beyond 2048, so comparing it with 0 or with a window under 2048 is exact at any S.
func (b *block) band(prefix string, keys *bandKeys, seq, r0, rows int, causal bool, window int) string {
	hi, lo := make([]float32, seq), make([]float32, seq)
	for p := range seq {
		hi[p], lo[p] = float32(p/bandRadix), float32(p%bandRadix)
	}
	qhi, _ := b.weight(prefix+"_qhi", [4]int{1, 1, rows, 1}, hi[r0:r0+rows])
	qlo, _ := b.weight(prefix+"_qlo", [4]int{1, 1, rows, 1}, lo[r0:r0+rows])
	if keys.hi == "" { // the key ramps are the same for every tile: declared once
		keys.hi, _ = b.weight(prefix+"_khi", [4]int{1, 1, 1, seq}, hi)
		keys.lo, _ = b.weight(prefix+"_klo", [4]int{1, 1, 1, seq}, lo)
	}
	khi, klo := keys.hi, keys.lo
	reps := b.ints(prefix+"_reps", 1, 1, rows, 1)
	radix := b.scalar(prefix+"_radix", bandRadix)
	square := t4(1, 1, rows, seq)
	// Tiling the key ramps makes every subtraction broadcast one side only, as the
	// references' masks do.
	khit := b.op(square, prefix+"_khit", fmt.Sprintf("tile(reps = %s, x = %s)", reps, khi))
	klot := b.op(square, prefix+"_klot", fmt.Sprintf("tile(reps = %s, x = %s)", reps, klo))
	dhi := b.op(square, prefix+"_dhi", fmt.Sprintf("sub(x = %s, y = %s)", khit, qhi))
	dlo := b.op(square, prefix+"_dlo", fmt.Sprintf("sub(x = %s, y = %s)", klot, qlo))
	dhis := b.op(square, prefix+"_dhis", fmt.Sprintf("mul(x = %s, y = %s)", dhi, radix))
	dist := b.op(square, prefix+"_dist", fmt.Sprintf("add(x = %s, y = %s)", dhis, dlo))
	boolSquare := tensorType("bool", 1, 1, rows, seq)
	var far string
	if causal {
		zero := b.scalar(prefix+"_zero", 0)
		far = b.op(boolSquare, prefix+"_far", fmt.Sprintf("greater(x = %s, y = %s)", dist, zero))
	} else {
		halfw := b.scalar(prefix+"_halfwindow", float32(window/2))
		adist := b.op(square, prefix+"_adist", fmt.Sprintf("abs(x = %s)", dist))
		far = b.op(boolSquare, prefix+"_far", fmt.Sprintf("greater(x = %s, y = %s)", adist, halfw))
	}
	hidden := b.scalar(prefix+"_hidden", MaskNegative)
	visible := b.scalar(prefix+"_visible", 0)
	return b.op(square, prefix, fmt.Sprintf("select(a = %s, b = %s, cond = %s)", hidden, visible, far))
}

// bandKeys are the names of the key position ramps, once declared.
type bandKeys struct{ hi, lo string }

// bandDistance is the distance key s - query t as band computes it in fp16, step by step.
func bandDistance(t, s int) float32 {
	dhi := fp16(float32(s/bandRadix) - float32(t/bandRadix))
	dlo := fp16(float32(s%bandRadix) - float32(t%bandRadix))
	return fp16(fp16(dhi*bandRadix) + dlo)
}

// rope is the rotary embedding's cos and sin tables, [S, d] position-major (the [1, 1, S, d]
// constants): dimension i and i + d/2 rotate together at frequency theta^(-2i/d).
func rope(theta float64, d, seq int) (cos, sin []float32) {
	cos, sin = make([]float32, seq*d), make([]float32, seq*d)
	for i := range d / 2 {
		freq := math.Pow(theta, -2*float64(i)/float64(d))
		for s := range seq {
			c, n := math.Cos(float64(s)*freq), math.Sin(float64(s)*freq)
			cos[s*d+i], cos[s*d+i+d/2] = float32(c), float32(c)
			sin[s*d+i], sin[s*d+i+d/2] = float32(n), float32(n)
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
	qg, kg   stored
	cos, sin stored
	scale    float32
	eps      float32
}

func (r attentionRef) eval(q, k, v, mask []float32, p precision) []float32 {
	a, seq, d := r.a, r.seq, r.a.HeadDim
	qg, kg, cos, sin := r.qg.valuesFor(p), r.kg.valuesFor(p), r.cos.valuesFor(p), r.sin.valuesFor(p)
	// heads splits a [heads*d, seq] value into per-head [seq][d] rows: the transposed
	// [1, h, S, d] tensor.
	heads := func(x []float32, n int) [][][]float32 {
		out := make([][][]float32, n)
		for hh := range n {
			out[hh] = make([][]float32, seq)
			for s := range seq {
				row := make([]float32, d)
				for i := range d {
					row[i] = x[(hh*d+i)*seq+s]
				}
				out[hh][s] = row
			}
		}
		return out
	}
	qs, ks, vs := heads(q, a.Heads), heads(k, a.KVHeads), heads(v, a.KVHeads)
	norm := func(hs [][][]float32, gamma []float32) {
		if gamma == nil {
			return
		}
		z := make([]float32, d)
		for _, h := range hs {
			for _, row := range h {
				inv := p.scaledNormRef(row, z, r.eps)
				for i := range row {
					row[i] = p.v(p.v(z[i]*inv) * gamma[i])
				}
			}
		}
	}
	norm(qs, qg)
	norm(ks, kg)
	rotate := func(hs [][][]float32) {
		if cos == nil {
			return
		}
		rot := make([]float32, d)
		for _, h := range hs {
			for s, row := range h {
				for i := range d / 2 {
					rot[i], rot[i+d/2] = -row[i+d/2], row[i]
				}
				for i := range d {
					c := p.v(row[i] * cos[s*d+i])
					n := p.v(rot[i] * sin[s*d+i])
					row[i] = p.v(c + n)
				}
			}
		}
	}
	rotate(qs)
	rotate(ks)
	group := a.Heads / a.KVHeads
	out := make([]float32, a.Heads*d*seq)
	// Heads are independent: each writes only its own rows of out.
	parallel(a.Heads, func(hh int) {
		qh, kh, vh := qs[hh], ks[hh/group], vs[hh/group]
		scores := make([]float64, seq)
		for t := range seq { // the query position
			maxScore := math.Inf(-1)
			for s := range seq { // the key position
				var dot float64
				for i, kv := range kh[s] {
					dot += float64(qh[t][i]) * float64(kv)
				}
				x := p.v(p.v(p.v(float32(dot))*r.scale) + mask[s])
				if a.Causal && s > t || a.Window > 0 && abs(s-t) > a.Window/2 {
					x = p.v(x + MaskNegative)
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
				scores[s] = float64(p.v(float32(scores[s] / sum)))
			}
			for i := range d {
				var acc float64
				for s, row := range vh {
					acc += float64(row[i]) * scores[s]
				}
				out[(hh*d+i)*seq+t] = p.v(float32(acc))
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
