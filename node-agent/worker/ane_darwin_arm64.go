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
	"errors"
	"fmt"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/ane/accelerate"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// NewANE returns the Neural Engine backend: the private framework loaded and every class and
// selector it calls probed first. It never falls back to anything else.
func NewANE() (Backend, error) {
	r, err := ane.Open()
	if err != nil {
		return nil, err
	}
	blas, err := accelerate.Open()
	if err != nil {
		return nil, fmt.Errorf("the placement probe's CPU side: %w", err)
	}
	return &ANE{Device: device{r: r}, Clock: clock.RealClock{}, CPU: accelerateCPU(blas)}, nil
}

// accelerateCPU runs a layer's matrix work through Accelerate's cblas_sgemm.
func accelerateCPU(blas *accelerate.BLAS) CPUPath {
	return func(ly *aneartifact.Layer, _, _ []float32) (func() error, error) {
		return blas.Prepare(ly.Graph.Matmuls()).Run, nil
	}
}

// device is the Neural Engine through package ane.
type device struct{ r *ane.Runtime }

func (d device) Program(p mil.Program) (DeviceProgram, error) {
	m, err := d.r.NewModel(p)
	if err != nil {
		return nil, deviceErr(err)
	}
	return &program{m: m}, nil
}

// TempSpace is the free space where the compiler reads its sources: Foundation's per-user
// temporary folder, not $TMPDIR.
func (d device) TempSpace() (int64, error) { return d.r.Sources().Free() }

// program is one layer's in-memory model and, once it is loaded and first evaluated, its
// IOSurface evaluator.
type program struct {
	m  *ane.Model
	ev *ane.Evaluator
}

func (p *program) Identifier() string { return p.m.Identifier() }

func (p *program) Cached() (bool, error) {
	ok, err := p.m.Cached()
	return ok, deviceErr(err)
}

func (p *program) Compile() error { return deviceErr(p.m.Compile()) }
func (p *program) Load() error    { return deviceErr(p.m.Load()) }

func (p *program) Attributes() (ane.Attributes, error) {
	a, err := p.m.Attributes()
	return a, deviceErr(err)
}

// Eval binds the program to its symbols once (the backend has checked the binding already)
// and evaluates with inputs in the symbols' order.
func (p *program) Eval(inputs [][]float32, out []float32) error {
	if p.ev == nil {
		a, err := p.m.Attributes()
		if err != nil {
			return deviceErr(err)
		}
		b, err := a.Bind(p.m.Program())
		if err != nil {
			return err
		}
		if p.ev, err = p.m.NewEvaluator(b); err != nil {
			return deviceErr(err)
		}
	}
	return deviceErr(p.ev.Eval(inputs, out))
}

func (p *program) Unload() error {
	if p.ev != nil {
		p.ev.Close()
		p.ev = nil
	}
	return deviceErr(p.m.Unload())
}

func (p *program) Close() { p.m.Close() }

// deviceErr maps package ane's errors to the backend's: a timeout's outcome is unknown, and a
// load refused for resources is the device being full.
func deviceErr(err error) error {
	var ce *ane.CallError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ane.ErrTimeout):
		return fmt.Errorf("%w: %v", ErrDeviceTimeout, err)
	case errors.As(err, &ce) && ce.ResourcesExhausted:
		return fmt.Errorf("%w: %v", ErrDeviceResources, err)
	}
	return err
}
