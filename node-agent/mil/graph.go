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
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/x448/float16"
)

// buildInfo is the attribute block that follows the version line in every program the public
// references compile in memory (maderix/ANE training/stories_mil.h MIL_HDR, maderix/h3.c-ane
// h3_ane_block.m, jundot/omlx qwen35_ane.mm); jafreck/ironmill
// crates/ironmill-core/src/ane/mil_text.rs calls it required. The values are theirs.
const buildInfo = `[buildInfo = dict<string, string>({{"coremlc-component-MIL", "3510.2.1"}, {"coremlc-version", "3505.4.1"}, {"coremltools-component-milinternal", ""}, {"coremltools-version", "9.0"}})]`

// Value is a tensor of the graph: [1, Channels, 1, Seq], fp16, channel-major.
type Value struct {
	name     string
	channels int
}

// Channels is the value's channel count.
func (v Value) Channels() int { return v.channels }

// op is one operation: its MIL lines (constants first, in the order they were made) and its
// CPU evaluation over float32 values that are rounded to fp16 after every MIL operation, as
// the device holds them. A composed operation rounds each of its MIL steps in turn (a norm's
// square overflows as the device's does); a single MIL operation with inner sums (a matmul, a
// reduction, softmax) accumulates wider and rounds its result.
type op struct {
	lines []string
	out   Value
	eval  func(env map[string][]float32, p precision) []float32
	work  []matmulWork
}

// Matmul is one matrix product a program computes: C[M×N] = A[M×K]·B[K×N] (B stored N×K when
// TransB), Count times (once per head). A holds a projection's weights, row-major, as fp16
// holds them; it is nil for a product of two activations.
type Matmul struct {
	M, N, K, Count int
	TransB         bool
	A              []float32
}

type matmulWork struct {
	Matmul
	weights stored
}

// Matmuls is the program's matrix work, which is nearly all of its arithmetic: what the CPU
// side of the placement probe runs through a BLAS.
func (g *Graph) Matmuls() []Matmul {
	var out []Matmul
	for _, o := range g.ops {
		for _, w := range o.work {
			m := w.Matmul
			m.A = w.weights.values()
			out = append(out, m)
		}
	}
	return out
}

// Graph builds one per-layer program and, from the same description, its CPU reference: the
// parity oracle and the CPU side of the placement probe evaluate exactly what is compiled.
type Graph struct {
	in   Value
	seq  int
	ops  []op
	blob *Blob
	used map[string]bool
	// masked: the program takes the key mask as its second input.
	masked bool
	err    error
	// original: the constants also keep the values they were given, for EvalOriginal.
	original bool
}

// NewGraph starts a graph whose input x has channels channels over seq positions.
func NewGraph(channels, seq int) (*Graph, Value) {
	g := &Graph{seq: seq, blob: NewBlob(), used: map[string]bool{"x": true}}
	g.in = Value{name: "x", channels: channels}
	switch {
	case channels <= 0 || seq <= 0:
		g.err = fmt.Errorf("a graph needs positive sizes, got %d channels over %d positions", channels, seq)
	case seq%64 != 0:
		g.err = fmt.Errorf("the sequence length %d is not a multiple of 64, as Neural Engine tensors need", seq)
	}
	return g, g.in
}

// NewOriginalGraph is NewGraph for the conversion's parity gate: the program it emits is the
// same, and EvalOriginal evaluates it with its constants as they were given (the checkpoint's
// own precision) and every activation in float32, so that what casting the weights to fp16
// costs is measured rather than assumed away.
func NewOriginalGraph(channels, seq int) (*Graph, Value) {
	g, x := NewGraph(channels, seq)
	g.original = true
	return g, x
}

func (g *Graph) fail(format string, args ...any) {
	if g.err == nil {
		g.err = fmt.Errorf(format, args...)
	}
}

// plainName is what a variable may be called.
var plainName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reserve claims a variable name. Every name a program declares, a composed operation's
// inner steps included, is claimed here, so two operations can never declare the same
// variable: the device's compiler rejects a program that does (jafreck/ironmill
// docs/design/ane/ane-constraints.md, "duplicate variable names").
func (g *Graph) reserve(n string) string {
	if !plainName.MatchString(n) || g.used[n] {
		g.fail("variable name %q is not plain or is declared twice", n)
	}
	g.used[n] = true
	return n
}

