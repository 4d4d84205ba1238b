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
	"strings"
	"testing"
)

// TestTheStructuralMaskComputedInFP16IsExactAtEveryLength checks the fp16 steps band emits
// against the integer rule at the largest rung: the causal and the 128-wide local masks come
// out exactly, where one fp16 ramp of positions does not past 2048.
func TestTheStructuralMaskComputedInFP16IsExactAtEveryLength(t *testing.T) {
	const seq, halfWindow = 8192, 64
	naiveWrong := 0
	// Every key for a spread of queries, the rows either side of each power of two included.
	for t0 := 0; t0 < seq; t0 += 61 {
		for _, q := range []int{t0, min(t0+1, seq-1)} {
			for k := range seq {
				d := bandDistance(q, k)
				if (d > 0) != (k > q) {
					t.Fatalf("causal: query %d, key %d: fp16 distance %v", q, k, d)
				}
				if (float32(math.Abs(float64(d))) > halfWindow) != (abs(k-q) > halfWindow) {
					t.Fatalf("local: query %d, key %d: fp16 distance %v", q, k, d)
				}
				if fp16(fp16(float32(k))-fp16(float32(q))) > 0 != (k > q) {
					naiveWrong++
				}
			}
		}
	}
	if naiveWrong == 0 {
		t.Fatal("a single fp16 ramp came out exact too: the test does not reach the lengths fp16 cannot count to")
	}
}

func TestTheMaskAddsExactlyWhereTheRuleHidesAKey(t *testing.T) {
	// A graph whose only work is the attention of a constant query over keys that differ, so
	// each output position reads which keys it saw.
	const seq, d = 128, 2
	for _, a := range []Attention{{Heads: 1, KVHeads: 1, HeadDim: d, Causal: true}, {Heads: 1, KVHeads: 1, HeadDim: d, Window: 8}} {
		g, x := NewGraph(3*d, seq)
		mask := g.Mask()
		y := g.Attention("attn", g.Slice("q", x, 0, d), g.Slice("k", x, d, 2*d), g.Slice("v", x, 2*d, 3*d), mask, a)
		in := make([]float32, 3*d*seq)
		for s := range seq {
			in[2*d*seq+s] = float32(s) // v, channel 0: the key's position
		}
		out, err := g.EvalMasked(in, make([]float32, seq), y)
		if err != nil {
			t.Fatal(err)
		}
		for q := range seq {
			lo, hi := 0, q
			if !a.Causal {
				lo, hi = max(0, q-a.Window/2), min(seq-1, q+a.Window/2)
			}
			// Equal scores: the output is the mean position of the keys the query sees.
			want := float64(lo+hi) / 2
			if got := float64(out[q]); math.Abs(got-want) > 0.02*want+0.05 {
				t.Fatalf("%+v: query %d averaged keys to %v, want %v", a, q, got, want)
			}
		}
	}
}

func TestLiteralsAreWrittenAsTheDeviceHoldsThemInPlainDecimal(t *testing.T) {
	for _, tc := range []struct {
		v    float32
		want string
	}{
		{1e-5, "0.000010013580322265625"}, {-1e4, "-10000"}, {0.125, "0.125"}, {-0.5, "-0.5"}, {1 / math.Sqrt2, "0.70703125"}, {64, "64"},
	} {
		if got := fp16Literal(tc.v); got != tc.want || strings.ContainsAny(got, "eE") {
			t.Errorf("fp16Literal(%v) = %s, want %s", tc.v, got, tc.want)
		}
	}
	// Both catalog models' epsilons are fp16 subnormals; the programs carry their square roots,
	// which are normal, so the model's own epsilon is used, not a substitute.
	for _, eps := range []float32{1e-5, 1e-6} {
		r := rootEpsilon(eps)
		if r < MinNormalFP16 || math.Abs(float64(r*r-eps))/float64(eps) > 2e-3 {
			t.Errorf("rootEpsilon(%v) = %v, whose square is %v", eps, r, r*r)
		}
	}
}

