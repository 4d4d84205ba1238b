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
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/ane/accelerate"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// ladder is one run's state.
type ladder struct {
	o       options
	r       *ane.Runtime
	blas    *accelerate.BLAS
	blasErr error
	budget  *budget
	// ids are the content identifiers of the programs this run loaded, by name: stage 6's
	// second process must find the same ones in aned's cache.
	ids map[string]string
	// save writes the report (after every check).
	save func()
}

func run(o options) (bool, error) {
	if o.cacheCheck {
		ane.Trace = announce(os.Stderr)
		return cacheCheck(o)
	}
	if o.fillDevice {
		ane.Trace = announce(os.Stderr)
		return fillDevice(o)
	}
	if !o.child {
		return superviseLadder(o)
	}
	ane.Trace = announce(os.Stderr)
	rep := &Report{Schema: ReportSchema, Started: time.Now(), LogCommand: ane.LogCommand(time.Now())}
	save := func() {
		rep.Compiles = 0
		for _, s := range rep.Stages {
			rep.Compiles += s.Compiles
		}
		if err := writeReport(o.report, rep); err != nil {
			fmt.Fprintln(os.Stderr, "ane-smoke: writing the report:", err)
		}
	}
	r, openErr := ane.Open()
	rep.Environment = environment(r, o)
	l := &ladder{o: o, r: r, budget: &budget{limit: o.budget}, ids: map[string]string{}, save: save}
	if r != nil {
		r.SetTimeouts(o.timeouts)
	}
	l.blas, l.blasErr = accelerate.Open()
	runLadder(rep, []stage{
		{"environment", func(s *StageResult) error {
			summary, warnings, err := checkEnvironment(rep.Environment, openErr)
			s.Detail, rep.Environment.Warnings = summary, warnings
			return err
		}},
		{"one linear layer", func(s *StageResult) error { return l.programs(s, 2, false) }},
		{"attributes and a two-input program", func(s *StageResult) error { return l.programs(s, 3, false) }},
		{"each operation form alone", func(s *StageResult) error { return l.programs(s, 4, true) }},
		{"a full layer of each family at 128 and 512", func(s *StageResult) error { return l.programs(s, 5, false) }},
		{"a second process finds them in aned's cache or the kept folders", l.secondProcess},
		{"how many programs the device holds at once", l.capacity},
	}, time.Now, save)
	rep.Finished = true
	save()
	printTable(os.Stdout, rep)
	return rep.Passed, nil
}

// superviseLadder runs the ladder in a child process and makes sure its report is written
// however the child ends.
func superviseLadder(o options) (bool, error) {
	started := time.Now()
	// A report left by an earlier run must not be taken for this one's.
	if err := os.Remove(o.report); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	cmd := exec.Command(exe, childArgs()...)
	cmd.Stdout = os.Stdout
	rep, err := supervise(cmd, o.report, os.Stderr, started, ane.LogCommand(started))
	if err != nil {
		return false, err
	}
	if rep.Crash != nil {
		printTable(os.Stdout, rep)
	}
	fmt.Println("report:", o.report)
	return rep.Passed, nil
}

// programs compiles (unless aned holds it), loads, binds and evaluates every program of a
// stage against its CPU reference. all: run them all and fail after; otherwise stop at the
// first failure.
func (l *ladder) programs(s *StageResult, stageNo int, all bool) error {
	var first error
	for _, spec := range specsFor(l.o.checkpoint) {
		if spec.stage != stageNo {
			continue
		}
		before := l.budget.used
		c, raw, err := l.check(spec, stageNo == 5)
		s.Compiles += l.budget.used - before
		c.Error = describe(err)
		s.Checks = append(s.Checks, c)
		if stageNo == 3 && raw != nil {
			s.Attributes = raw
		}
		l.save()
		if err != nil {
			if first == nil {
				first = fmt.Errorf("%s: %w", spec.name, err)
			}
			if !all {
				return first
			}
		}
	}
	if first != nil {
		return first
	}
	last := s.Checks[len(s.Checks)-1]
	s.Detail = fmt.Sprintf("%d programs match the CPU reference (largest difference %.4f)", len(s.Checks), worstDiff(s.Checks))
	if stageNo == 2 || stageNo == 3 {
		s.Detail = fmt.Sprintf("%s; %s", s.Detail, last.Detail)
	}
	return nil
}