// block collects one operation's MIL statements and matrix work.
type block struct {
	g     *Graph
	lines []string
	work  []matmulWork
}

func (g *Graph) block() *block { return &block{g: g} }

// op declares name as the result of call, of type typ.
func (b *block) op(typ, name, call string) string {
	b.g.reserve(name)
	b.lines = append(b.lines, fmt.Sprintf(`%s %s = %s[name = string("%s")];`, typ, name, call, name))
	return name
}

func (b *block) konst(typ, name, val string) string {
	b.g.reserve(name)
	b.lines = append(b.lines, fmt.Sprintf(`%s %s = const()[name = string("%s"), val = %s];`, typ, name, name, val))
	return name
}

// ints declares a constant int32 vector (shapes, axes, permutations: parameters, never data).
func (b *block) ints(name string, vals ...int) string {
	typ := fmt.Sprintf("tensor<int32, [%d]>", len(vals))
	return b.konst(typ, name, typ+"(["+joinInts(vals)+"])")
}

func (b *block) int32(name string, v int) string {
	return b.konst("int32", name, fmt.Sprintf("int32(%d)", v))
}

func (b *block) boolean(name string, v bool) string {
	return b.konst("bool", name, fmt.Sprintf("bool(%t)", v))
}

func (b *block) str(name, v string) string {
	return b.konst("string", name, fmt.Sprintf(`string("%s")`, v))
}

// scalar declares an fp16 constant, written as the device will hold it.
func (b *block) scalar(name string, v float32) string {
	return b.konst("fp16", name, "fp16("+fp16Literal(v)+")")
}

// weight declares an fp16 constant of the given shape from the blob and returns its name and
// where the CPU reference reads its values back, as the device holds them.
func (b *block) weight(name string, shape [4]int, values []float32) (string, stored) {
	if n := shape[0] * shape[1] * shape[2] * shape[3]; n != len(values) {
		b.g.fail("%s: %d values for a %v constant", name, len(values), shape)
	}
	off := b.g.blob.AddFP16(values)
	typ := tensorType("fp16", shape[:]...)
	b.konst(typ, name, fmt.Sprintf(`%s(BLOBFILE(path = string("%s"), offset = uint64(%d)))`, typ, BlobPath, off))
	st := stored{blob: b.g.blob, at: off, n: len(values)}
	if b.g.original {
		st.orig = values
	}
	return name, st
}

// stored is a constant in the blob. The CPU reference reads it back when it evaluates rather
// than keeping a float32 copy: a program holds its weights once, in fp16.
type stored struct {
	blob *Blob
	at   uint64
	n    int
	orig []float32 // the values as given, in an original graph
}

// values is the constant as fp16 holds it (nil for no constant).
func (s stored) values() []float32 {
	if s.blob == nil {
		return nil
	}
	return s.blob.FP16(s.at, s.n)
}

// valuesFor is the constant as evaluation p reads it: as given for EvalOriginal, else as
// fp16 holds it.
func (s stored) valuesFor(p precision) []float32 {
	if p.original {
		return s.orig
	}
	return s.values()
}

func tensorType(dtype string, dims ...int) string {
	return fmt.Sprintf("tensor<%s, [%s]>", dtype, joinInts(dims))
}

// t4 is an fp16 tensor type.
func t4(dims ...int) string { return tensorType("fp16", dims...) }

