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
	"bytes"
	"encoding/binary"
	"flag"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func weights(in, out int, scale float32) []float32 {
	w := make([]float32, in*out)
	for i := range w {
		w[i] = scale * float32(i%7-3) / 4
	}
	return w
}

func TestABlobHasItsHeaderAlignedRecordsAndFP16Data(t *testing.T) {
	b := NewBlob()
	first := b.AddFP16([]float32{1, -2, 0.5, 65504, 1e9, 0.1})
	second := b.AddFP16([]float32{0})
	data := b.Bytes()
	u32 := func(at uint64) uint32 { return binary.LittleEndian.Uint32(data[at:]) }
	u64 := func(at uint64) uint64 { return binary.LittleEndian.Uint64(data[at:]) }
	if u32(0) != 2 || u32(4) != 2 {
		t.Fatalf("header: count %d, version %d; want 2 and 2", u32(0), u32(4))
	}
	if first != 64 || second != 192 || len(data) != 320 {
		t.Fatalf("records at %d and %d, %d bytes; want 64, 192 and 320 (64-byte aligned)", first, second, len(data))
	}
	if u32(first) != 0xDEADBEEF || u32(first+4) != DTypeFP16 || u64(first+8) != 12 || u64(first+16) != 128 {
		t.Fatalf("first record: sentinel %x, dtype %d, size %d, data at %d", u32(first), u32(first+4), u64(first+8), u64(first+16))
	}
	want := []uint16{0x3C00, 0xC000, 0x3800, 0x7BFF, 0x7C00, 0x2E66}
	for i, w := range want {
		if got := binary.LittleEndian.Uint16(data[128+2*i:]); got != w {
			t.Errorf("value %d: fp16 %#04x, want %#04x", i, got, w)
		}
	}
	if held, want := b.FP16(first, 6), []float32{1, -2, 0.5, 65504, float32(math.Inf(1)), 0.0999755859375}; !slices.Equal(held, want) {
		t.Errorf("the values as fp16 holds them: %v, want %v", held, want)
	}
	if u64(second+16) != 256 || u64(second+8) != 2 {
		t.Fatalf("second record: size %d, data at %d", u64(second+8), u64(second+16))
	}
}

func TestALinearLayerMatchesItsGoldenSources(t *testing.T) {
	p, err := Linear{In: 4, Out: 8, Seq: 64, Weights: weights(4, 8, 1)}.Program()
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "linear_4x8_s64.mil", []byte(p.Text))
	golden(t, "linear_4x8_s64.bin", p.Weights)
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from its golden file:\n%s", name, got)
	}
}

func TestIdenticalGraphsEmitIdenticalSources(t *testing.T) {
	a, err := Linear{In: 16, Out: 32, Seq: 128, Weights: weights(16, 32, 0.5)}.Program()
	if err != nil {
		t.Fatal(err)
	}
	b, err := Linear{In: 16, Out: 32, Seq: 128, Weights: weights(16, 32, 0.5)}.Program()
	if err != nil {
		t.Fatal(err)
	}
	if a.Text != b.Text || !bytes.Equal(a.Weights, b.Weights) || a.Digest() != b.Digest() {
		t.Fatal("the same layer at the same shape emitted different sources")
	}
}

func TestDifferentShapesOrWeightsGiveDifferentIdentifiers(t *testing.T) {
	base := Linear{In: 16, Out: 32, Seq: 128, Weights: weights(16, 32, 0.5)}
	longer := base
	longer.Seq = 256
	changed := base
	changed.Weights = weights(16, 32, 0.5)
	changed.Weights[7] += 0.25
	seen := map[string]string{}
	for name, l := range map[string]Linear{"base": base, "another shape": longer, "other weights": changed} {
		p, err := l.Program()
		if err != nil {
			t.Fatal(err)
		}
		if other, ok := seen[p.Digest()]; ok {
			t.Fatalf("%s and %s share an identifier", name, other)
		}
		seen[p.Digest()] = name
	}
}

func TestALayerTheNeuralEngineCannotTakeIsRefused(t *testing.T) {
	for name, l := range map[string]Linear{
		"a sequence not a multiple of 64": {In: 4, Out: 4, Seq: 100, Weights: weights(4, 4, 1)},
		"too few weights":                 {In: 4, Out: 4, Seq: 64, Weights: weights(4, 3, 1)},
		"no channels":                     {In: 0, Out: 4, Seq: 64},
	} {
		if _, err := l.Program(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestALayersMatrixWorkIsItsProjectionsAndItsAttention(t *testing.T) {
	const in, out, seq = 16, 8, 64
	w := weights(in, out, 0.5)
	g, x := NewGraph(in, seq)
	y := g.Linear("y", x, out, w)
	ms := g.Matmuls()
	if len(ms) != 1 || ms[0].M != out || ms[0].N != seq || ms[0].K != in || ms[0].Count != 1 || ms[0].TransB {
		t.Fatalf("a linear layer's work: %+v", ms)
	}
	// The product of the operands, row-major, is the layer: W (out x in) times x (in x S,
	// channel-major).
	xs := make([]float32, in*seq)
	for i := range xs {
		xs[i] = float32(i%9-4) / 4
	}
	want, err := g.Eval(xs, y)
	if err != nil {
		t.Fatal(err)
	}
	for r := range out {
		for c := range seq {
			var acc float32
			for k := range in {
				acc += ms[0].A[r*in+k] * xs[k*seq+c]
			}
			if d := math.Abs(float64(fp16(acc) - want[r*seq+c])); d > 1e-3 {
				t.Fatalf("C[%d][%d] = %v, the layer gives %v", r, c, acc, want[r*seq+c])
			}
		}
	}
	g, x = NewGraph(24, seq)
	g.Attention("attn", g.Slice("q", x, 0, 8), g.Slice("k", x, 8, 16), g.Slice("v", x, 16, 24), g.Mask(), Attention{Heads: 2, KVHeads: 2, HeadDim: 4})
	want2 := []Matmul{{M: seq, N: seq, K: 4, Count: 2, TransB: true}, {M: seq, N: 4, K: seq, Count: 2}}
	if got := g.Matmuls(); len(got) != 2 || got[0].M != want2[0].M || got[0].K != 4 || got[0].Count != 2 || !got[0].TransB || got[1].N != 4 || got[1].K != seq || got[1].A != nil {
		t.Fatalf("attention's work: %+v, want %+v", got, want2)
	}
}
