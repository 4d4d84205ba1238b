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

package worker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
)

// Device is the Neural Engine as the ane backend drives it: package ane on macOS, a fake in
// tests. Everything above it (which layers to compile, the compile limit, the temp-space
// check, evaluation through the layers, the probe) is here and runs everywhere.
type Device interface {
	// Program builds the in-memory model of one layer's program (nothing is written or
	// compiled yet).
	Program(p mil.Program) (DeviceProgram, error)
	// TempSpace is the free space where the compiler writes its sources.
	TempSpace() (int64, error)
}

// DeviceProgram is one layer's program on the device.
type DeviceProgram interface {
	// Identifier is aned's content identifier for the program.
	Identifier() string
	// Cached reports whether aned holds the program compiled.
	Cached() (bool, error)
	// Compile writes the program's sources to the temporary folder and compiles it.
	Compile() error
	// Load makes the compiled program resident.
	Load() error
	// Attributes are the resident program's input and output symbols as the device reports
	// them. The backend binds the program's inputs to them by name: the device is reported
	// to order a program's inputs by name, not as the program declares them.
	Attributes() (ane.Attributes, error)
	// Eval runs the resident program with inputs[i] on the i-th input symbol of Attributes,
	// writing its output to out.
	Eval(inputs [][]float32, out []float32) error
	Unload() error
	Close()
}

// ErrDeviceResources is a load the device refused for resources; ErrDeviceTimeout a call that
// did not return in time (its outcome unknown). Devices wrap them.
var (
	ErrDeviceResources = errors.New("the Neural Engine cannot hold the program")
	ErrDeviceTimeout   = errors.New("the Neural Engine call did not return in time")
)

// CodeRecycle is the admission refusal by which a worker asks to be replaced.
const CodeRecycle = protocol.CodeRecycle

// The ane backend's limits.
const (
	// DefaultCompileLimit is the compiles one worker process makes: later compiles are
	// reported to fail silently after about 119, so a worker stops well before.
	DefaultCompileLimit = 100
	// TempSpaceMargin is kept free beyond a layer's sources before it compiles.
	TempSpaceMargin = 512 << 20
)

// ANE is the worker backend on the Neural Engine: each rung is the model's layers, each a
// program loaded from aned's cache where it is held and compiled otherwise; the token
// embedding and the pooling run on the CPU.
type ANE struct {
	Device Device
	Clock  clock.PassiveClock
	// CompileLimit caps this process's compiles (DefaultCompileLimit if zero).
	CompileLimit int
	// CPU is the probe's CPU side (GoReference if nil). On a Mac it is the layers' matrix
	// work through Accelerate, a CPU path a user could actually run, so the probe's ratio
	// means what the seed's does (its CPU side is a CPU-only Core ML instance).
	CPU CPUPath

	mu       sync.Mutex
	model    *aneartifact.Model
	rungs    []uint32
	resident map[uint32]*aneRung
	compiles int
}

// aneRung is one resident rung: its layers in order.
type aneRung struct {
	layers []aneLayer
}

// aneLayer is one resident layer.
type aneLayer struct {
	prog DeviceProgram
	// order names the program input each of the device's input symbols takes.
	order []string
	// ref is the layer's CPU reference, kept for the layers the probe times (the first and the
	// last) only: a layer's reference holds its weights, and a rung holds every layer.
	ref *aneartifact.Layer
}

func (a *ANE) limit() int {
	if a.CompileLimit > 0 {
		return a.CompileLimit
	}
	return DefaultCompileLimit
}

