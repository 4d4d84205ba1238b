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

package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/convert"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// fakeANE is a Neural Engine with an aned cache shared by every worker on the machine. It
// evaluates a program with the CPU reference of the layer it was emitted from.
type fakeANE struct {
	mu sync.Mutex
	// recordEvals records each program evaluation among the calls.
	recordEvals bool
	aned        map[string]bool // identifiers compiled
	calls       []string
	tempSpace   int64
	// failLoad makes the next load of a program fail: "resources" or "stale".
	failLoad map[string]string
	// failCompile makes the next compile of a program fail.
	failCompile map[string]bool
	// layers maps a program's digest to its CPU reference.
	layers map[string]*aneartifact.Layer
	// symbols orders a loaded program's input symbols: by name, as the device is reported to,
	// unless a test says otherwise.
	symbols func(inputs []string) []string
	// drift is added to every output value: a device that computes something else.
	drift float32
}

func newFakeANE() *fakeANE {
	return &fakeANE{aned: map[string]bool{}, tempSpace: 1 << 40, failLoad: map[string]string{}, failCompile: map[string]bool{},
		layers: map[string]*aneartifact.Layer{}, symbols: func(in []string) []string { return slices.Sorted(slices.Values(in)) }}
}

func (d *fakeANE) record(call string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, call)
}

func (d *fakeANE) take() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.calls
	d.calls = nil
	return out
}

func (d *fakeANE) Program(p mil.Program) (worker.DeviceProgram, error) {
	return &fakeProgram{d: d, src: p, id: p.Digest()[7:19]}, nil
}

func (d *fakeANE) TempSpace() (int64, error) {
	d.record("tempspace")
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tempSpace, nil
}

type fakeProgram struct {
	d      *fakeANE
	src    mil.Program
	id     string
	loaded bool
}

func (p *fakeProgram) Identifier() string { return p.id }

func (p *fakeProgram) Cached() (bool, error) {
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	return p.d.aned[p.id], nil
}

func (p *fakeProgram) Compile() error {
	p.d.record("write+compile " + p.id)
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	if p.d.failCompile[p.id] {
		delete(p.d.failCompile, p.id)
		return errors.New("ANECCompile() FAILED")
	}
	p.d.aned[p.id] = true
	return nil
}

func (p *fakeProgram) Load() error {
	p.d.record("load " + p.id)
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	switch p.d.failLoad[p.id] {
	case "resources":
		delete(p.d.failLoad, p.id)
		return fmt.Errorf("load: %w", worker.ErrDeviceResources)
	case "stale":
		delete(p.d.failLoad, p.id)
		return errors.New("the cached program does not load")
	}
	if !p.d.aned[p.id] {
		return errors.New("load before compile")
	}
	p.loaded = true
	return nil
}

// inputSymbols are the loaded program's input symbols, in the device's order.
func (p *fakeProgram) inputSymbols() []string {
	var names []string
	for _, in := range p.src.Inputs {
		names = append(names, in.Name)
	}
	p.d.mu.Lock()
	defer p.d.mu.Unlock()
	return p.d.symbols(names)
}

func (p *fakeProgram) Attributes() (ane.Attributes, error) {
	if !p.loaded {
		return ane.Attributes{}, errors.New("attributes of a program not loaded")
	}
	var a ane.Attributes
	for i, name := range p.inputSymbols() {
		a.Inputs = append(a.Inputs, ane.Symbol{Name: name, Index: i})
	}
	a.Outputs = []ane.Symbol{{Name: p.src.Output.Name + "@output"}}
	return a, nil
}

// Eval takes inputs[i] as the input symbol i names, as the device does.
func (p *fakeProgram) Eval(inputs [][]float32, out []float32) error {
	if p.d.recordEvals {
		p.d.record("eval " + p.id)
	}
	p.d.mu.Lock()
	ly := p.d.layers[p.src.Digest()]
	p.d.mu.Unlock()
	if !p.loaded || ly == nil {
		return errors.New("eval of a program not loaded")
	}
	named := map[string][]float32{}
	for i, name := range p.inputSymbols() {
		if i < len(inputs) {
			named[name] = inputs[i]
		}
	}
	y, err := ly.Graph.EvalMasked(named["x"], named["mask"], ly.Out)
	copy(out, y)
	p.d.mu.Lock()
	for i := range out {
		out[i] += p.d.drift
	}
	p.d.mu.Unlock()
	return err
}

func (p *fakeProgram) Unload() error { p.d.record("unload " + p.id); p.loaded = false; return nil }
func (p *fakeProgram) Close()        {}