// TestAPaddedPositionStaysFiniteThroughANorm: a position of zeros (padding) through RMSNorm
// gives zeros, not NaN: its largest magnitude is floored at the smallest normal fp16 value, so
// the inverse it is scaled by and the epsilon term stay finite.
func TestAPaddedPositionStaysFiniteThroughANorm(t *testing.T) {
	const c, seq = 8, 64
	g, x := NewGraph(c, seq)
	gamma := []float32{1, 1, 1, 1, 1, 1, 1, 1}
	y := g.LayerNorm("ln", g.RMSNorm("rms", x, gamma, 1e-6), gamma, 1e-5)
	in := make([]float32, c*seq)
	for i := range c {
		in[i*seq] = float32(i) // position 0 real, the rest zero
	}
	out, err := g.Eval(in, y)
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("value %d is %v", i, v)
		}
	}
	// What an unguarded norm would do to the padded positions: pow(0 + 0, -0.5) * 0.
	if v := float32(math.Pow(0, -0.5)) * 0; !math.IsNaN(float64(v)) {
		t.Fatalf("0 * pow(0, -0.5) = %v; the hazard this guards against is gone", v)
	}
}

// TestAttentionAtLargeRungsIsTiledOverQueryRowsWithinTheWorkingSet: at S = 8192 in the shapes
// of both catalog families the scores are computed for tiles of query rows, each tile's
// scores and structural mask within MaxWorkingSet (the validator checks every tensor), the
// tiles covering every query once, in order; at S = 512 nothing is tiled.
func TestAttentionAtLargeRungsIsTiledOverQueryRowsWithinTheWorkingSet(t *testing.T) {
	for _, tc := range []struct {
		name      string
		a         Attention
		seq, rows int
	}{
		{"qwen3", Attention{Heads: 16, KVHeads: 8, HeadDim: 128, Causal: true}, 8192, 128},
		{"modernbert local", Attention{Heads: 12, KVHeads: 12, HeadDim: 64, Window: 128}, 8192, 128},
		{"modernbert global", Attention{Heads: 12, KVHeads: 12, HeadDim: 64}, 2048, 512},
		{"qwen3 at 512", Attention{Heads: 16, KVHeads: 8, HeadDim: 128, Causal: true}, 512, 512},
	} {
		q, kv := tc.a.Heads*tc.a.HeadDim, tc.a.KVHeads*tc.a.HeadDim
		g, x := NewGraph(q+2*kv, tc.seq)
		mask := g.Mask()
		y := g.Attention("attn", g.Slice("q", x, 0, q), g.Slice("k", x, q, q+kv), g.Slice("v", x, q+kv, q+2*kv), mask, tc.a)
		p, err := g.Program(y)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := tileRows(tc.a.Heads, tc.seq); got != tc.rows {
			t.Fatalf("%s: %d rows a tile, want %d", tc.name, got, tc.rows)
		}
		if tc.rows == tc.seq {
			if strings.Contains(p.Text, "_tile") {
				t.Fatalf("%s: tiled at S = %d", tc.name, tc.seq)
			}
			continue
		}
		begins := regexp.MustCompile(`attn_qbegin_tile(\d+) = const\(\)\[name = string\("attn_qbegin_tile\d+"\), val = tensor<int32, \[4\]>\(\[0, 0, (\d+), 0\]\)\]`).FindAllStringSubmatch(p.Text, -1)
		if len(begins) != tc.seq/tc.rows {
			t.Fatalf("%s: %d tiles, want %d", tc.name, len(begins), tc.seq/tc.rows)
		}
		for i, b := range begins {
			if b[1] != fmt.Sprint(i) || b[2] != fmt.Sprint(i*tc.rows) {
				t.Fatalf("%s: tile %s starts at row %s, want tile %d at %d", tc.name, b[1], b[2], i, i*tc.rows)
			}
		}
		if n := strings.Count(p.Text, "_khi = const()"); tc.a.Causal && n != 1 {
			t.Fatalf("%s: the key ramps are declared %d times", tc.name, n)
		}
	}
	// One head at S = 4096 holds exactly MaxWorkingSet of scores: not tiled, and allowed.
	g, x := NewGraph(3*64, 4096)
	mask := g.Mask()
	y := g.Attention("attn", g.Slice("q", x, 0, 64), g.Slice("k", x, 64, 128), g.Slice("v", x, 128, 192), mask, Attention{Heads: 1, KVHeads: 1, HeadDim: 64})
	if p, err := g.Program(y); err != nil || strings.Contains(p.Text, "_tile") {
		t.Fatalf("32 MiB of scores: %v", err)
	}
}

