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
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/x448/float16"
)

// Value is a tensor of the graph: [1, Channels, 1, Seq], fp16, channel-major.
type Value struct {
	name     string
	channels int
}

// Channels is the value's channel count.
func (v Value) Channels() int { return v.channels }

// op is one operation: its MIL lines (constants first, in the order they were made) and its
// CPU evaluation over float32 values that are rounded to fp16 after every operation, as the
// device holds them. A composed operation rounds each of its MIL steps in turn (RMSNorm's
// square overflows as the device's does); a single MIL operation with inner sums (a matmul, a
// reduction, layer_norm, softmax) accumulates wider and rounds its result.
type op struct {
	lines []string
	out   Value
	eval  func(env map[string][]float32, p precision) []float32
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

func (g *Graph) fail(format string, args ...any) {
	if g.err == nil {
		g.err = fmt.Errorf(format, args...)
	}
}

// name reserves an operation's name; names must be plain and unique.
func (g *Graph) name(n string) string {
	if n == "" || strings.ContainsAny(n, ` "()[],;=<>`) || g.used[n] {
		g.fail("operation name %q is empty, not plain or used twice", n)
	}
	g.used[n] = true
	return n
}

func (g *Graph) tensor(c int) string { return fmt.Sprintf("tensor<fp16, [1, %d, 1, %d]>", c, g.seq) }

// weightConst adds an fp16 constant of the given MIL shape from the blob and returns its line,
// with the values rounded as the device holds them.
func (g *Graph) weightConst(name, shape string, values []float32) (string, []float32) {
	off := g.blob.AddFP16(values)
	line := fmt.Sprintf(`tensor<fp16, %s> %s = const()[name = string("%s"), val = tensor<fp16, %s>(BLOBFILE(path = string("%s"), offset = uint64(%d)))];`,
		shape, name, name, shape, BlobPath, off)
	return line, fp16s(values)
}

func (g *Graph) add(o op) Value {
	g.ops = append(g.ops, o)
	return o.out
}

// Linear is y = W x (W has out rows of x.Channels values) as a 1x1 convolution.
func (g *Graph) Linear(name string, x Value, out int, weights []float32) Value {
	name = g.name(name)
	if len(weights) != out*x.channels {
		g.fail("%s: %d weights for a %dx%d layer", name, len(weights), out, x.channels)
		return Value{name: name, channels: out}
	}
	wline, w := g.weightConst(name+"_weight", fmt.Sprintf("[%d, %d, 1, 1]", out, x.channels), weights)
	lines := []string{
		fmt.Sprintf(`string %s_pad_type = const()[name = string("%s_pad_type"), val = string("valid")];`, name, name),
		fmt.Sprintf(`tensor<int32, [2]> %s_strides = const()[name = string("%s_strides"), val = tensor<int32, [2]>([1, 1])];`, name, name),
		fmt.Sprintf(`tensor<int32, [4]> %s_pad = const()[name = string("%s_pad"), val = tensor<int32, [4]>([0, 0, 0, 0])];`, name, name),
		fmt.Sprintf(`tensor<int32, [2]> %s_dilations = const()[name = string("%s_dilations"), val = tensor<int32, [2]>([1, 1])];`, name, name),
		fmt.Sprintf(`int32 %s_groups = const()[name = string("%s_groups"), val = int32(1)];`, name, name),
		wline,
		fmt.Sprintf(`%s %s = conv(dilations = %s_dilations, groups = %s_groups, pad = %s_pad, pad_type = %s_pad_type, strides = %s_strides, weight = %s_weight, x = %s)[name = string("%s")];`,
			g.tensor(out), name, name, name, name, name, name, name, x.name, name),
	}
	in, seq := x.channels, g.seq
	return g.add(op{lines: lines, out: Value{name: name, channels: out}, eval: func(env map[string][]float32, p precision) []float32 {
		xs, y := env[x.name], make([]float32, out*seq)
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
	}})
}

// Add is a + b, element by element.
func (g *Graph) Add(name string, a, b Value) Value {
	return g.binary(name, "add", a, b, func(x, y float32) float32 { return x + y })
}

// Mul is a * b, element by element.
func (g *Graph) Mul(name string, a, b Value) Value {
	return g.binary(name, "mul", a, b, func(x, y float32) float32 { return x * y })
}

func (g *Graph) binary(name, kind string, a, b Value, f func(x, y float32) float32) Value {
	name = g.name(name)
	if a.channels != b.channels {
		g.fail("%s: %s of %d and %d channels", name, kind, a.channels, b.channels)
	}
	line := fmt.Sprintf(`%s %s = %s(x = %s, y = %s)[name = string("%s")];`, g.tensor(a.channels), name, kind, a.name, b.name, name)
	return g.add(op{lines: []string{line}, out: Value{name: name, channels: a.channels}, eval: func(env map[string][]float32, p precision) []float32 {
		xs, ys := env[a.name], env[b.name]
		out := make([]float32, len(xs))
		for i := range xs {
			out[i] = f(xs[i], ys[i])
		}
		return p.s(out)
	}})
}

// GELU is the tanh approximation of GELU.
func (g *Graph) GELU(name string, x Value) Value {
	name = g.name(name)
	lines := []string{
		fmt.Sprintf(`string %s_mode = const()[name = string("%s_mode"), val = string("TANH_APPROXIMATION")];`, name, name),
		fmt.Sprintf(`%s %s = gelu(mode = %s_mode, x = %s)[name = string("%s")];`, g.tensor(x.channels), name, name, x.name, name),
	}
	return g.unary(name, lines, x, func(v float64) float64 {
		return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
	})
}

// GELUExact is GELU with the error function (ModernBERT's activation).
func (g *Graph) GELUExact(name string, x Value) Value {
	name = g.name(name)
	lines := []string{
		fmt.Sprintf(`string %s_mode = const()[name = string("%s_mode"), val = string("EXACT")];`, name, name),
		fmt.Sprintf(`%s %s = gelu(mode = %s_mode, x = %s)[name = string("%s")];`, g.tensor(x.channels), name, name, x.name, name),
	}
	return g.unary(name, lines, x, func(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) })
}

