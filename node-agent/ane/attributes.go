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
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/x448/float16"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// Attributes are a loaded program's inputs and outputs as the framework reports them in
// -[_ANEInMemoryModel modelAttributes] (jafreck/ironmill docs/design/ane/ane-runtime-behavior.md
// §7 shows the dictionary: ANEFModelDescription with kANEFModelInputSymbolsArrayKey,
// kANEFModelOutputSymbolsArrayKey and ANEFModelProcedures, and NetworkStatusList with each
// live input's and output's strides). The references disagree on how a request's surfaces
// map to a program's inputs (by declaration order, by name order), so the binding reads the
// symbols here and binds by name.
type Attributes struct {
	Inputs, Outputs []Symbol
}

// Symbol is one input or output as the device sees it.
type Symbol struct {
	Name string
	// Index is the symbol's index: what a request's inputIndices or outputIndices name.
	Index  int
	Layout Layout
}

// Layout is how a [1, Channels, Height, Width] fp16 tensor lies in its IOSurface: channel c,
// row h, column w at c*PlaneStride + h*RowStride + 2w bytes.
type Layout struct {
	Channels, Height, Width int
	RowStride, PlaneStride  int
	// Type is the element type the framework names ("Float16").
	Type string
	// Reported: the framework gave this layout (NetworkStatusList); otherwise it is the dense
	// layout of the program's declared shape.
	Reported bool
}

// dense is the layout of a [1, c, 1, w] fp16 tensor with nothing between channels.
func dense(c, w int) Layout {
	return Layout{Channels: c, Height: 1, Width: w, RowStride: 2 * w, PlaneStride: 2 * w, Type: "Float16"}
}

// Bytes is how many bytes the tensor spans in its surface.
func (l Layout) Bytes() int {
	return (l.Channels-1)*l.PlaneStride + (l.Height-1)*l.RowStride + 2*l.Width
}

// Pack writes values ([Channels][Width], channel-major) into buf as fp16 at the layout's
// strides.
func (l Layout) Pack(buf []byte, values []float32) error {
	if len(values) != l.Channels*l.Width || l.Height != 1 || len(buf) < l.Bytes() {
		return fmt.Errorf("%d values into a %dx%dx%d layout over %d bytes", len(values), l.Channels, l.Height, l.Width, len(buf))
	}
	for c := range l.Channels {
		row := buf[c*l.PlaneStride:]
		for w, v := range values[c*l.Width : (c+1)*l.Width] {
			binary.LittleEndian.PutUint16(row[2*w:], float16.Fromfloat32(v).Bits())
		}
	}
	return nil
}

// Unpack reads values ([Channels][Width]) from buf at the layout's strides.
func (l Layout) Unpack(buf []byte, values []float32) error {
	if len(values) != l.Channels*l.Width || l.Height != 1 || len(buf) < l.Bytes() {
		return fmt.Errorf("%d values from a %dx%dx%d layout over %d bytes", len(values), l.Channels, l.Height, l.Width, len(buf))
	}
	for c := range l.Channels {
		row := buf[c*l.PlaneStride:]
		for w := range l.Width {
			values[c*l.Width+w] = float16.Frombits(binary.LittleEndian.Uint16(row[2*w:])).Float32()
		}
	}
	return nil
}

// MinSurfaceBytes is the smallest IOSurface the device evaluates with: smaller ones are
// reported to fail with status 0x1d (jafreck/ironmill docs/design/ane/ane-constraints.md,
// "IOSurface Constraints"; crates/ironmill-iosurface/src/surface.rs ANE_MIN_SURFACE_BYTES).
const MinSurfaceBytes = 16 << 10

// SurfaceBytes is the allocation for every surface of one side (inputs, or outputs) of a
// request: the largest tensor's bytes rounded up to whole 16 KiB, at least 16 KiB, the same
// for all of them (ironmill's uniform_alloc_size: "ANE requires all input tensors in one
// eval to share the same allocation size"; maderix/h3.c-ane h3_ane_bridge.m rounds to 16 KiB).
// The surface's width and bytes per row are this allocation too, as every reference sets
// them.
func SurfaceBytes(layouts []Layout) int {
	n := MinSurfaceBytes
	for _, l := range layouts {
		n = max(n, l.Bytes())
	}
	return (n + MinSurfaceBytes - 1) &^ (MinSurfaceBytes - 1)
}

// BindingError is a program whose inputs or output the framework's symbols do not name.
type BindingError struct {
	// Name is the program's port no symbol matches ("" when the counts differ).
	Name    string
	Symbols []string
	Detail  string
}

