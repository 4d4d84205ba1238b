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

package ane

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// TestOpenProbesEveryPrivateMethod runs on a Mac: the frameworks load and every private class
// and selector is present, or Open names what is missing (or says there is no Neural Engine,
// in a virtual machine). It never aborts the process.
func TestOpenProbesEveryPrivateMethod(t *testing.T) {
	r, err := Open()
	var missing *MissingError
	switch {
	case err == nil:
		if len(r.classes) != 4 {
			t.Fatalf("%d classes resolved, want 4", len(r.classes))
		}
	case errors.As(err, &missing):
		// A macOS release that renamed a selector is what these tests exist to catch: it fails,
		// naming the selector, never skips.
		t.Fatalf("this macOS build lacks part of the private API: %v", err)
	case errors.Is(err, ErrUnsupported):
		t.Skipf("no Neural Engine here: %v", err)
	default:
		t.Fatalf("Open: an untyped error %v", err)
	}
}

// TestALinearLayerCompilesLoadsAndIsCachedTheSecondTime runs on a Mac with a Neural Engine:
// one small layer is compiled (unless aned already holds it) and loaded; the same program built
// again has the same identifier, and aned holds it.
func TestALinearLayerCompilesLoadsAndIsCachedTheSecondTime(t *testing.T) {
	r := openOrSkip(t)
	w := make([]float32, 64*64)
	for i := range w {
		w[i] = float32(i%5-2) / 8
	}
	p, err := mil.Linear{In: 64, Out: 64, Seq: 64, Weights: w}.Program()
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.NewModel(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Identifier() == "" {
		t.Fatal("no content identifier")
	}
	cached, err := m.Cached()
	if err != nil {
		t.Fatal(err)
	}
	if !cached {
		if err := m.Compile(); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	if err := m.Unload(); err != nil {
		t.Fatal(err)
	}
	again, err := r.NewModel(p)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again.Identifier() != m.Identifier() {
		t.Fatalf("the same program has identifiers %s and %s", m.Identifier(), again.Identifier())
	}
	if cached, err := again.Cached(); err != nil || !cached {
		t.Fatalf("neither aned nor a kept folder holds the compiled program: %v, %v", cached, err)
	}
	// It loads without a compile, from where the cache check found it.
	if err := again.Load(); err != nil {
		t.Fatalf("the held program (%s) does not load: %v", again.Held(), err)
	}
	defer again.Unload()
	if again.Origin() == FromCompile || again.Origin() == "" {
		t.Fatalf("the held program loaded as %q", again.Origin())
	}
	t.Logf("held as %s; aned's -compiledModelExists answered for it: %t", again.Held(), again.Held() == FromAned)
}

// TestTheCompilersFolderIsFoundationsNotTMPDIR runs on a Mac: the sources go to
// NSTemporaryDirectory(), the per-user folder, even when TMPDIR is unset (as it is for a
// launchd job), where Go's os.TempDir() would say /tmp.
func TestTheCompilersFolderIsFoundationsNotTMPDIR(t *testing.T) {
	r := openOrSkip(t)
	root := r.Sources().Root
	if root == "" || filepath.Clean(root) == "/tmp" || filepath.Clean(root) == "/private/tmp" {
		t.Fatalf("the compiler's folder is %q", root)
	}
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		t.Fatalf("%s: %v", root, err)
	}
	if free, err := r.Sources().Free(); err != nil || free <= 0 {
		t.Fatalf("free space of %s: %d, %v", root, free, err)
	}
	t.Logf("NSTemporaryDirectory() = %s (TMPDIR=%q, os.TempDir() = %s); model URL set: %t", root, os.Getenv("TMPDIR"), os.TempDir(), r.SetsModelURL())
}

// TestATwoInputProgramEvaluatesThroughTheSymbolsItsAttributesName runs on a Mac: a program
// taking x and the key mask is bound by the names the framework reports and matches its CPU
// reference.
func TestATwoInputProgramEvaluatesThroughTheSymbolsItsAttributesName(t *testing.T) {
	r := openOrSkip(t)
	const c, seq = 64, 64
	g, x := mil.NewGraph(3*c, seq)
	mask := g.Mask()
	att := g.Attention("attn", g.Slice("q", x, 0, c), g.Slice("k", x, c, 2*c), g.Slice("v", x, 2*c, 3*c), mask, mil.Attention{Heads: 2, KVHeads: 2, HeadDim: c / 2})
	// The program does not end in a reshape (which the device is reported not to take as a
	// program's last step, jafreck/ironmill ane-op-support-matrix.md).
	y := g.Add("y", att, att)
	p, err := g.Program(y)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.NewModel(p)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if cached, err := m.Cached(); err != nil {
		t.Fatal(err)
	} else if !cached {
		if err := m.Compile(); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Load(); err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	attrs, err := m.Attributes()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("attributes: %+v", attrs)
	b, err := attrs.Bind(p)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := m.NewEvaluator(b)
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	in := make([]float32, 3*c*seq)
	for i := range in {
		in[i] = float32(i%13-6) / 8
	}
	keyMask := make([]float32, seq)
	for s := seq / 2; s < seq; s++ {
		keyMask[s] = mil.MaskNegative
	}
	want, err := g.EvalMasked(in, keyMask, y)
	if err != nil {
		t.Fatal(err)
	}
	var inputs [][]float32
	for _, bound := range b.Inputs {
		inputs = append(inputs, map[string][]float32{"x": in, "mask": keyMask}[bound.Port.Name])
	}
	got := make([]float32, len(want))
	if err := ev.Eval(inputs, got); err != nil {
		t.Fatal(err)
	}
	var worst float64
	for i := range got {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	if worst > 0.05 {
		t.Fatalf("the device differs from the CPU reference by %.4f", worst)
	}
}

// openOrSkip opens the framework; a machine without a Neural Engine (a virtual machine) skips,
// a missing class or selector fails by name.
func openOrSkip(t *testing.T) *Runtime {
	t.Helper()
	r, err := Open()
	var missing *MissingError
	switch {
	case errors.As(err, &missing):
		t.Fatalf("this macOS build lacks part of the private API: %v", err)
	case err != nil:
		t.Skipf("no usable Neural Engine: %v", err)
	}
	return r
}