// tinyArtifact converts the tiny Qwen3 model at rungs 64 and 128.
func tinyArtifact(t *testing.T) (string, *aneartifact.Model) {
	t.Helper()
	ck := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(ck, tinymodel.Qwen3(), 4, 1, tinymodel.Tokenizer); err != nil {
		t.Fatal(err)
	}
	c, err := convert.OpenCheckpoint(ck, convert.DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := filepath.Join(t.TempDir(), "tiny")
	if _, err := convert.Convert(dir, c, convert.Options{Model: "tiny", Revision: "r1", Rungs: []int{64, 128},
		Platform: artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}, Policy: convert.DefaultPolicy}); err != nil {
		t.Fatal(err)
	}
	m, err := aneartifact.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return dir, m
}

// layerIDs are the fake device's identifiers of the model's layers at rung.
func layerIDs(t *testing.T, d *fakeANE, m *aneartifact.Model, rung int) []string {
	t.Helper()
	var ids []string
	for i := range m.Config.Layers {
		ly, err := m.Layer(i, rung)
		if err != nil {
			t.Fatal(err)
		}
		d.mu.Lock()
		d.layers[ly.Program.Digest()] = ly
		d.mu.Unlock()
		ids = append(ids, ly.Program.Digest()[7:19])
	}
	return ids
}

func loadANE(t *testing.T, a *worker.ANE, dir string) []uint32 {
	t.Helper()
	cached, err := a.Load(context.Background(), &pb.Load{Identity: "tiny", Layers: 3, Dimensions: 32, Rungs: []uint32{64, 128}, ArtifactDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return cached
}

func TestACachedProgramIsLoadedWithoutWritingOrCompiling(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	ids := layerIDs(t, d, m, 64)
	for _, id := range ids {
		d.aned[id] = true // compiled by an earlier worker
	}
	d.tempSpace = 0 // and the disk is full: a cached layer never needs it
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}}
	if cached := loadANE(t, a, dir); !slices.Equal(cached, []uint32{64}) {
		t.Fatalf("LOADED reports %v cached, want [64]", cached)
	}
	d.take()
	adm, err := a.Admit(context.Background(), 64)
	if err != nil {
		t.Fatal(err)
	}
	if adm.Layers != 3 || adm.CacheHit != 3 || adm.Compiled != 0 {
		t.Fatalf("admission %+v, want 3 layers from the cache", adm)
	}
	want := []string{"load " + ids[0], "load " + ids[1], "load " + ids[2]}
	if calls := d.take(); !slices.Equal(calls, want) {
		t.Fatalf("device calls %v, want only loads %v: no sources written, nothing compiled, no temp-space check", calls, want)
	}
}

func TestAnUncachedRungCompilesEachLayerAfterATempSpaceCheck(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	ids := layerIDs(t, d, m, 128)
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}}
	if cached := loadANE(t, a, dir); len(cached) != 0 {
		t.Fatalf("cached %v on an empty aned", cached)
	}
	d.take()
	adm, err := a.Admit(context.Background(), 128)
	if err != nil || adm.Compiled != 3 || adm.CacheHit != 0 {
		t.Fatalf("admission %+v, %v", adm, err)
	}
	var want []string
	for _, id := range ids {
		want = append(want, "tempspace", "write+compile "+id, "load "+id)
	}
	if calls := d.take(); !slices.Equal(calls, want) {
		t.Fatalf("device calls %v, want %v", calls, want)
	}
	if err := a.Evict(128); err != nil {
		t.Fatal(err)
	}
	// With the disk full, an uncached rung is refused before it writes anything.
	d.tempSpace = 100 << 20
	if _, err := a.Admit(context.Background(), 64); !isCode(err, "ane_temp_space_low") {
		t.Fatalf("a full disk: %v", err)
	}
	if calls := d.take(); slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "write+compile") }) {
		t.Fatalf("sources were written on a full disk: %v", calls)
	}
	if r := a.Resident(); len(r) != 0 {
		t.Fatalf("resident %v after the refusal", r)
	}
}

func isCode(err error, code string) bool { return codeOf(err) == code }