func worstDiff(cs []Check) float64 {
	var w float64
	for _, c := range cs {
		w = max(w, c.MaxDiff)
	}
	return w
}

// check runs one program through the whole path. probe: also time the Go reference and
// Accelerate, the probe's two CPU sides.
func (l *ladder) check(spec programSpec, probe bool) (Check, map[string]any, error) {
	c := Check{Name: spec.name, Status: Failed}
	p, err := spec.build()
	if err != nil {
		return c, nil, err
	}
	m, err := l.r.NewModel(p.prog)
	if err != nil {
		return c, nil, err
	}
	defer m.Close()
	c.Identifier = m.Identifier()
	if err := place(m, &c, l.budget, time.Now); err != nil {
		return c, nil, err
	}
	defer m.Unload()
	l.ids[spec.name] = c.Identifier
	raw, _ := m.RawAttributes()
	attrs, err := m.Attributes()
	if err != nil {
		return c, raw, err
	}
	b, err := attrs.Bind(p.prog)
	if err != nil {
		return c, raw, err
	}
	ev, err := m.NewEvaluator(b)
	if err != nil {
		return c, raw, err
	}
	defer ev.Close()
	var inputs [][]float32
	var bound []string
	for _, in := range b.Inputs {
		inputs = append(inputs, p.inputs[in.Port.Name])
		lay := in.Symbol.Layout
		bound = append(bound, fmt.Sprintf("%s=symbol %d (%q, plane stride %d, reported %t)", in.Port.Name, in.Symbol.Index, in.Symbol.Name, lay.PlaneStride, lay.Reported))
	}
	got := make([]float32, p.prog.Output.Values())
	device, err := fastest(5, func() error { return ev.Eval(inputs, got) })
	if err != nil {
		return c, raw, err
	}
	c.DeviceMS = ms(device)
	var want []float32
	cpu, err := fastest(1, func() (err error) { want, err = p.reference(); return err })
	if err != nil {
		return c, raw, err
	}
	c.CPUMS = ms(cpu)
	c.Detail = fmt.Sprintf("bound %s; output %q", strings.Join(bound, ", "), b.Output.Symbol.Name)
	if probe {
		if l.blas == nil {
			return c, raw, fmt.Errorf("the probe's CPU side: %w", l.blasErr)
		}
		work := l.blas.Prepare(p.graph.Matmuls())
		blas, err := fastest(3, work.Run)
		if err != nil {
			return c, raw, err
		}
		c.BLASMS = ms(blas)
		c.Detail = fmt.Sprintf("device %.2f ms, Go reference %.1f ms, Accelerate %.2f ms: probe ratio %.2f (the probe refuses over 0.8)",
			c.DeviceMS, c.CPUMS, c.BLASMS, c.DeviceMS/c.BLASMS)
	}
	if !c.record(got, want) {
		if c.NonFinite {
			return c, raw, errors.New("the device gave NaN or infinity")
		}
		return c, raw, fmt.Errorf("the device differs from the CPU reference by %.4f", c.MaxDiff)
	}
	c.Status = Passed
	return c, raw, nil
}

// fastest is the fastest of n runs of f.
func fastest(n int, f func() error) (time.Duration, error) {
	best := time.Duration(math.MaxInt64)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			return 0, err
		}
		best = min(best, time.Since(start))
	}
	return best, nil
}

