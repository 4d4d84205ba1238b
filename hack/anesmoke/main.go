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

// Command anesmoke is `make ane-smoke`: a diagnostic ladder a Mac owner runs on real hardware,
// stopping at the first stage that fails and saying why, with the framework's NSError domain,
// code and description:
//
//  1. environment: macOS build, chip, virtual machine or not, the compiler's temporary folder
//     against TMPDIR, this binary's and the worker's signing identifiers, the launchd domain;
//  2. one linear layer compiled, loaded, evaluated against the CPU reference;
//  3. the loaded model's attributes (input symbols, indices, strides) and a plain two-input add
//     proving the binding before any attention depends on it;
//  4. each operation form the families use, alone;
//  5. one full-size layer of each catalog family at 128 and 512 positions, with the probe's
//     device, Go reference and Accelerate timings (with --checkpoint, that checkpoint's first
//     layer on the embedding of real text), and causal attention over 4096 positions, tiled
//     over query rows as the large rungs' attention is;
//  6. a second process finding every program in aned's cache or its kept compiled folder and
//     loading it without compiling (or compiling once, and saying why);
//  7. a third process loading distinct small programs until the device refuses one: how many
//     it holds against the residency budget, and whether the worker reads the refusal as the
//     device being full.
//
// It prints a table and writes a JSON report to attach to a bug, after every check: the
// ladder runs in a child process, and a child that dies (an Objective-C exception, a bad
// call) leaves its report with the signal and the framework call it died in. Anywhere but macOS on Apple
// silicon it says why it cannot run.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
)

// options are the command's flags.
type options struct {
	report      string
	worker      string
	budget      int
	callTimeout time.Duration
	// timeoutFactor scales the compile and load bounds (ane.TimeoutsFor, by rung).
	timeoutFactor float64
	// cacheCheck: this process is stage 6's second process; it writes its findings to stdout.
	cacheCheck bool
	// checkpoint, if set, is a checkpoint directory whose first layer stage 5 runs.
	checkpoint string
	// fillDevice: this process is the capacity stage's; it writes what it found to stdout.
	fillDevice bool
	// child: this process runs the ladder for a supervising parent, which keeps the report
	// however the child ends.
	child bool
}

// timeouts are the bounds of a model's framework calls at seq positions.
func (o options) timeouts(seq int) ane.Timeouts {
	t := ane.TimeoutsFor(seq)
	f := max(o.timeoutFactor, 1)
	t.Compile, t.Load = time.Duration(float64(t.Compile)*f), time.Duration(float64(t.Load)*f)
	if o.callTimeout > 0 {
		t.Call = o.callTimeout
	}
	return t
}

func main() {
	var o options
	var show string
	flag.StringVar(&o.report, "report", "ane-smoke-report.json", "where to write the JSON report")
	flag.StringVar(&o.worker, "worker", "/usr/local/bin/synapse-ane-worker", "the worker binary whose signing identifier to report (skipped if absent)")
	flag.IntVar(&o.budget, "compile-budget", 60, "the most programs this run compiles (the per-process limit is about 119)")
	flag.DurationVar(&o.callTimeout, "call-timeout", time.Minute, "the bound on one framework call other than a compile or a load")
	flag.Float64Var(&o.timeoutFactor, "timeout-factor", 1, "scales the compile and load bounds, which grow with the rung (at least 1)")
	flag.BoolVar(&o.cacheCheck, "cache-check", false, "internal: run as stage 6's second process")
	flag.BoolVar(&o.child, "child", false, "internal: run the ladder for a supervising parent")
	flag.BoolVar(&o.fillDevice, "fill-device", false, "internal: run as the capacity stage's process")
	flag.StringVar(&o.checkpoint, "checkpoint", "", "a checkpoint directory (config.json, safetensors, tokenizer.json): stage 5 runs its first layer on real text instead of the catalog shapes with random weights")
	flag.StringVar(&show, "print", "", "print the table of a report written earlier (by the LaunchDaemon run, say) and exit")
	flag.Parse()
	if show != "" {
		rep, err := readReport(show)
		if err != nil {
			fail(err)
		}
		printTable(os.Stdout, rep)
		if !rep.Passed {
			os.Exit(1)
		}
		return
	}
	passed, err := run(o)
	if err != nil {
		fail(err)
	}
	if !passed {
		os.Exit(1)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "ane-smoke:", err)
	os.Exit(2)
}