func (e *BindingError) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("the loaded program has no symbol for %s (its symbols are %v): %s", e.Name, e.Symbols, e.Detail)
	}
	return fmt.Sprintf("the loaded program's symbols %v do not match the program: %s", e.Symbols, e.Detail)
}

// Binding is where each of a program's inputs, and its output, goes on the device.
type Binding struct {
	// Inputs holds, for each of the device's input symbols in order, the program's input it
	// takes and the symbol.
	Inputs []Bound
	Output Bound
}

// Bound is one program port bound to one device symbol.
type Bound struct {
	Port   mil.Port
	Symbol Symbol
}

// Bind matches the program's inputs and output to the device's symbols by name. An output
// symbol may carry the framework's "@output" suffix (ane-runtime-behavior.md §7). Every input
// symbol must take one of the program's inputs and every input must be taken; a reported
// layout must be the port's shape.
func (a Attributes) Bind(p mil.Program) (Binding, error) {
	var b Binding
	names := func(ss []Symbol) []string {
		out := make([]string, len(ss))
		for i, s := range ss {
			out[i] = s.Name
		}
		return out
	}
	if len(a.Inputs) != len(p.Inputs) {
		return b, &BindingError{Symbols: names(a.Inputs), Detail: fmt.Sprintf("%d input symbols for %d inputs", len(a.Inputs), len(p.Inputs))}
	}
	for _, s := range a.Inputs {
		port, ok := p.Input(symbolName(s.Name))
		if !ok {
			return b, &BindingError{Symbols: names(a.Inputs), Detail: fmt.Sprintf("input symbol %q is none of the program's inputs", s.Name)}
		}
		for _, done := range b.Inputs {
			if done.Port.Name == port.Name {
				return b, &BindingError{Name: port.Name, Symbols: names(a.Inputs), Detail: "two symbols name it"}
			}
		}
		if err := checkLayout(s, port); err != nil {
			return b, err
		}
		b.Inputs = append(b.Inputs, Bound{Port: port, Symbol: s})
	}
	found := false
	for _, s := range a.Outputs {
		if symbolName(s.Name) == p.Output.Name {
			if found {
				return b, &BindingError{Name: p.Output.Name, Symbols: names(a.Outputs), Detail: "two output symbols name it"}
			}
			if err := checkLayout(s, p.Output); err != nil {
				return b, err
			}
			b.Output, found = Bound{Port: p.Output, Symbol: s}, true
		}
	}
	if !found {
		return b, &BindingError{Name: p.Output.Name, Symbols: names(a.Outputs), Detail: "the output is unnamed"}
	}
	return b, nil
}

// symbolName is a symbol's name without the framework's "@..." suffix.
func symbolName(s string) string {
	name, _, _ := strings.Cut(s, "@")
	return name
}

func checkLayout(s Symbol, p mil.Port) error {
	l := s.Layout
	if !l.Reported {
		return nil
	}
	if l.Channels != p.Channels || l.Width != p.Seq || l.Height != 1 || l.Type != "" && l.Type != "Float16" ||
		l.PlaneStride < 2*l.Width || l.RowStride < 2*l.Width {
		return &BindingError{Name: p.Name, Symbols: []string{s.Name},
			Detail: fmt.Sprintf("the framework lays it out as %d channels of %dx%d %s (row stride %d, plane stride %d); the program's is [1, %d, 1, %d] fp16",
				l.Channels, l.Height, l.Width, l.Type, l.RowStride, l.PlaneStride, p.Channels, p.Seq)}
	}
	return nil
}

