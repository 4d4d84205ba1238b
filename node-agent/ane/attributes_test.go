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
	"slices"
	"testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// layerProgram is the interface of a layer's program: x [1, 32, 1, 64], mask [1, 1, 1, 64],
// output y [1, 32, 1, 64].
var layerProgram = mil.Program{
	Inputs: []mil.Port{{Name: "mask", Channels: 1, Seq: 64}, {Name: "x", Channels: 32, Seq: 64}},
	Output: mil.Port{Name: "y", Channels: 32, Seq: 64},
}

// attributesLike is a modelAttributes dictionary in the shape jafreck/ironmill
// ane-runtime-behavior.md §7 shows, converted to Go values, with the input symbols in order.
func attributesLike(inputs ...string) map[string]any {
	names, idx := []any{}, []any{}
	for i, n := range inputs {
		names, idx = append(names, n), append(idx, float64(i))
	}
	live := func(c, w float64) map[string]any {
		return map[string]any{"BatchStride": 2 * w * c, "Batches": 1.0, "Channels": c, "Depth": 1.0, "Height": 1.0, "Width": w,
			"PlaneStride": 2 * w, "RowStride": 2 * w, "Type": "Float16", "Interleave": 1.0}
	}
	var lives []any
	for _, n := range inputs {
		if n == "mask" {
			lives = append(lives, live(1, 64))
		} else {
			lives = append(lives, live(32, 64))
		}
	}
	return map[string]any{
		"ANEFModelDescription": map[string]any{
			"ANEFModelInput16KAlignmentArray": []any{0.0, 0.0},
			"ANEFModelProcedures": []any{map[string]any{
				"ANEFModelInputSymbolIndexArray": idx, "ANEFModelOutputSymbolIndexArray": []any{0.0}, "ANEFModelProcedureID": 0.0}},
			"kANEFModelInputSymbolsArrayKey":    names,
			"kANEFModelOutputSymbolsArrayKey":   []any{"y@output"},
			"kANEFModelProcedureNameToIDMapKey": map[string]any{"main": 0.0},
		},
		"NetworkStatusList": []any{map[string]any{"LiveInputList": lives, "LiveOutputList": []any{live(32, 64)}}},
	}
}

func TestInputsAreBoundToTheSymbolsTheFrameworkNamesThem(t *testing.T) {
	// Whichever order the framework lists the symbols in, each surface goes to the symbol of
	// its input's name.
	for _, order := range [][]string{{"mask", "x"}, {"x", "mask"}} {
		a, err := ParseAttributes(attributesLike(order...), layerProgram)
		if err != nil {
			t.Fatal(err)
		}
		b, err := a.Bind(layerProgram)
		if err != nil {
			t.Fatal(err)
		}
		var bound []string
		for i, in := range b.Inputs {
			if in.Symbol.Index != i || in.Port.Name != order[i] || !in.Symbol.Layout.Reported {
				t.Fatalf("order %v: input %d bound as %+v", order, i, in)
			}
			bound = append(bound, in.Port.Name)
		}
		if !slices.Equal(bound, order) || b.Output.Port.Name != "y" || b.Output.Symbol.Name != "y@output" {
			t.Fatalf("order %v: bound %v, output %+v", order, bound, b.Output)
		}
	}
}

func TestABindingTheProgramDoesNotMatchFailsLoudly(t *testing.T) {
	for name, attrs := range map[string]map[string]any{
		"a missing input":  attributesLike("x"),
		"an unknown input": attributesLike("mask", "hidden"),
		"a renamed output": func() map[string]any {
			a := attributesLike("mask", "x")
			a["ANEFModelDescription"].(map[string]any)["kANEFModelOutputSymbolsArrayKey"] = []any{"z@output"}
			return a
		}(),
		"a layout of another shape": func() map[string]any {
			a := attributesLike("mask", "x")
			a["NetworkStatusList"].([]any)[0].(map[string]any)["LiveInputList"].([]any)[1].(map[string]any)["Channels"] = 16.0
			return a
		}(),
	} {
		a, err := ParseAttributes(attrs, layerProgram)
		if err == nil {
			_, err = a.Bind(layerProgram)
		}
		var be *BindingError
		if !errors.As(err, &be) {
			t.Errorf("%s: %v, want a BindingError", name, err)
		}
	}
	if _, err := ParseAttributes(map[string]any{"NetworkStatusList": []any{}}, layerProgram); err == nil {
		t.Error("attributes without a model description were read")
	}
}