// Load reads the verified artifact and checks, for each rung, whether aned holds its first and
// last layers (layers compile in order within an admission, so a cached last layer means the
// rung was compiled once). Nothing is written or compiled.
func (a *ANE) Load(ctx context.Context, l *pb.Load) ([]uint32, error) {
	if l.ArtifactDir == "" {
		return nil, &Error{Code: "invalid_model", Message: "the ane backend loads only from a verified artifact"}
	}
	m, err := aneartifact.Load(l.ArtifactDir)
	if err != nil {
		return nil, &Error{Code: "artifact_unreadable", Message: err.Error()}
	}
	if int(l.Layers) != m.Config.Layers || int(l.Dimensions) != m.Config.Hidden {
		m.Close()
		return nil, &Error{Code: "invalid_model", Message: fmt.Sprintf("the artifact has %d layers of %d dimensions; %d of %d were asked for",
			m.Config.Layers, m.Config.Hidden, l.Layers, l.Dimensions)}
	}
	for _, r := range l.Rungs {
		if !slices.Contains(m.Rungs(), int(r)) {
			m.Close()
			return nil, &Error{Code: "artifact_missing", Message: fmt.Sprintf("the artifact has no programs for rung %d", r)}
		}
	}
	cached := []uint32{}
	for _, r := range l.Rungs {
		hit := true
		for _, i := range []int{0, m.Config.Layers - 1} {
			ok, err := a.cached(m, i, int(r))
			if err != nil {
				m.Close()
				return nil, err
			}
			hit = hit && ok
		}
		if hit {
			cached = append(cached, r)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.model != nil {
		a.model.Close()
	}
	a.model, a.rungs, a.resident = m, slices.Clone(l.Rungs), map[uint32]*aneRung{}
	return cached, nil
}

func (a *ANE) cached(m *aneartifact.Model, layer, rung int) (bool, error) {
	ly, err := m.Layer(layer, rung)
	if err != nil {
		return false, &Error{Code: "artifact_unreadable", Message: err.Error()}
	}
	p, err := a.Device.Program(ly.Program)
	if err != nil {
		return false, deviceError(err)
	}
	defer p.Close()
	ok, err := p.Cached()
	if err != nil {
		return false, deviceError(err)
	}
	return ok, nil
}

// Admit loads every layer of rung: a layer aned holds loads without its sources being written
// or compiled (and is compiled once if that load fails); the others compile, each after a
// temp-space check. If the rung needs more compiles than this process may still make, the
// admission is refused with CodeRecycle before anything is compiled.
func (a *ANE) Admit(ctx context.Context, rung uint32) (adm Admission, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	start := a.Clock.Now()
	defer func() { adm.Took = a.Clock.Since(start) }()
	if a.model == nil {
		return adm, &Error{Code: "not_loaded", Message: "no model is loaded"}
	}
	if !slices.Contains(a.rungs, rung) {
		return adm, &Error{Code: "unsupported_shape", Message: fmt.Sprintf("rung %d is not in the ladder %v", rung, a.rungs)}
	}
	if r, ok := a.resident[rung]; ok {
		return Admission{Layers: len(r.layers), CacheHit: len(r.layers)}, nil
	}
	n := a.model.Config.Layers
	r := &aneRung{}
	fail := func(err error) (Admission, error) {
		for _, l := range r.layers {
			_ = l.prog.Unload()
			l.prog.Close()
		}
		return adm, err
	}
	// Build every layer's program and ask aned which it holds, so the compile budget is
	// checked before the first compile.
	var programs []DeviceProgram
	var held []bool
	var refs []*aneartifact.Layer
	closeRest := func(from int) {
		for _, p := range programs[from:] {
			p.Close()
		}
	}
	for i := range n {
		ly, err := a.model.Layer(i, int(rung))
		if err != nil {
			closeRest(0)
			return adm, &Error{Code: "artifact_unreadable", Message: err.Error()}
		}
		p, err := a.Device.Program(ly.Program)
		if err != nil {
			closeRest(0)
			return adm, deviceError(err)
		}
		ok, err := p.Cached()
		if err != nil {
			p.Close()
			closeRest(0)
			return adm, deviceError(err)
		}
		programs, held, refs = append(programs, p), append(held, ok), append(refs, ly)
	}
	need := 0
	for _, h := range held {
		if !h {
			need++
		}
	}
	switch {
	case need > a.limit():
		closeRest(0)
		return adm, &Error{Code: "compile_limit", Message: fmt.Sprintf("rung %d needs %d compiles; one worker makes at most %d", rung, need, a.limit())}
	case a.compiles+need > a.limit():
		closeRest(0)
		return adm, &Error{Code: CodeRecycle, Message: fmt.Sprintf("rung %d needs %d compiles and this worker has made %d of its %d: replace it", rung, need, a.compiles, a.limit())}
	}
	for i, p := range programs {
		if err := ctx.Err(); err != nil {
			closeRest(i)
			return fail(err)
		}
		layerStart := a.Clock.Now()
		compiled := false
		if !held[i] {
			if err := a.compile(p, refs[i].Program); err != nil {
				closeRest(i)
				return fail(err)
			}
			compiled = true
		}
		if err := p.Load(); err != nil {
			if compiled || errors.Is(err, ErrDeviceResources) || errors.Is(err, ErrDeviceTimeout) {
				closeRest(i)
				return fail(deviceError(err))
			}
			// aned held it but the load failed: compile once, then load. That compile counts
			// against the limit like any other (the budget checked above counted only the
			// programs not held).
			if a.compiles+1 > a.limit() {
				closeRest(i)
				return fail(&Error{Code: CodeRecycle, Message: fmt.Sprintf("rung %d: layer %d was held but did not load (%v), and this worker has made all %d of its compiles: replace it", rung, i, err, a.limit())})
			}
			if err := a.compile(p, refs[i].Program); err != nil {
				closeRest(i)
				return fail(err)
			}
			compiled = true
			if err := p.Load(); err != nil {
				closeRest(i)
				return fail(deviceError(err))
			}
		}
		order, err := bind(p, refs[i].Program)
		if err != nil {
			_ = p.Unload()
			closeRest(i)
			return fail(err)
		}
		l := aneLayer{prog: p, order: order}
		if i == 0 || i == n-1 {
			l.ref = refs[i]
		}
		r.layers = append(r.layers, l)
		adm.Layers++
		if compiled {
			adm.Compiled++
		} else {
			adm.CacheHit++
		}
		adm.LayerLoads = append(adm.LayerLoads, LayerLoad{Layer: i, Origin: originOf(!compiled), Took: a.Clock.Since(layerStart)})
		reportProgress(ctx, adm.Layers, n)
	}
	if err := a.checkGoldens(r, rung); err != nil {
		return fail(err)
	}
	a.resident[rung] = r
	return adm, nil
}

// The device's embeddings at admission must match the converter's goldens for the rung as the
// parity gate judged the fp16 programs: by cosine per golden and by the largest component
// difference. A device that computes something else (a program the compiler read otherwise, a
// binding that swapped an input) is refused before it serves.
const (
	GoldenMinCosine = 0.999
	GoldenMaxAbs    = 0.02
)

// checkGoldens runs the rung's goldens through its layers on the device; a mismatch is the
// typed refusal ane_golden_mismatch naming the rung.
func (a *ANE) checkGoldens(r *aneRung, rung uint32) error {
	for i, g := range a.model.Goldens(int(rung)) {
		got, err := a.forward(r, g.Tokens, int(rung))
		if err != nil {
			return err
		}
		cos, worst := compareEmbeddings(got, g.Output)
		if cos < GoldenMinCosine || worst > GoldenMaxAbs || len(got) != len(g.Output) {
			return &Error{Code: "ane_golden_mismatch", Message: fmt.Sprintf("rung %d: golden %d (%d tokens): the device's embedding is at cosine %.5f of the converter's, largest difference %.4f (at least %.3f and at most %.2f are needed)",
				rung, i, len(g.Tokens), cos, worst, GoldenMinCosine, GoldenMaxAbs)}
		}
	}
	return nil
}

// compareEmbeddings is the cosine between got and want and their largest difference; anything
// not a number makes both fail.
func compareEmbeddings(got, want []float32) (cos, worst float64) {
	if len(got) != len(want) {
		return 0, math.Inf(1)
	}
	var dot, gg, ww float64
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		if math.IsNaN(g) || math.IsInf(g, 0) {
			return 0, math.Inf(1)
		}
		worst = max(worst, math.Abs(g-w))
		dot, gg, ww = dot+g*w, gg+g*g, ww+w*w
	}
	if gg == 0 || ww == 0 {
		return 0, worst
	}
	return dot / math.Sqrt(gg*ww), worst
}

// bind matches a resident program's inputs to the symbols the device reports for it, by name,
// and returns the input each symbol takes; a program the device's symbols do not name is
// refused, never run with its inputs swapped.
func bind(p DeviceProgram, src mil.Program) ([]string, error) {
	attrs, err := p.Attributes()
	if err != nil {
		return nil, deviceError(err)
	}
	b, err := attrs.Bind(src)
	if err != nil {
		return nil, &Error{Code: "ane_binding_failed", Message: err.Error()}
	}
	order := make([]string, len(b.Inputs))
	for i, in := range b.Inputs {
		order[i] = in.Port.Name
	}
	return order, nil
}

// eval runs one resident layer on x and the key mask.
func (l aneLayer) eval(x, mask, out []float32) error {
	inputs := make([][]float32, len(l.order))
	for i, name := range l.order {
		switch name {
		case "x":
			inputs[i] = x
		case "mask":
			inputs[i] = mask
		default:
			return &Error{Code: "ane_binding_failed", Message: fmt.Sprintf("the program takes an input %q the layers do not have", name)}
		}
	}
	return l.prog.Eval(inputs, out)
}

// compile checks the temp space (only a layer that must compile writes sources) and compiles.
func (a *ANE) compile(p DeviceProgram, src mil.Program) error {
	need := int64(len(src.Text)+len(src.Weights)) + TempSpaceMargin
	free, err := a.Device.TempSpace()
	if err != nil {
		return deviceError(err)
	}
	if free < need {
		return &Error{Code: "ane_temp_space_low", Message: fmt.Sprintf("%d MiB free in the temporary folder; compiling needs %d MiB", free>>20, need>>20)}
	}
	a.compiles++
	if err := p.Compile(); err != nil {
		if errors.Is(err, ErrDeviceTimeout) {
			return err
		}
		// Compile failures are reported to be intermittent: the admission is refused and the
		// next request may admit the rung again.
		return &Error{Code: "compile_failed", Message: err.Error()}
	}
	return nil
}

// deviceError maps a device failure to the worker's refusal codes; a timeout is not a refusal
// but a fault (its outcome is unknown), so it is returned as it is.
func deviceError(err error) error {
	switch {
	case errors.Is(err, ErrDeviceTimeout):
		return err
	case errors.Is(err, ErrDeviceResources):
		return &Error{Code: "ane_resources_exhausted", Message: err.Error()}
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: "ane_failed", Message: err.Error()}
}

// Evict unloads a resident rung.
func (a *ANE) Evict(rung uint32) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.resident[rung]
	if !ok {
		return &Error{Code: "not_resident", Message: fmt.Sprintf("rung %d is not resident", rung)}
	}
	delete(a.resident, rung)
	var first error
	for _, l := range r.layers {
		if err := l.prog.Unload(); err != nil && first == nil {
			first = deviceError(err)
		}
		l.prog.Close()
	}
	return first
}

