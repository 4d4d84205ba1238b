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

package main

import (
	"fmt"
	"math"
	"time"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
)

// weights adapts the tiny model's tensors to family.Weights.
type weights map[string][]float32

func (w weights) Tensor(name string, shape ...int) ([]float32, error) {
	v, ok := w[name]
	if !ok {
		return nil, fmt.Errorf("no tensor %s", name)
	}
	return v, nil
}

func run() error {
	r, err := ane.Open()
	if err != nil {
		return err
	}
	c := tinymodel.Qwen3()
	w := weights{}
	for name, t := range tinymodel.Weights(c, 1, 1) {
		w[name] = t.Values
	}
	const seq = 64
	g, y, err := family.Layer(c, 0, seq, w)
	if err != nil {
		return err
	}
	p, err := g.Program(y)
	if err != nil {
		return err
	}
	fmt.Printf("program: %d bytes of MIL, %d bytes of weights, digest %s\n", len(p.Text), len(p.Weights), p.Digest())

	m, err := r.NewModel(p)
	if err != nil {
		return err
	}
	defer m.Close()
	cached, err := m.Cached()
	if err != nil {
		return err
	}
	fmt.Printf("identifier %s, held by aned before this run: %t\n", m.Identifier(), cached)
	if !cached {
		start := time.Now()
		if err := m.Compile(); err != nil {
			return err
		}
		fmt.Printf("compile: %v\n", time.Since(start))
	}
	start := time.Now()
	if err := m.Load(); err != nil {
		return err
	}
	fmt.Printf("load: %v\n", time.Since(start))

	x := make([]float32, c.Hidden*seq)
	for i := range x {
		x[i] = float32(math.Sin(float64(i))) / 2
	}
	mask := family.KeyMask(40, seq)
	want, err := g.EvalMasked(x, mask, y)
	if err != nil {
		return err
	}
	attrs, err := m.Attributes()
	if err != nil {
		return err
	}
	b, err := attrs.Bind(p)
	if err != nil {
		return err
	}
	ev, err := m.NewEvaluator(b)
	if err != nil {
		return err
	}
	defer ev.Close()
	var inputs [][]float32
	for _, in := range b.Inputs {
		inputs = append(inputs, map[string][]float32{"x": x, "mask": mask}[in.Port.Name])
	}
	got := make([]float32, len(want))
	device, cpu := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	for range 5 {
		start := time.Now()
		if err := ev.Eval(inputs, got); err != nil {
			return err
		}
		device = min(device, time.Since(start))
		start = time.Now()
		if _, err := g.EvalMasked(x, mask, y); err != nil {
			return err
		}
		cpu = min(cpu, time.Since(start))
	}
	var worst float64
	for i := range got {
		worst = max(worst, math.Abs(float64(got[i]-want[i])))
	}
	fmt.Printf("evaluate: fastest of 5 on the device %v, on the CPU reference %v (ratio %.2f); largest difference %.5f\n",
		device, cpu, float64(device)/float64(cpu), worst)
	if err := m.Unload(); err != nil {
		return err
	}

	again, err := r.NewModel(p)
	if err != nil {
		return err
	}
	defer again.Close()
	hit, err := again.Cached()
	if err != nil {
		return err
	}
	if !hit || again.Identifier() != m.Identifier() {
		return fmt.Errorf("a second build of the same program: identifier %s, held by aned %t; want %s, held", again.Identifier(), hit, m.Identifier())
	}
	start = time.Now()
	if err := again.Load(); err != nil {
		return err
	}
	fmt.Printf("second build: held by aned, loaded without compiling in %v\n", time.Since(start))
	if err := again.Unload(); err != nil {
		return err
	}
	if worst > 0.05 {
		return fmt.Errorf("the device differs from the CPU reference by %.4f", worst)
	}
	fmt.Println("ane-smoke: passed")
	return nil
}
