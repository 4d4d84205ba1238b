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

// Command synapse-stress runs a residency stress case against real sim worker processes and
// writes its schema 2 report: residency-safety (must pass), cold-throughput (characterisation)
// or compile-scheduling (no overlapping compiles, no resource refusal, latencies against the
// standalone times). --sim-scale 1 runs at the seed's timings; the default runs in seconds.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/ck-synapse/synapse-fleet/node-agent/stress"
)

func main() {
	var cfg stress.Config
	var out string
	flag.StringVar(&cfg.Case, "case", "residency-safety", "the case: "+strings.Join(stress.Cases, ", "))
	flag.StringVar(&cfg.WorkerBinary, "worker", "bin/synapse-ane-worker", "the synapse-ane-worker binary")
	flag.StringVar(&cfg.StateDir, "state-dir", "", "where each scenario keeps its cold aned cache (default: a temporary folder)")
	flag.Float64Var(&cfg.Scale, "sim-scale", 0.001, "multiplies the sim's compile and load times; 1 is the seed's scale")
	flag.DurationVar(&cfg.AdmissionBound, "admission-bound", 2100*time.Second, "the test-only admission-wait backstop")
	flag.IntVar(&cfg.ProgramLimit, "sim-program-limit", 0, "the stand-in device's machine-wide program limit (default 120); below the budget, resource refusals happen")
	flag.StringVar(&out, "report", "-", "where to write the JSON report (- for standard output)")
	flag.Parse()
	cfg.Log = logr.Discard()

	if cfg.StateDir == "" {
		dir, err := os.MkdirTemp("", "synapse-stress-")
		if err != nil {
			fail(err)
		}
		defer os.RemoveAll(dir)
		cfg.StateDir = dir
	}
	rep, err := stress.Run(context.Background(), cfg)
	if rep != nil {
		data, _ := json.MarshalIndent(rep, "", "  ")
		if out == "-" {
			fmt.Println(string(data))
		} else if werr := os.WriteFile(out, data, 0o644); werr != nil {
			fail(werr)
		}
	}
	if err != nil {
		fail(err)
	}
	if !rep.Passed {
		fail(fmt.Errorf("case %s failed its checks", cfg.Case))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "synapse-stress:", err)
	os.Exit(1)
}