// ParseAttributes reads the modelAttributes dictionary, converted to Go values (dictionaries
// to map[string]any, arrays to []any, numbers to float64, strings to string). A program's
// symbols come from ANEFModelDescription: the names in kANEFModelInputSymbolsArrayKey and
// kANEFModelOutputSymbolsArrayKey, in symbol-index order, and, when given, the indices of
// procedure 0 in ANEFModelProcedures. Layouts come from NetworkStatusList's LiveInputList and
// LiveOutputList where present; a symbol without one gets the dense layout of ports, the
// program's declared [1, C, 1, S] shapes by name.
func ParseAttributes(m map[string]any, p mil.Program) (Attributes, error) {
	var a Attributes
	desc, ok := m["ANEFModelDescription"].(map[string]any)
	if !ok {
		return a, fmt.Errorf("modelAttributes has no ANEFModelDescription (keys %v)", keys(m))
	}
	inNames, err := stringList(desc, "kANEFModelInputSymbolsArrayKey")
	if err != nil {
		return a, err
	}
	outNames, err := stringList(desc, "kANEFModelOutputSymbolsArrayKey")
	if err != nil {
		return a, err
	}
	inIdx, outIdx := indices(len(inNames)), indices(len(outNames))
	if procs, ok := desc["ANEFModelProcedures"].([]any); ok && len(procs) > 0 {
		for _, pr := range procs {
			proc, ok := pr.(map[string]any)
			if id, _ := number(proc["ANEFModelProcedureID"]); !ok || id != 0 {
				continue
			}
			if in, err := intList(proc, "ANEFModelInputSymbolIndexArray"); err == nil {
				inIdx = in
			}
			if out, err := intList(proc, "ANEFModelOutputSymbolIndexArray"); err == nil {
				outIdx = out
			}
		}
	}
	live := func(key string) []any {
		switch s := m["NetworkStatusList"].(type) {
		case map[string]any:
			l, _ := s[key].([]any)
			return l
		case []any:
			if len(s) > 0 {
				first, _ := s[0].(map[string]any)
				l, _ := first[key].([]any)
				return l
			}
		}
		return nil
	}
	port := func(name string) mil.Port {
		if name := symbolName(name); name == p.Output.Name {
			return p.Output
		}
		in, _ := p.Input(symbolName(name))
		return in
	}
	symbols := func(names []string, idx []int, layouts []any) ([]Symbol, error) {
		var out []Symbol
		for pos, i := range idx {
			if i < 0 || i >= len(names) {
				return nil, fmt.Errorf("modelAttributes names symbol %d of %d", i, len(names))
			}
			pt := port(names[i])
			s := Symbol{Name: names[i], Index: i, Layout: dense(pt.Channels, pt.Seq)}
			if l, ok, err := layoutFor(layouts, names[i], pos); err != nil {
				return nil, err
			} else if ok {
				s.Layout = l
			}
			out = append(out, s)
		}
		return out, nil
	}
	if a.Inputs, err = symbols(inNames, inIdx, live("LiveInputList")); err != nil {
		return a, err
	}
	if a.Outputs, err = symbols(outNames, outIdx, live("LiveOutputList")); err != nil {
		return a, err
	}
	return a, nil
}

// layoutFor finds a symbol's entry in a live list: by its Name when entries carry one, else
// the entry at the symbol's position. An entry that is there but not a layout is an error:
// the binding never guesses a layout the framework reported differently.
func layoutFor(list []any, name string, pos int) (Layout, bool, error) {
	var entry map[string]any
	for _, e := range list {
		if d, ok := e.(map[string]any); ok {
			if n, _ := d["Name"].(string); n != "" && symbolName(n) == symbolName(name) {
				entry = d
			}
		}
	}
	if entry == nil && pos < len(list) {
		if d, ok := list[pos].(map[string]any); ok {
			if n, _ := d["Name"].(string); n == "" {
				entry = d
			}
		}
	}
	if entry == nil {
		return Layout{}, false, nil
	}
	l := Layout{Reported: true}
	for key, field := range map[string]*int{"Channels": &l.Channels, "Height": &l.Height, "Width": &l.Width, "RowStride": &l.RowStride, "PlaneStride": &l.PlaneStride} {
		var ok bool
		if *field, ok = number(entry[key]); !ok {
			return Layout{}, false, fmt.Errorf("symbol %s's layout has %s %v", name, key, entry[key])
		}
	}
	l.Type, _ = entry["Type"].(string)
	return l, true, nil
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

func indices(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func stringList(m map[string]any, key string) ([]string, error) {
	l, ok := m[key].([]any)
	if !ok {
		return nil, fmt.Errorf("modelAttributes has no %s", key)
	}
	out := make([]string, len(l))
	for i, v := range l {
		if out[i], ok = v.(string); !ok {
			return nil, fmt.Errorf("%s[%d] is %T, not a name", key, i, v)
		}
	}
	return out, nil
}

func intList(m map[string]any, key string) ([]int, error) {
	l, ok := m[key].([]any)
	if !ok {
		return nil, fmt.Errorf("no %s", key)
	}
	out := make([]int, len(l))
	for i, v := range l {
		if out[i], ok = number(v); !ok {
			return nil, fmt.Errorf("%s[%d] is %v", key, i, v)
		}
	}
	return out, nil
}

// number reads an integer from a converted NSNumber (or its text).
func number(v any) (int, bool) {
	switch n := v.(type) {
	case float64:
		if n == math.Trunc(n) && math.Abs(n) < 1<<53 {
			return int(n), true
		}
	case int:
		return n, true
	case int64:
		return int(n), true
	case string:
		i, err := strconv.Atoi(n)
		return i, err == nil
	}
	return 0, false
}