func codeOf(err error) string {
	var e *worker.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func TestTheWorkerAsksToBeReplacedBeforeItsCompileLimit(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	layerIDs(t, d, m, 64)
	layerIDs(t, d, m, 128)
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}, CompileLimit: 4}
	loadANE(t, a, dir)
	if _, err := a.Admit(context.Background(), 64); err != nil {
		t.Fatal(err)
	}
	d.take()
	// Three more compiles would make six of four: the worker asks for its replacement first.
	if _, err := a.Admit(context.Background(), 128); !isCode(err, worker.CodeRecycle) {
		t.Fatalf("over the limit: %v, want %s", err, worker.CodeRecycle)
	}
	if calls := d.take(); slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "write+compile") }) {
		t.Fatalf("the worker compiled past its limit: %v", calls)
	}
	// The replacement starts with no compiles made and finds rung 64 in aned.
	b := &worker.ANE{Device: d, Clock: clock.RealClock{}, CompileLimit: 4}
	if cached := loadANE(t, b, dir); !slices.Equal(cached, []uint32{64}) {
		t.Fatalf("the replacement sees %v cached", cached)
	}
	if adm, err := b.Admit(context.Background(), 128); err != nil || adm.Compiled != 3 {
		t.Fatalf("the replacement's admission: %+v, %v", adm, err)
	}
	if adm, err := b.Admit(context.Background(), 64); err != nil || adm.CacheHit != 3 {
		t.Fatalf("the replacement's cached admission: %+v, %v", adm, err)
	}
	// A rung that needs more compiles than any worker makes is refused for good.
	c := &worker.ANE{Device: newFakeANE(), Clock: clock.RealClock{}, CompileLimit: 2}
	loadANE(t, c, dir)
	if _, err := c.Admit(context.Background(), 64); !isCode(err, "compile_limit") {
		t.Fatalf("a rung over any worker's limit: %v", err)
	}
}

func TestAHeldProgramThatFailsToLoadIsCompiledOnceAndAFullDeviceRefuses(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	ids := layerIDs(t, d, m, 64)
	for _, id := range ids {
		d.aned[id] = true
	}
	d.failLoad[ids[1]] = "stale"
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}}
	loadANE(t, a, dir)
	d.take()
	adm, err := a.Admit(context.Background(), 64)
	if err != nil || adm.CacheHit != 2 || adm.Compiled != 1 {
		t.Fatalf("admission %+v, %v", adm, err)
	}
	want := []string{"load " + ids[0], "load " + ids[1], "tempspace", "write+compile " + ids[1], "load " + ids[1], "load " + ids[2]}
	if calls := d.take(); !slices.Equal(calls, want) {
		t.Fatalf("device calls %v, want %v", calls, want)
	}
	_ = a.Evict(64)
	d.take()
	// A compile that fails refuses the admission by name, with nothing left loaded.
	delete(d.aned, ids[2])
	d.failCompile[ids[2]] = true
	if _, err := a.Admit(context.Background(), 64); !isCode(err, "compile_failed") {
		t.Fatalf("a failed compile: %v", err)
	}
	if r := a.Resident(); len(r) != 0 {
		t.Fatalf("resident %v after a failed compile", r)
	}
	d.take()
	d.aned[ids[2]] = true
	d.failLoad[ids[2]] = "resources"
	if _, err := a.Admit(context.Background(), 64); !isCode(err, "ane_resources_exhausted") {
		t.Fatalf("a full device: %v", err)
	}
	want = []string{"load " + ids[0], "load " + ids[1], "load " + ids[2], "unload " + ids[0], "unload " + ids[1]}
	if calls := d.take(); !slices.Equal(calls, want) {
		t.Fatalf("device calls %v, want %v: the layers loaded before the refusal are unloaded", calls, want)
	}
}