// secondProcess runs this binary again as stage 6's second process, bounded in time, and
// judges what it found (judgeSecondProcess). A second process that dies is reported with its
// signal and its last framework call.
func (l *ladder) secondProcess(s *StageResult) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "--cache-check", "--compile-budget", fmt.Sprint(len(l.ids)), "--call-timeout", l.o.callTimeout.String(),
		"--timeout-factor", fmt.Sprint(l.o.timeoutFactor), "--checkpoint", l.o.checkpoint)
	var out bytes.Buffer
	cmd.Stdout = &out
	lastStep, runErr := traced(cmd, os.Stderr)
	var checks []Check
	if err := json.Unmarshal(out.Bytes(), &checks); err != nil {
		return fmt.Errorf("the second process (%v, last step %q) wrote no findings: %w", runErr, lastStep, err)
	}
	s.Checks = checks
	detail, err := judgeSecondProcess(l.ids, checks)
	s.Detail = detail
	if err != nil {
		return err
	}
	return runErr
}

// cacheCheck is stage 6's second process: it rebuilds every program of stages 2 to 5 and
// places each as the worker would (place): without a compile when aned or a kept folder holds
// it, else compiled once. It writes what happened to each to stdout.
func cacheCheck(o options) (bool, error) {
	r, err := ane.Open()
	if err != nil {
		return false, err
	}
	r.SetTimeouts(o.timeouts)
	b := &budget{limit: o.budget}
	var checks []Check
	passed := true
	for _, spec := range specsFor(o.checkpoint) {
		c := Check{Name: spec.name, Status: Failed}
		if err := func() error {
			p, err := spec.build()
			if err != nil {
				return err
			}
			m, err := r.NewModel(p.prog)
			if err != nil {
				return err
			}
			defer m.Close()
			c.Identifier = m.Identifier()
			if err := place(m, &c, b, time.Now); err != nil {
				return err
			}
			c.Detail = fmt.Sprintf("%s; loaded in %.1f ms", c.Origin, c.LoadMS)
			return m.Unload()
		}(); err != nil {
			c.Detail, c.Error, passed = err.Error(), describe(err), false
		} else {
			c.Status = Passed
		}
		checks = append(checks, c)
	}
	if err := json.NewEncoder(os.Stdout).Encode(checks); err != nil {
		return false, err
	}
	return passed, nil
}

// capacity runs this binary as the capacity stage's process (its compiles in a process of
// their own, under the per-process limit) and judges what it found.
func (l *ladder) capacity(s *StageResult) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, "--fill-device", "--compile-budget", fmt.Sprint(residencyBudget()), "--call-timeout", l.o.callTimeout.String())
	var out bytes.Buffer
	cmd.Stdout = &out
	lastStep, runErr := traced(cmd, os.Stderr)
	var c Capacity
	if err := json.Unmarshal(out.Bytes(), &c); err != nil {
		return fmt.Errorf("the capacity process (%v, last step %q) wrote no findings: %w", runErr, lastStep, err)
	}
	s.Capacity = &c
	detail, err := judgeCapacity(c)
	s.Detail = detail
	if err != nil {
		return err
	}
	return runErr
}

// fillDevice is the capacity stage's process: distinct 64x64 linear layers, loaded until one is
// refused, then all unloaded; what it found goes to stdout.
func fillDevice(o options) (bool, error) {
	r, err := ane.Open()
	if err != nil {
		return false, err
	}
	r.SetTimeouts(o.timeouts)
	build := func(i int) (loadable, error) {
		g, x := mil.NewGraph(formChannels, formSeq)
		p, err := g.Program(g.Linear("y", x, formChannels, randomMatrix(fmt.Sprintf("capacity %d", i), formChannels, formChannels)))
		if err != nil {
			return nil, err
		}
		return r.NewModel(p)
	}
	c, err := fill(build, &budget{limit: o.budget}, residencyBudget(), time.Now)
	if err != nil {
		return false, err
	}
	return c.Refusal == nil, json.NewEncoder(os.Stdout).Encode(c)
}