// TestANormHoldsLargeAndSmallPositionsInFP16: a late layer's residual (hundreds: its squares
// pass fp16's 65,504), an early layer's (thousandths: below the smallest normal epsilon),
// one with a single outlier channel, and a padded all-zero position all come out of the norms,
// evaluated as the device holds every value, within cosine 0.9999 of the exact norm with the
// model's own epsilon; the zero position comes out zero, not NaN.
func TestANormHoldsLargeAndSmallPositionsInFP16(t *testing.T) {
	const c, seq, eps = 256, 64, 1e-6
	x := make([]float32, c*seq)
	for i := range c {
		x[i*seq+0] = float32(300 + i%7)              // late residual
		x[i*seq+1] = float32(0.003 * float64(1+i%5)) // early, small
		x[i*seq+2] = float32(0.5 * math.Sin(float64(i)))
		x[i*seq+3] = 0 // padding
	}
	x[5*seq+2] = 900 // an outlier channel
	gamma := make([]float32, c)
	for i := range gamma {
		gamma[i] = 1 + float32(i%3)/8
	}
	for _, kind := range []string{"rms", "layer"} {
		g, in := NewGraph(c, seq)
		var y Value
		if kind == "rms" {
			y = g.RMSNorm("n", in, gamma, eps)
		} else {
			y = g.LayerNorm("n", in, gamma, eps)
		}
		if _, err := g.Program(y); err != nil {
			t.Fatal(err)
		}
		got, err := g.Eval(x, y)
		if err != nil {
			t.Fatal(err)
		}
		for s := range 4 {
			col := make([]float64, c)
			var mean float64
			for i := range c {
				col[i] = float64(x[i*seq+s])
				mean += col[i] / c
			}
			var ms float64
			for i := range c {
				if kind == "layer" {
					col[i] -= mean
				}
				ms += col[i] * col[i] / c
			}
			var dot, gg, ww float64
			for i := range c {
				want := col[i] / math.Sqrt(ms+eps) * float64(gamma[i])
				v := float64(got[i*seq+s])
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("%s norm, position %d: %v", kind, s, v)
				}
				dot, gg, ww = dot+v*want, gg+v*v, ww+want*want
			}
			if s == 3 {
				if gg != 0 {
					t.Fatalf("%s norm: the padded position is not zero", kind)
				}
				continue
			}
			if cos := dot / math.Sqrt(gg*ww); cos < 0.9999 || math.Abs(math.Sqrt(gg/ww)-1) > 0.01 {
				t.Fatalf("%s norm, position %d: cosine %v, norm ratio %v", kind, s, cos, math.Sqrt(gg/ww))
			}
		}
	}
}

// TestTheHeadNormsHoldLargeQueriesAndKeysInFP16: Qwen3's per-head q and k norms square each
// head's values as the channel norms do; a query or key head in the hundreds keeps its
// direction in fp16 (within cosine 0.999 of the float32 evaluation), not zeroed by a square
// past 65,504.
func TestTheHeadNormsHoldLargeQueriesAndKeysInFP16(t *testing.T) {
	const seq, d = 64, 16
	g, x := NewGraph(3*d, seq)
	mask := g.Mask()
	gamma := make([]float32, d)
	for i := range gamma {
		gamma[i] = 1
	}
	y := g.Attention("attn", g.Slice("q", x, 0, d), g.Slice("k", x, d, 2*d), g.Slice("v", x, 2*d, 3*d), mask,
		Attention{Heads: 1, KVHeads: 1, HeadDim: d, QNorm: gamma, KNorm: gamma, NormEps: 1e-6, Causal: true})
	in := make([]float32, 3*d*seq)
	for i := range 2 * d {
		for s := range seq {
			in[i*seq+s] = float32(300 * math.Sin(float64(i*7+s*3))) // q and k in the hundreds
		}
	}
	for i := 2 * d; i < 3*d; i++ {
		for s := range seq {
			in[i*seq+s] = float32(math.Cos(float64(i + s)))
		}
	}
	m := make([]float32, seq)
	got, err := g.EvalMasked(in, m, y)
	if err != nil {
		t.Fatal(err)
	}
	want, err := g.EvalExact(in, m, y)
	if err != nil {
		t.Fatal(err)
	}
	var dot, gg, ww float64
	for i := range want {
		if math.IsNaN(float64(got[i])) {
			t.Fatalf("value %d is NaN", i)
		}
		dot, gg, ww = dot+float64(got[i])*float64(want[i]), gg+float64(got[i])*float64(got[i]), ww+float64(want[i])*float64(want[i])
	}
	if cos := dot / math.Sqrt(gg*ww); cos < 0.999 {
		t.Fatalf("cosine %v between the fp16 and float32 attention", cos)
	}
}