// SiLU is x * sigmoid(x).
func (g *Graph) SiLU(name string, x Value) Value {
	name = g.name(name)
	lines := []string{fmt.Sprintf(`%s %s = silu(x = %s)[name = string("%s")];`, g.tensor(x.channels), name, x.name, name)}
	return g.unary(name, lines, x, func(v float64) float64 { return v / (1 + math.Exp(-v)) })
}

func (g *Graph) unary(name string, lines []string, x Value, f func(float64) float64) Value {
	return g.add(op{lines: lines, out: Value{name: name, channels: x.channels}, eval: func(env map[string][]float32, p precision) []float32 {
		xs := env[x.name]
		out := make([]float32, len(xs))
		for i, v := range xs {
			out[i] = float32(f(float64(v)))
		}
		return p.s(out)
	}})
}

// Slice keeps channels [from, to) of x.
func (g *Graph) Slice(name string, x Value, from, to int) Value {
	name = g.name(name)
	if from < 0 || to > x.channels || from >= to {
		g.fail("%s: channels [%d, %d) of %d", name, from, to, x.channels)
		return Value{name: name, channels: max(to-from, 1)}
	}
	lines := []string{
		fmt.Sprintf(`tensor<int32, [4]> %s_begin = const()[name = string("%s_begin"), val = tensor<int32, [4]>([0, %d, 0, 0])];`, name, name, from),
		fmt.Sprintf(`tensor<int32, [4]> %s_end = const()[name = string("%s_end"), val = tensor<int32, [4]>([1, %d, 1, %d])];`, name, name, to, g.seq),
		fmt.Sprintf(`%s %s = slice_by_index(begin = %s_begin, end = %s_end, x = %s)[name = string("%s")];`, g.tensor(to-from), name, name, name, x.name, name),
	}
	seq := g.seq
	return g.add(op{lines: lines, out: Value{name: name, channels: to - from}, eval: func(env map[string][]float32, p precision) []float32 {
		return append([]float32(nil), env[x.name][from*seq:to*seq]...)
	}})
}

// LayerNorm normalises each position over the channels: (x - mean) / sqrt(var + eps) * gamma
// (+ beta, if given).
func (g *Graph) LayerNorm(name string, x Value, gamma, beta []float32, eps float32) Value {
	name = g.name(name)
	c := x.channels
	if len(gamma) != c || beta != nil && len(beta) != c {
		g.fail("%s: gamma and beta must have %d values", name, c)
		return Value{name: name, channels: c}
	}
	if beta == nil {
		beta = make([]float32, c)
	}
	gline, gw := g.weightConst(name+"_gamma", fmt.Sprintf("[%d]", c), gamma)
	bline, bw := g.weightConst(name+"_beta", fmt.Sprintf("[%d]", c), beta)
	lines := []string{
		fmt.Sprintf(`tensor<int32, [1]> %s_axes = const()[name = string("%s_axes"), val = tensor<int32, [1]>([1])];`, name, name),
		fmt.Sprintf(`fp16 %s_epsilon = const()[name = string("%s_epsilon"), val = fp16(%s)];`, name, name, fp16Literal(eps)),
		gline, bline,
		fmt.Sprintf(`%s %s = layer_norm(axes = %s_axes, beta = %s_beta, epsilon = %s_epsilon, gamma = %s_gamma, x = %s)[name = string("%s")];`,
			g.tensor(c), name, name, name, name, name, x.name, name),
	}
	seq, e := g.seq, float64(fp16(eps))
	return g.add(op{lines: lines, out: Value{name: name, channels: c}, eval: func(env map[string][]float32, p precision) []float32 {
		xs, out := env[x.name], make([]float32, c*seq)
		for s := range seq {
			var mean, sq float64
			for i := range c {
				mean += float64(xs[i*seq+s])
			}
			mean /= float64(c)
			for i := range c {
				d := float64(xs[i*seq+s]) - mean
				sq += d * d
			}
			inv := 1 / math.Sqrt(sq/float64(c)+e)
			for i := range c {
				out[i*seq+s] = float32((float64(xs[i*seq+s])-mean)*inv)*gw[i] + bw[i]
			}
		}
		return p.s(out)
	}})
}