// Resident lists the resident rungs.
func (a *ANE) Resident() []uint32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.resident))
}

// Execute embeds each sequence on a resident rung: the lookup on the CPU, every layer on the
// device, the pooling on the CPU. A sequence longer than the rung is refused, never cut.
func (a *ANE) Execute(ctx context.Context, e *pb.Execute) (*pb.Reply, error) {
	if e.Task != "embed" {
		return nil, &Error{Code: protocol.CodeInvalidInput, Message: fmt.Sprintf("the catalog families embed; task %q has no program", e.Task)}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.resident[e.Rung]
	if !ok {
		return nil, &Error{Code: "not_resident", Message: fmt.Sprintf("rung %d is not resident", e.Rung)}
	}
	// Every sequence is checked before any runs, so a refused input ran nothing
	// (protocol.InputRefusal): the agent may send the others again without replaying them.
	for i, seq := range e.Sequences {
		if len(seq.TokenIds) == 0 || len(seq.TokenIds) > int(e.Rung) {
			return nil, &Error{Code: protocol.CodeUnsupportedShape, Message: fmt.Sprintf("sequence %d has %d tokens; rung %d takes 1 to %d", i, len(seq.TokenIds), e.Rung, e.Rung)}
		}
		if j := slices.IndexFunc(seq.TokenIds, func(id uint32) bool { return id >= uint32(a.model.Config.Vocab) }); j >= 0 {
			return nil, &Error{Code: protocol.CodeInvalidInput, Message: fmt.Sprintf("sequence %d: token id %d is outside the vocabulary of %d", i, seq.TokenIds[j], a.model.Config.Vocab)}
		}
	}
	reply := &pb.Reply{}
	for _, seq := range e.Sequences {
		out, err := a.forward(r, seq.TokenIds, int(e.Rung))
		if err != nil {
			return nil, err
		}
		reply.Vectors = append(reply.Vectors, &pb.Vector{Values: out})
	}
	return reply, nil
}

// forward runs one input through the rung's layers on the device.
func (a *ANE) forward(r *aneRung, ids []uint32, rung int) ([]float32, error) {
	toks := make([]int32, len(ids))
	for i, id := range ids {
		if id > math.MaxInt32 {
			return nil, &Error{Code: "invalid_input", Message: fmt.Sprintf("token id %d is outside the vocabulary", id)}
		}
		toks[i] = int32(id)
	}
	x, err := a.model.Embedder.Input(toks, rung)
	if err != nil {
		return nil, &Error{Code: "invalid_input", Message: err.Error()}
	}
	mask := family.KeyMask(len(toks), rung)
	out := make([]float32, len(x))
	for _, l := range r.layers {
		if err := l.eval(x, mask, out); err != nil {
			return nil, deviceError(err)
		}
		x, out = out, x
	}
	return family.Pool(a.model.Config, x, len(toks), rung), nil
}

// CPUPath is the CPU side of the placement probe: it readies one layer's work on the CPU for
// inputs x and mask and returns what runs it once.
type CPUPath func(ly *aneartifact.Layer, x, mask []float32) (func() error, error)

// GoReference is the CPU path of the Go CPU reference, the golden source: it evaluates the
// layer's graph.
func GoReference(ly *aneartifact.Layer, x, mask []float32) (func() error, error) {
	return func() error {
		_, err := ly.Graph.EvalMasked(x, mask, ly.Out)
		return err
	}, nil
}

// Probe times the fastest of 5 evaluations of the rung's first and last layers (each its own
// program) on the device, then the fastest of 5 of the same two layers on the CPU path,
// back to back, on a 16-token input. Two layers rather than the whole stack keep the CPU side
// to seconds at the larger rungs while still covering both ends of what was compiled.
func (a *ANE) Probe(ctx context.Context, rung uint32) (device, cpu time.Duration, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	r, ok := a.resident[rung]
	if !ok {
		return 0, 0, &Error{Code: "not_resident", Message: fmt.Sprintf("rung %d is not resident", rung)}
	}
	toks := make([]int32, min(int(rung), 16))
	for i := range toks {
		toks[i] = int32(i % a.model.Config.Vocab)
	}
	x, err := a.model.Embedder.Input(toks, int(rung))
	if err != nil {
		return 0, 0, err
	}
	mask := family.KeyMask(len(toks), int(rung))
	layers := []aneLayer{r.layers[0], r.layers[len(r.layers)-1]}
	cpuPath := a.CPU
	if cpuPath == nil {
		cpuPath = GoReference
	}
	runs := make([]func() error, len(layers))
	for i, l := range layers {
		if runs[i], err = cpuPath(l.ref, x, mask); err != nil {
			return 0, 0, &Error{Code: "probe_failed", Message: fmt.Sprintf("readying the CPU side of the probe: %v", err)}
		}
	}
	out := make([]float32, len(x))
	fastest := func(onDevice bool) (time.Duration, error) {
		best := time.Duration(math.MaxInt64)
		for range 5 {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			start := a.Clock.Now()
			for i, l := range layers {
				if onDevice {
					if err := l.eval(x, mask, out); err != nil {
						return 0, deviceError(err)
					}
				} else if err := runs[i](); err != nil {
					return 0, err
				}
			}
			best = min(best, max(a.Clock.Since(start), time.Nanosecond))
		}
		return best, nil
	}
	if device, err = fastest(true); err != nil {
		return 0, 0, err
	}
	if cpu, err = fastest(false); err != nil {
		return 0, 0, err
	}
	return device, cpu, nil
}