func joinInts(vals []int) string {
	s := make([]string, len(vals))
	for i, v := range vals {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

func (g *Graph) tensor(c int) string { return t4(1, c, 1, g.seq) }

func (g *Graph) add(b *block, out Value, eval func(env map[string][]float32, p precision) []float32) Value {
	g.ops = append(g.ops, op{lines: b.lines, out: out, eval: eval, work: b.work})
	return out
}

// Linear is y = W x (W has out rows of x.Channels values) as a 1x1 convolution, in the form
// every reference uses for a projection (maderix/ANE training/stories_mil.h CONV_CONST,
// jundot/omlx qwen35_ane.mm fp16_linear_mil).
func (g *Graph) Linear(name string, x Value, out int, weights []float32) Value {
	if len(weights) != out*x.channels {
		g.fail("%s: %d weights for a %dx%d layer", name, len(weights), out, x.channels)
		return Value{name: name, channels: out}
	}
	b := g.block()
	pad := b.str(name+"_pad_type", "valid")
	strides := b.ints(name+"_strides", 1, 1)
	pads := b.ints(name+"_pad", 0, 0, 0, 0)
	dil := b.ints(name+"_dilations", 1, 1)
	groups := b.int32(name+"_groups", 1)
	wname, wref := b.weight(name+"_weight", [4]int{out, x.channels, 1, 1}, weights)
	b.op(g.tensor(out), name, fmt.Sprintf("conv(dilations = %s, groups = %s, pad = %s, pad_type = %s, strides = %s, weight = %s, x = %s)",
		dil, groups, pads, pad, strides, wname, x.name))
	in, seq := x.channels, g.seq
	b.work = append(b.work, matmulWork{Matmul: Matmul{M: out, N: seq, K: in, Count: 1}, weights: wref})
	return g.add(b, Value{name: name, channels: out}, func(env map[string][]float32, p precision) []float32 {
		xs, y, w := env[x.name], make([]float32, out*seq), wref.valuesFor(p)
		// Each output channel accumulates over the inputs in a fixed order (so the result
		// does not depend on how the rows are shared out), a whole row of positions at a time.
		parallel(out, func(o int) {
			row, wo := y[o*seq:(o+1)*seq], w[o*in:(o+1)*in]
			c := 0
			// Four inputs at a time: a quarter of the passes over the row.
			for ; c+4 <= in; c += 4 {
				w0, w1, w2, w3 := wo[c], wo[c+1], wo[c+2], wo[c+3]
				x0, x1, x2, x3 := xs[c*seq:(c+1)*seq], xs[(c+1)*seq:(c+2)*seq], xs[(c+2)*seq:(c+3)*seq], xs[(c+3)*seq:(c+4)*seq]
				for s := range row {
					row[s] += w0*x0[s] + w1*x1[s] + w2*x2[s] + w3*x3[s]
				}
			}
			for ; c < in; c++ {
				wc, xc := wo[c], xs[c*seq:(c+1)*seq]
				for s := range row {
					row[s] += wc * xc[s]
				}
			}
		})
		return p.s(y)
	})
}

// Add is a + b, element by element.
func (g *Graph) Add(name string, a, b Value) Value {
	return g.binary(name, "add", a, b, func(x, y float32) float32 { return x + y })
}

// Mul is a * b, element by element.
func (g *Graph) Mul(name string, a, b Value) Value {
	return g.binary(name, "mul", a, b, func(x, y float32) float32 { return x * y })
}

func (g *Graph) binary(name, kind string, a, c Value, f func(x, y float32) float32) Value {
	if a.channels != c.channels {
		g.fail("%s: %s of %d and %d channels", name, kind, a.channels, c.channels)
	}
	b := g.block()
	b.op(g.tensor(a.channels), name, fmt.Sprintf("%s(x = %s, y = %s)", kind, a.name, c.name))
	return g.add(b, Value{name: name, channels: a.channels}, func(env map[string][]float32, p precision) []float32 {
		xs, ys := env[a.name], env[c.name]
		out := make([]float32, len(xs))
		for i := range xs {
			out[i] = f(xs[i], ys[i])
		}
		return p.s(out)
	})
}

// GELUExact is GELU with the error function (ModernBERT's activation): 0.5 x (1 + erf(x/√2)).
// No reference shows the gelu operation itself running on the device; jafreck/ironmill
// docs/design/ane/ane-op-support-matrix.md verifies erf on it ("enables on-ANE GELU without
// tanh decomposition"), so GELU is composed from erf, mul and add.
func (g *Graph) GELUExact(name string, x Value) Value {
	b := g.block()
	tensor := g.tensor(x.channels)
	invSqrt2, half, one := fp16(float32(1/math.Sqrt2)), float32(0.5), float32(1)
	is2 := b.scalar(name+"_invsqrt2", invSqrt2)
	h := b.scalar(name+"_half", half)
	o := b.scalar(name+"_one", one)
	scaled := b.op(tensor, name+"_scaled", fmt.Sprintf("mul(x = %s, y = %s)", x.name, is2))
	erf := b.op(tensor, name+"_erf", fmt.Sprintf("erf(x = %s)", scaled))
	erf1 := b.op(tensor, name+"_erf1", fmt.Sprintf("add(x = %s, y = %s)", erf, o))
	hx := b.op(tensor, name+"_halfx", fmt.Sprintf("mul(x = %s, y = %s)", x.name, h))
	b.op(tensor, name, fmt.Sprintf("mul(x = %s, y = %s)", hx, erf1))
	return g.add(b, Value{name: name, channels: x.channels}, func(env map[string][]float32, p precision) []float32 {
		xs := env[x.name]
		out := make([]float32, len(xs))
		for i, v := range xs {
			e := p.v(float32(math.Erf(float64(p.v(v * invSqrt2)))))
			out[i] = p.v(p.v(v*half) * p.v(e+one))
		}
		return out
	})
}

// SiLU is x * sigmoid(x) (jafreck/ironmill ane-op-support-matrix.md: silu verified on the
// device; jundot/omlx qwen35_ane.mm fp16_swiglu_down_mil uses it).
func (g *Graph) SiLU(name string, x Value) Value {
	b := g.block()
	b.op(g.tensor(x.channels), name, fmt.Sprintf("silu(x = %s)", x.name))
	return g.add(b, Value{name: name, channels: x.channels}, func(env map[string][]float32, p precision) []float32 {
		xs := env[x.name]
		out := make([]float32, len(xs))
		for i, v := range xs {
			out[i] = float32(float64(v) / (1 + math.Exp(-float64(v))))
		}
		return p.s(out)
	})
}

// Slice keeps channels [from, to) of x, with slice_by_size as maderix/ANE
// training/stories_mil.h and maderix/h3.c-ane h3_ane_block.m slice theirs.
func (g *Graph) Slice(name string, x Value, from, to int) Value {
	if from < 0 || to > x.channels || from >= to {
		g.fail("%s: channels [%d, %d) of %d", name, from, to, x.channels)
		return Value{name: name, channels: max(to-from, 1)}
	}
	b := g.block()
	begin := b.ints(name+"_begin", 0, from, 0, 0)
	size := b.ints(name+"_size", 1, to-from, 1, g.seq)
	b.op(g.tensor(to-from), name, fmt.Sprintf("slice_by_size(begin = %s, size = %s, x = %s)", begin, size, x.name))
	seq := g.seq
	return g.add(b, Value{name: name, channels: to - from}, func(env map[string][]float32, p precision) []float32 {
		return append([]float32(nil), env[x.name][from*seq:to*seq]...)
	})
}

// norm declares a norm's shared constants: the channel axis, keep_dims, its epsilon and the
// -0.5 exponent.
// A norm squares its input, and fp16 squares overflow past 255.9 and vanish below 2^-12: the
// residual stream of a late layer grows past the first (maderix/h3.c-ane h3_ane_block.m
// pre-scales by 1/256 before squaring "for the grown late-block residuals"), and an early
// layer's is small. A fixed scale trades one end for the other, and with it the model's
// epsilon would have to scale by its square, far below what fp16 holds. So each position is
// divided by its own largest magnitude m first (reduce_max over the channels and maximum,
// both run on the device: jafreck/ironmill docs/design/ane/ane-op-support-matrix.md), which
// keeps every square in [0, 1] and their mean at least 1/C, and the model's epsilon goes in
// exactly as (sqrt(eps)/m)², since
//
//	x · (mean(x²) + eps)^-½ = z · (mean(z²) + eps/m²)^-½,  z = x/m.
//
// m is at least normFloor, so an all-zero (padded) position gives z = 0 and a finite inverse,
// never 0 · inf.
const normFloor = MinNormalFP16

// scaledNorm emits z = x/m and the inverse root of mean(z²) + eps/m² over axis of x (of type
// full; row is its type with that axis reduced), and returns their names.
func (b *block) scaledNorm(name, x, full, row string, axis int, eps float32) (z, inv string) {
	axes, keep := b.ints(name+"_axes", axis), b.boolean(name+"_keep", true)
	floor, minus1 := b.scalar(name+"_floor", normFloor), b.scalar(name+"_minus1", -1)
	rootEps, nhalf := b.scalar(name+"_rooteps", rootEpsilon(eps)), b.scalar(name+"_nhalf", -0.5)
	a := b.op(full, name+"_abs", fmt.Sprintf("abs(x = %s)", x))
	m := b.op(row, name+"_max", fmt.Sprintf("reduce_max(axes = %s, keep_dims = %s, x = %s)", axes, keep, a))
	mf := b.op(row, name+"_maxfloor", fmt.Sprintf("maximum(x = %s, y = %s)", m, floor))
	invm := b.op(row, name+"_invmax", fmt.Sprintf("pow(x = %s, y = %s)", mf, minus1))
	z = b.op(full, name+"_z", fmt.Sprintf("mul(x = %s, y = %s)", x, invm))
	sq := b.op(full, name+"_sq", fmt.Sprintf("mul(x = %s, y = %s)", z, z))
	mean := b.op(row, name+"_mean", fmt.Sprintf("reduce_mean(axes = %s, keep_dims = %s, x = %s)", axes, keep, sq))
	re := b.op(row, name+"_rooteps_m", fmt.Sprintf("mul(x = %s, y = %s)", invm, rootEps))
	em := b.op(row, name+"_eps_m", fmt.Sprintf("mul(x = %s, y = %s)", re, re))
	ve := b.op(row, name+"_var", fmt.Sprintf("add(x = %s, y = %s)", mean, em))
	inv = b.op(row, name+"_inv", fmt.Sprintf("pow(x = %s, y = %s)", ve, nhalf))
	return z, inv
}

// rootEpsilon is sqrt(eps) as the program holds it: normal in fp16 for every eps from 2^-28
// up, which covers the catalog's 1e-5 and 1e-6 (eps itself is an fp16 subnormal for both).
func rootEpsilon(eps float32) float32 {
	return max(fp16(float32(math.Sqrt(float64(eps)))), MinNormalFP16)
}

// scaledNormRef is scaledNorm's CPU reference for one position's values x: z (into z) and
// the inverse, each operation rounded as the device holds it.
func (p precision) scaledNormRef(x, z []float32, eps float32) float32 {
	var m float32
	for _, v := range x {
		m = max(m, float32(math.Abs(float64(v))))
	}
	invm := p.v(float32(math.Pow(float64(max(m, normFloor)), -1)))
	var sum float64
	for i, v := range x {
		z[i] = p.v(v * invm)
		sum += float64(p.v(z[i] * z[i]))
	}
	mean := p.v(float32(sum / float64(len(x))))
	re := p.v(invm * p.v(rootEpsilon(eps)))
	ve := p.v(mean + p.v(re*re))
	return p.v(float32(math.Pow(float64(ve), -0.5)))
}

// LayerNorm normalises each position over the channels: (x - mean) / sqrt(var + eps) * gamma,
// without a bias (the catalog's ModernBERT has none). It is composed from reduce_mean, sub and
// the scaled norm above over the channel axis: jafreck/ironmill verifies layer_norm on the
// device only over the last axis and without gamma (ane-op-support-matrix.md), while
// reduce_mean over axis 1 and pow with a scalar exponent are verified, and the RMSNorm of
// maderix/ANE training/stories_mil.h is built the same way.
func (g *Graph) LayerNorm(name string, x Value, gamma []float32, eps float32) Value {
	c := x.channels
	if len(gamma) != c {
		g.fail("%s: gamma must have %d values", name, c)
		return Value{name: name, channels: c}
	}
	b := g.block()
	gname, gref := b.weight(name+"_gamma", [4]int{1, c, 1, 1}, gamma)
	full, row := g.tensor(c), g.tensor(1)
	caxes, ckeep := b.ints(name+"_caxes", 1), b.boolean(name+"_ckeep", true)
	mean := b.op(row, name+"_cmean", fmt.Sprintf("reduce_mean(axes = %s, keep_dims = %s, x = %s)", caxes, ckeep, x.name))
	centered := b.op(full, name+"_centered", fmt.Sprintf("sub(x = %s, y = %s)", x.name, mean))
	z, inv := b.scaledNorm(name, centered, full, row, 1, eps)
	normed := b.op(full, name+"_norm", fmt.Sprintf("mul(x = %s, y = %s)", z, inv))
	b.op(full, name, fmt.Sprintf("mul(x = %s, y = %s)", normed, gname))
	seq := g.seq
	return g.add(b, Value{name: name, channels: c}, func(env map[string][]float32, p precision) []float32 {
		xs, out, gw := env[x.name], make([]float32, c*seq), gref.valuesFor(p)
		d, z := make([]float32, c), make([]float32, c)
		for s := range seq {
			var sum float64
			for i := range c {
				sum += float64(xs[i*seq+s])
			}
			m := p.v(float32(sum / float64(c)))
			for i := range c {
				d[i] = p.v(xs[i*seq+s] - m)
			}
			inv := p.scaledNormRef(d, z, eps)
			for i := range c {
				out[i*seq+s] = p.v(p.v(z[i]*inv) * gw[i])
			}
		}
		return out
	})
}

// RMSNorm normalises each position by its root mean square over the channels, times gamma:
// x * pow(mean(x²) + eps, -0.5) * gamma, the form of maderix/ANE training/stories_mil.h,
// maderix/h3.c-ane h3_ane_block.m emit_rms_norm and jafreck/ironmill's verified RMSNorm
// pattern, over x scaled by its largest magnitude (scaledNorm). Not rsqrt: without an epsilon
// argument the compiler is reported to reject it silently (jafreck/ironmill
// ane-op-support-matrix.md, "The epsilon discovery").
func (g *Graph) RMSNorm(name string, x Value, gamma []float32, eps float32) Value {
	c := x.channels
	if len(gamma) != c {
		g.fail("%s: gamma must have %d values", name, c)
		return Value{name: name, channels: c}
	}
	b := g.block()
	gname, gref := b.weight(name+"_gamma", [4]int{1, c, 1, 1}, gamma)
	full := g.tensor(c)
	z, inv := b.scaledNorm(name, x.name, full, g.tensor(1), 1, eps)
	normed := b.op(full, name+"_norm", fmt.Sprintf("mul(x = %s, y = %s)", z, inv))
	b.op(full, name, fmt.Sprintf("mul(x = %s, y = %s)", normed, gname))
	seq := g.seq
	return g.add(b, Value{name: name, channels: c}, func(env map[string][]float32, p precision) []float32 {
		xs, out, gw := env[x.name], make([]float32, c*seq), gref.valuesFor(p)
		col, z := make([]float32, c), make([]float32, c)
		for s := range seq {
			for i := range c {
				col[i] = xs[i*seq+s]
			}
			inv := p.scaledNormRef(col, z, eps)
			for i := range c {
				out[i*seq+s] = p.v(p.v(z[i]*inv) * gw[i])
			}
		}
		return out
	})
}

// AddMask adds the key mask to every channel of x: the simplest program of two inputs, which
// the ladder runs to check that a request binds two inputs before any attention depends on it.
func (g *Graph) AddMask(name string, x, mask Value) Value {
	if mask.name != "mask" {
		g.fail("%s: the key mask must be the graph's mask input", name)
	}
	b := g.block()
	b.op(g.tensor(x.channels), name, fmt.Sprintf("add(x = %s, y = %s)", x.name, mask.name))
	seq := g.seq
	return g.add(b, Value{name: name, channels: x.channels}, func(env map[string][]float32, p precision) []float32 {
		xs, m, out := env[x.name], env[mask.name], make([]float32, len(env[x.name]))
		for i, v := range xs {
			out[i] = v + m[i%seq]
		}
		return p.s(out)
	})
}

// Scale multiplies x by the constant s.
func (g *Graph) Scale(name string, x Value, s float32) Value {
	b := g.block()
	k := b.scalar(name+"_by", s)
	b.op(g.tensor(x.channels), name, fmt.Sprintf("mul(x = %s, y = %s)", x.name, k))
	sv := fp16(s)
	return g.add(b, Value{name: name, channels: x.channels}, func(env map[string][]float32, p precision) []float32 {
		xs, out := env[x.name], make([]float32, len(env[x.name]))
		for i, v := range xs {
			out[i] = v * sv
		}
		return p.s(out)
	})
}

// Program emits the graph's program, returning out. Every program passes Validate before it
// is returned, so nothing the device is known to refuse is ever written or compiled.
func (g *Graph) Program(out Value) (Program, error) {
	if g.err != nil {
		return Program{}, g.err
	}
	p := Program{Inputs: []Port{{Name: g.in.name, Channels: g.in.channels, Seq: g.seq}}, Output: Port{Name: out.name, Channels: out.channels, Seq: g.seq}}
	if g.masked {
		p.Inputs = append(p.Inputs, Port{Name: "mask", Channels: 1, Seq: g.seq})
	}
	// The device binds a program's inputs in the order of their names (jafreck/ironmill
	// crates/ironmill-compile/src/ane/passes/ane_variable_naming.rs), so they are declared
	// in that order; the binding matches them by name all the same.
	slices.SortFunc(p.Inputs, func(a, b Port) int { return strings.Compare(a.Name, b.Name) })
	params := make([]string, len(p.Inputs))
	for i, in := range p.Inputs {
		params[i] = t4(1, in.Channels, 1, in.Seq) + " " + in.Name
	}
	var b strings.Builder
	b.WriteString("program(1.3)\n" + buildInfo + "\n{\n")
	fmt.Fprintf(&b, "    func main<ios18>(%s) {\n", strings.Join(params, ", "))
	for _, o := range g.ops {
		for _, l := range o.lines {
			b.WriteString("        " + l + "\n")
		}
	}
	fmt.Fprintf(&b, "    } -> (%s);\n}\n", out.name)
	p.Text, p.Weights = b.String(), g.blob.Bytes()
	if err := Validate(p); err != nil {
		return Program{}, fmt.Errorf("the emitted program would not run on the Neural Engine: %w", err)
	}
	return p, nil
}

// Eval is the CPU reference: the graph evaluated on x ([Channels * Seq], channel-major), in
// float32 with every value rounded to fp16, as the device holds it.
func (g *Graph) Eval(x []float32, out Value) ([]float32, error) {
	return g.EvalMasked(x, nil, out)
}

// EvalMasked is Eval for a graph that takes the key mask ([Seq] values) too.
func (g *Graph) EvalMasked(x, mask []float32, out Value) ([]float32, error) {
	return g.eval(x, mask, out, precision{})
}

// EvalExact evaluates the same graph with its weights as stored (fp16) but every activation
// kept in float32: the conversion's parity gate compares it with the fp16 evaluation, so an
// activation that fp16 cannot hold (an overflowing square, say) fails the conversion instead
// of reaching the device.
func (g *Graph) EvalExact(x, mask []float32, out Value) ([]float32, error) {
	return g.eval(x, mask, out, precision{exact: true})
}

// EvalOriginal evaluates a graph made by NewOriginalGraph with its constants as they were given
// and every activation in float32: the checkpoint's own precision, which the parity gate
// compares the fp16 programs with.
func (g *Graph) EvalOriginal(x, mask []float32, out Value) ([]float32, error) {
	if !g.original {
		return nil, fmt.Errorf("the graph keeps only its fp16 constants: build it with NewOriginalGraph")
	}
	return g.eval(x, mask, out, precision{exact: true, original: true})
}

func (g *Graph) eval(x, mask []float32, out Value, p precision) ([]float32, error) {
	if g.err != nil {
		return nil, g.err
	}
	if len(x) != g.in.channels*g.seq {
		return nil, fmt.Errorf("the input has %d values, want %d", len(x), g.in.channels*g.seq)
	}
	if g.masked != (mask != nil) || mask != nil && len(mask) != g.seq {
		return nil, fmt.Errorf("the graph takes a key mask: %t; the mask has %d values for %d positions", g.masked, len(mask), g.seq)
	}
	env := map[string][]float32{"x": p.s(x), "mask": p.s(mask)}
	for _, o := range g.ops {
		env[o.out.name] = o.eval(env, p)
	}
	return env[out.name], nil
}

func fp16(v float32) float32 { return float16.Fromfloat32(v).Float32() }

// MinNormalFP16 is the smallest normal fp16 value, 2^-14.
const MinNormalFP16 = 1.0 / 16384

// precision is how an evaluation holds activations: rounded to fp16 after every operation, as
// the device does, or (exact) kept in float32; original reads the constants as they were given.
type precision struct{ exact, original bool }

func (p precision) v(x float32) float32 {
	if p.exact {
		return x
	}
	return fp16(x)
}

func (p precision) s(x []float32) []float32 {
	if p.exact {
		return append([]float32(nil), x...)
	}
	return fp16s(x)
}

func fp16s(v []float32) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = fp16(x)
	}
	return out
}

// fp16Literal writes an fp16 constant exactly as the device will hold it, in plain decimal
// (the shortest text that reads back as that value): the references write their literals as
// printf's %f does (maderix/ANE training/stories_mil.h, maderix/h3.c-ane h3_ane_block.m) and
// none uses exponent notation, so neither do we.
func fp16Literal(v float32) string {
	return strconv.FormatFloat(float64(fp16(v)), 'f', -1, 64)
}

// parallel runs f(0..n-1) over the machine's cores; each index is done by one goroutine, so a
// computation that writes only its own index's results is deterministic.
func parallel(n int, f func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				f(i)
			}
		})
	}
	wg.Wait()
}