// RMSNorm normalises each position by its root mean square over the channels, times gamma.
func (g *Graph) RMSNorm(name string, x Value, gamma []float32, eps float32) Value {
	name = g.name(name)
	c := x.channels
	if len(gamma) != c {
		g.fail("%s: gamma must have %d values", name, c)
		return Value{name: name, channels: c}
	}
	gline, gw := g.weightConst(name+"_gamma", fmt.Sprintf("[1, %d, 1, 1]", c), gamma)
	mean := fmt.Sprintf("tensor<fp16, [1, 1, 1, %d]>", g.seq)
	lines := []string{
		fmt.Sprintf(`tensor<int32, [1]> %s_axes = const()[name = string("%s_axes"), val = tensor<int32, [1]>([1])];`, name, name),
		fmt.Sprintf(`bool %s_keep = const()[name = string("%s_keep"), val = bool(true)];`, name, name),
		fmt.Sprintf(`fp16 %s_epsilon = const()[name = string("%s_epsilon"), val = fp16(%s)];`, name, name, fp16Literal(eps)),
		gline,
		fmt.Sprintf(`%s %s_sq = mul(x = %s, y = %s)[name = string("%s_sq")];`, g.tensor(c), name, x.name, x.name, name),
		fmt.Sprintf(`%s %s_mean = reduce_mean(axes = %s_axes, keep_dims = %s_keep, x = %s_sq)[name = string("%s_mean")];`, mean, name, name, name, name, name),
		fmt.Sprintf(`%s %s_var = add(x = %s_mean, y = %s_epsilon)[name = string("%s_var")];`, mean, name, name, name, name),
		fmt.Sprintf(`%s %s_inv = rsqrt(x = %s_var)[name = string("%s_inv")];`, mean, name, name, name),
		fmt.Sprintf(`%s %s_norm = mul(x = %s, y = %s_inv)[name = string("%s_norm")];`, g.tensor(c), name, x.name, name, name),
		fmt.Sprintf(`%s %s = mul(x = %s_norm, y = %s_gamma)[name = string("%s")];`, g.tensor(c), name, name, name, name),
	}
	seq, e := g.seq, fp16(eps)
	return g.add(op{lines: lines, out: Value{name: name, channels: c}, eval: func(env map[string][]float32, p precision) []float32 {
		xs, out := env[x.name], make([]float32, c*seq)
		sq := make([]float32, c)
		for s := range seq {
			for i := range c {
				sq[i] = xs[i*seq+s]
			}
			inv := p.rmsInv(sq, e)
			for i := range c {
				out[i*seq+s] = p.v(p.v(xs[i*seq+s]*inv) * gw[i])
			}
		}
		return out
	}})
}

// Program emits the graph's program, returning out.
func (g *Graph) Program(out Value) (Program, error) {
	if g.err != nil {
		return Program{}, g.err
	}
	var b strings.Builder
	b.WriteString("program(1.3)\n{\n")
	if g.masked {
		fmt.Fprintf(&b, "    func main<ios18>(%s x, tensor<fp16, [1, 1, 1, %d]> mask) {\n", g.tensor(g.in.channels), g.seq)
	} else {
		fmt.Fprintf(&b, "    func main<ios18>(%s x) {\n", g.tensor(g.in.channels))
	}
	for _, o := range g.ops {
		for _, l := range o.lines {
			b.WriteString("        " + l + "\n")
		}
	}
	fmt.Fprintf(&b, "    } -> (%s);\n}\n", out.name)
	return Program{Text: b.String(), Weights: g.blob.Bytes()}, nil
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

// precision is how an evaluation holds activations: rounded to fp16 after every operation, as
// the device does, or (exact) kept in float32.
type precision struct{ exact bool }

func (p precision) v(x float32) float32 {
	if p.exact {
		return x
	}
	return fp16(x)
}

// rmsInv is 1/sqrt(mean(x^2) + eps) as the five MIL steps compute it: each square, the mean,
// the sum and the root rounded in turn, so a square fp16 cannot hold overflows here as it does
// on the device (the mean is accumulated wider, as the device's reduction is).
func (p precision) rmsInv(x []float32, eps float32) float32 {
	var sum float64
	for _, v := range x {
		sum += float64(p.v(v * v))
	}
	mean := p.v(float32(sum / float64(len(x))))
	return p.v(float32(1 / math.Sqrt(float64(p.v(mean+eps)))))
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

// fp16Literal writes an fp16 constant exactly as the device will hold it (the shortest text
// that reads back as that value).
func fp16Literal(v float32) string {
	return strconv.FormatFloat(float64(fp16(v)), 'g', -1, 32)
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