func TestTheDevicePathMatchesTheGoldensAndRefusesWhatItCannotRun(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	layerIDs(t, d, m, 64)
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}}
	loadANE(t, a, dir)
	if _, err := a.Admit(context.Background(), 64); err != nil {
		t.Fatal(err)
	}
	var goldens []aneartifact.Golden
	data, _ := os.ReadFile(filepath.Join(dir, aneartifact.GoldensFile))
	if err := json.Unmarshal(data, &goldens); err != nil {
		t.Fatal(err)
	}
	for _, g := range goldens {
		if g.Rung != 64 { // the gate's goldens at the other rungs are checked by the converter
			continue
		}
		reply, err := a.Execute(context.Background(), &pb.Execute{Task: "embed", Rung: 64, Sequences: []*pb.Sequence{{TokenIds: g.Tokens}}})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(reply.Vectors[0].Values, g.Output) {
			t.Fatalf("%d tokens: the device path differs from the golden", len(g.Tokens))
		}
	}
	long := make([]uint32, 65)
	if _, err := a.Execute(context.Background(), &pb.Execute{Task: "embed", Rung: 64, Sequences: []*pb.Sequence{{TokenIds: long}}}); !isCode(err, "unsupported_shape") {
		t.Fatalf("65 tokens on rung 64: %v", err)
	}
	if _, err := a.Execute(context.Background(), &pb.Execute{Task: "rerank", Rung: 64, Sequences: []*pb.Sequence{{TokenIds: []uint32{1}}}}); !isCode(err, "invalid_input") {
		t.Fatalf("rerank: %v", err)
	}
	if _, err := a.Execute(context.Background(), &pb.Execute{Task: "embed", Rung: 64, Sequences: []*pb.Sequence{{TokenIds: []uint32{999}}}}); !isCode(err, "invalid_input") {
		t.Fatalf("a token outside the vocabulary: %v", err)
	}
	// An input refused in an Execute of several sequences ran nothing: every sequence is checked
	// before the device runs any, so the agent may send the others again without replaying them.
	d.take()
	d.recordEvals = true
	good := goldens[0].Tokens
	for _, bad := range [][]uint32{{999}, long} {
		if _, err := a.Execute(context.Background(), &pb.Execute{Task: "embed", Rung: 64, Sequences: []*pb.Sequence{{TokenIds: good}, {TokenIds: bad}}}); err == nil || !protocol.InputRefusal(codeOf(err)) {
			t.Fatalf("a valid sequence, then %d tokens it cannot take: %v, want an input refusal", len(bad), err)
		}
		if calls := d.take(); len(calls) > 0 {
			t.Fatalf("device calls %v before the input was refused, want none", calls)
		}
	}
	d.recordEvals = false
	device, cpu, err := a.Probe(context.Background(), 64)
	if err != nil || device <= 0 || cpu <= 0 {
		t.Fatalf("probe: %v %v %v", device, cpu, err)
	}
}

func TestTheANEBackendLoadsOnlyAVerifiedArtifactOfItsShape(t *testing.T) {
	dir, _ := tinyArtifact(t)
	a := &worker.ANE{Device: newFakeANE(), Clock: clock.RealClock{}}
	for name, l := range map[string]*pb.Load{
		"no artifact":     {Layers: 3, Dimensions: 32, Rungs: []uint32{64}},
		"other layers":    {Layers: 4, Dimensions: 32, Rungs: []uint32{64}, ArtifactDir: dir},
		"a rung it lacks": {Layers: 3, Dimensions: 32, Rungs: []uint32{256}, ArtifactDir: dir},
		"not an artifact": {Layers: 3, Dimensions: 32, Rungs: []uint32{64}, ArtifactDir: t.TempDir()},
	} {
		if _, err := a.Load(context.Background(), l); err == nil {
			t.Errorf("%s: loaded", name)
		}
	}
}

// TestInputsAreBoundByTheNamesTheDeviceReports: whichever order the device lists a program's
// input symbols in, x and the key mask reach the symbols of their names and the embeddings
// match the goldens; a device whose symbols do not name the program's inputs refuses the
// admission instead of running with them swapped.
func TestInputsAreBoundByTheNamesTheDeviceReports(t *testing.T) {
	dir, m := tinyArtifact(t)
	var goldens []aneartifact.Golden
	data, _ := os.ReadFile(filepath.Join(dir, aneartifact.GoldensFile))
	if err := json.Unmarshal(data, &goldens); err != nil {
		t.Fatal(err)
	}
	for name, order := range map[string]func([]string) []string{
		"by name":            func(in []string) []string { return slices.Sorted(slices.Values(in)) },
		"by name, downwards": func(in []string) []string { s := slices.Sorted(slices.Values(in)); slices.Reverse(s); return s },
	} {
		t.Run(name, func(t *testing.T) {
			d := newFakeANE()
			d.symbols = order
			layerIDs(t, d, m, 64)
			a := &worker.ANE{Device: d, Clock: clock.RealClock{}}
			loadANE(t, a, dir)
			if _, err := a.Admit(context.Background(), 64); err != nil {
				t.Fatal(err)
			}
			for _, g := range goldens {
				if g.Rung != 64 {
					continue
				}
				reply, err := a.Execute(context.Background(), &pb.Execute{Task: "embed", Rung: 64, Sequences: []*pb.Sequence{{TokenIds: g.Tokens}}})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(reply.Vectors[0].Values, g.Output) {
					t.Fatalf("%d tokens: the device path differs from the golden", len(g.Tokens))
				}
			}
		})
	}
	d := newFakeANE()
	d.symbols = func(in []string) []string { return []string{"x", "attention_mask"} }
	ids := layerIDs(t, d, m, 64)
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}}
	loadANE(t, a, dir)
	d.take()
	if _, err := a.Admit(context.Background(), 64); !isCode(err, "ane_binding_failed") {
		t.Fatalf("symbols that do not name the inputs: %v", err)
	}
	if r := a.Resident(); len(r) != 0 {
		t.Fatalf("resident %v after the refusal", r)
	}
	if calls := d.take(); !slices.Contains(calls, "unload "+ids[0]) {
		t.Fatalf("the loaded layer was not unloaded: %v", calls)
	}
}

