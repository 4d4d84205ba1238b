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
		t.Skipf("this macOS build lacks part of the private API: %v", err)
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
	r, err := Open()
	if err != nil {
		t.Skipf("no usable Neural Engine: %v", err)
	}
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
		t.Fatalf("aned does not hold the compiled program: %v, %v", cached, err)
	}
}
