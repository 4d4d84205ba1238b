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

import "testing"

// An original graph emits the same program and evaluates with its constants as given: a weight
// fp16 cannot hold exactly (1 + 2^-13) gives its own product there, its rounding elsewhere.
func TestAnOriginalGraphEvaluatesTheConstantsAsGivenAndEmitsTheSameProgram(t *testing.T) {
	const w = 1 + 1.0/8192
	build := func(newGraph func(int, int) (*Graph, Value)) (*Graph, Value) {
		g, x := newGraph(1, 64)
		return g, g.Linear("proj", x, 1, []float32{w})
	}
	g16, y16 := build(NewGraph)
	orig, yo := build(NewOriginalGraph)
	p16, err := g16.Program(y16)
	if err != nil {
		t.Fatal(err)
	}
	po, err := orig.Program(yo)
	if err != nil {
		t.Fatal(err)
	}
	if p16.Text != po.Text || string(p16.Weights) != string(po.Weights) {
		t.Fatal("an original graph emits another program")
	}
	x := make([]float32, 64)
	x[0] = 1
	exact, err := g16.EvalExact(x, nil, y16)
	if err != nil {
		t.Fatal(err)
	}
	original, err := orig.EvalOriginal(x, nil, yo)
	if err != nil {
		t.Fatal(err)
	}
	if exact[0] != 1 || original[0] != w {
		t.Fatalf("fp16 weights give %v (want 1), the original ones %v (want %v)", exact[0], original[0], float32(w))
	}
	if _, err := g16.EvalOriginal(x, nil, y16); err == nil {
		t.Fatal("a graph that keeps only fp16 constants evaluated as original")
	}
}