// TestTheProbeTimesTheCPUPathItIsGiven: the probe readies its CPU side for the rung's first
// and last layers and times that path, not the Go reference, when one is given; a path that
// cannot be readied fails the probe by name.
func TestTheProbeTimesTheCPUPathItIsGiven(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	ids := layerIDs(t, d, m, 64)
	var readied []string
	runs := 0
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}, CPU: func(ly *aneartifact.Layer, x, mask []float32) (func() error, error) {
		readied = append(readied, ly.Program.Digest()[7:19])
		if len(x) != 32*64 || len(mask) != 64 {
			return nil, fmt.Errorf("inputs of %d and %d values", len(x), len(mask))
		}
		return func() error { runs++; return nil }, nil
	}}
	loadANE(t, a, dir)
	if _, err := a.Admit(context.Background(), 64); err != nil {
		t.Fatal(err)
	}
	device, cpu, err := a.Probe(context.Background(), 64)
	if err != nil || device <= 0 || cpu <= 0 {
		t.Fatalf("probe: %v %v %v", device, cpu, err)
	}
	if !slices.Equal(readied, []string{ids[0], ids[2]}) || runs != 10 {
		t.Fatalf("the CPU path was readied for %v and run %d times; want the first and last layers, 5 runs each", readied, runs)
	}
	a.CPU = func(*aneartifact.Layer, []float32, []float32) (func() error, error) {
		return nil, errors.New("no BLAS")
	}
	if _, _, err := a.Probe(context.Background(), 64); !isCode(err, "probe_failed") {
		t.Fatalf("a CPU path that cannot be readied: %v", err)
	}
}

// TestACompileAfterAFailedLoadOfAHeldProgramStaysUnderTheCompileLimit: a held program whose
// load fails is compiled once, and that compile counts against the limit like any other: at
// the limit the worker asks to be replaced instead of compiling.
func TestACompileAfterAFailedLoadOfAHeldProgramStaysUnderTheCompileLimit(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	ids64 := layerIDs(t, d, m, 64)
	layerIDs(t, d, m, 128)
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}, CompileLimit: 3}
	loadANE(t, a, dir)
	if _, err := a.Admit(context.Background(), 128); err != nil { // three compiles: the limit
		t.Fatal(err)
	}
	for _, id := range ids64 {
		d.aned[id] = true // held, so the rung needs no compile
	}
	d.failLoad[ids64[1]] = "stale"
	d.take()
	if _, err := a.Admit(context.Background(), 64); !isCode(err, worker.CodeRecycle) {
		t.Fatalf("a fourth compile at a limit of three: %v, want %s", err, worker.CodeRecycle)
	}
	if calls := d.take(); slices.ContainsFunc(calls, func(c string) bool { return strings.HasPrefix(c, "write+compile") }) {
		t.Fatalf("the worker compiled past its limit: %v", calls)
	}
	if r := a.Resident(); !slices.Equal(r, []uint32{128}) {
		t.Fatalf("resident %v, want only 128", r)
	}
}

// TestADeviceThatDoesNotReproduceTheGoldensIsRefusedAtAdmission: the rung's goldens run on the
// device as it is admitted; a device whose output drifts is refused with a code naming the
// rung, and every layer it loaded is unloaded.
func TestADeviceThatDoesNotReproduceTheGoldensIsRefusedAtAdmission(t *testing.T) {
	dir, m := tinyArtifact(t)
	d := newFakeANE()
	ids := layerIDs(t, d, m, 64)
	d.drift = 0.05
	a := &worker.ANE{Device: d, Clock: clock.RealClock{}}
	loadANE(t, a, dir)
	d.take()
	_, err := a.Admit(context.Background(), 64)
	if !isCode(err, "ane_golden_mismatch") || !strings.Contains(err.Error(), "rung 64") {
		t.Fatalf("a drifting device: %v, want ane_golden_mismatch naming rung 64", err)
	}
	if r := a.Resident(); len(r) != 0 {
		t.Fatalf("resident %v after the refusal", r)
	}
	if calls := d.take(); !slices.Contains(calls, "unload "+ids[2]) {
		t.Fatalf("the loaded layers were not unloaded: %v", calls)
	}
	d.drift = 0
	if _, err := a.Admit(context.Background(), 64); err != nil {
		t.Fatalf("a faithful device: %v", err)
	}
}