func TestAReportedLayoutIsHonouredAndAMissingOneIsDense(t *testing.T) {
	attrs := attributesLike("mask", "x")
	// The framework pads each channel of x to 256 bytes.
	x := attrs["NetworkStatusList"].([]any)[0].(map[string]any)["LiveInputList"].([]any)[1].(map[string]any)
	x["PlaneStride"], x["RowStride"] = 256.0, 256.0
	delete(attrs, "NetworkStatusList")
	a, err := ParseAttributes(attrs, layerProgram)
	if err != nil {
		t.Fatal(err)
	}
	if l := a.Inputs[1].Layout; l.Reported || l != dense(32, 64) {
		t.Fatalf("without NetworkStatusList: %+v, want the dense layout", l)
	}
	padded := Layout{Channels: 2, Height: 1, Width: 3, RowStride: 64, PlaneStride: 64, Reported: true}
	buf := make([]byte, SurfaceBytes([]Layout{padded}))
	values := []float32{1, 2, 3, -4, 0.5, 65504}
	if err := padded.Pack(buf, values); err != nil {
		t.Fatal(err)
	}
	if buf[64] == 0 && buf[65] == 0 || buf[6] != 0 {
		t.Fatalf("channel 1 is not at byte 64: % x", buf[:72])
	}
	got := make([]float32, 6)
	if err := padded.Unpack(buf, got); err != nil || !slices.Equal(got, values) {
		t.Fatalf("unpacked %v (%v), want %v", got, err, values)
	}
}

func TestSurfacesAreAtLeast16KiBAndOneSizeForEverySurfaceOfARequest(t *testing.T) {
	mask, x := dense(1, 64), dense(32, 512)
	if got := SurfaceBytes([]Layout{mask}); got != 16<<10 {
		t.Fatalf("a 128-byte mask gets %d bytes, want 16 KiB", got)
	}
	if got := SurfaceBytes([]Layout{mask, x}); got != 32<<10 {
		t.Fatalf("x of 32 KiB beside the mask: %d, want one 32 KiB size for both", got)
	}
	if got := SurfaceBytes([]Layout{dense(768, 129)}); got%(16<<10) != 0 || got < 768*129*2 {
		t.Fatalf("%d is not whole 16 KiB pages holding %d bytes", got, 768*129*2)
	}
}

// TestHostileAttributesAreRefusedNotTrusted: attributes of the wrong types, indices past the
// names, layouts that do not fit the program are errors, never a panic or a binding.
func TestHostileAttributesAreRefusedNotTrusted(t *testing.T) {
	for name, edit := range map[string]func(a map[string]any){
		"names that are numbers": func(a map[string]any) {
			a["ANEFModelDescription"].(map[string]any)["kANEFModelInputSymbolsArrayKey"] = []any{1.0, 2.0}
		},
		"an index past the names": func(a map[string]any) {
			a["ANEFModelDescription"].(map[string]any)["ANEFModelProcedures"] = []any{map[string]any{"ANEFModelProcedureID": 0.0,
				"ANEFModelInputSymbolIndexArray": []any{0.0, 7.0}, "ANEFModelOutputSymbolIndexArray": []any{0.0}}}
		},
		"a negative stride": func(a map[string]any) {
			a["NetworkStatusList"].([]any)[0].(map[string]any)["LiveInputList"].([]any)[1].(map[string]any)["PlaneStride"] = -128.0
		},
		"a fractional width": func(a map[string]any) {
			a["NetworkStatusList"].([]any)[0].(map[string]any)["LiveInputList"].([]any)[1].(map[string]any)["Width"] = 63.5
		},
		"a description that is a list": func(a map[string]any) { a["ANEFModelDescription"] = []any{} },
		"the same input twice": func(a map[string]any) {
			a["ANEFModelDescription"].(map[string]any)["kANEFModelInputSymbolsArrayKey"] = []any{"x", "x"}
		},
	} {
		a := attributesLike("mask", "x")
		edit(a)
		attrs, err := ParseAttributes(a, layerProgram)
		if err == nil {
			_, err = attrs.Bind(layerProgram)
		}
		if err == nil {
			t.Errorf("%s: bound", name)
		}
	}
}
