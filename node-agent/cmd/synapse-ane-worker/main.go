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

// Command synapse-ane-worker runs one loaded model for the node agent: protocol v3 frames on
// stdin and stdout, log lines on stderr. The agent starts one per model (a worker
// generation) and passes the machine's lane lock as an inherited file, which this process
// keeps open for as long as it can use the device.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

func main() {
	backend := flag.String("backend", "", "ane (the Neural Engine, macOS on Apple silicon) or sim (the stand-in); required")
	stateDir := flag.String("state-dir", "", "sim: where the stand-in keeps aned's cache and the compiler lock")
	signingID := flag.String("signing-identifier", "synapse-ane-worker", "the code-signing identifier aned caches programs under")
	simScale := flag.Float64("sim-scale", 1, "sim: multiplies every simulated compile and load time")
	faults := flag.String("faults", os.Getenv("SYNAPSE_WORKER_FAULTS"), "test faults, for example crash:admit:2,malformed:execute:1,hang:evict:1")
	probeRatio := flag.String("sim-probe-ratio", os.Getenv("SYNAPSE_SIM_PROBE_RATIO"), "sim: the device-to-CPU ratio the placement probe reports, for every rung (0.97) or single rungs (512=0.97); default 0.4, above 0.8 fails the probe")
	limitDefault, limitErr := envCount("SYNAPSE_SIM_PROGRAM_LIMIT")
	programLimit := flag.Int("sim-program-limit", limitDefault, "sim: how many programs the machine holds resident, all workers together (default 120)")
	flag.Parse()

	if limitErr != nil {
		fmt.Fprintln(os.Stderr, "synapse-ane-worker:", limitErr)
		os.Exit(2)
	}
	if err := run(*backend, *stateDir, *signingID, *simScale, *programLimit, *probeRatio, *faults); err != nil {
		fmt.Fprintln(os.Stderr, "synapse-ane-worker:", err)
		os.Exit(2)
	}
}

// envCount reads a count from the environment; unset reads as 0 (the default). A malformed one
// is an error: the worker refuses to start rather than run with a limit nobody asked for.
func envCount(name string) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%s=%q is not a count", name, v)
	}
	return n, nil
}

func run(backendName, stateDir, signingID string, simScale float64, programLimit int, probeRatio, faultSpec string) error {
	f, err := worker.ParseFaults(faultSpec)
	if err != nil {
		return err
	}
	ratio, ratios, err := worker.ParseProbeRatios(probeRatio)
	if err != nil {
		return err
	}
	var b worker.Backend
	switch backendName {
	case "ane":
		if b, err = worker.NewANE(); err != nil {
			return err
		}
	case "sim":
		b = &worker.Sim{
			Machine:     simane.New(simane.Config{Clock: clock.RealClock{}, Scale: simScale, Dir: stateDir, ProgramLimit: programLimit}),
			SigningID:   signingID,
			Clock:       clock.RealClock{},
			ProbeRatio:  ratio,
			ProbeRatios: ratios,
		}
	default:
		return fmt.Errorf("--backend must be ane or sim, got %q", backendName)
	}
	digest, err := selfDigest()
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	var profile io.Writer
	if dir := os.Getenv(worker.ProfileDirEnv); dir != "" {
		f, err := worker.OpenProfile(dir)
		if err != nil {
			return err
		}
		defer f.Close()
		profile = f
	}
	s := &worker.Server{
		Profile:  profile,
		Backend:  b,
		Identity: worker.Identity{Backend: backendName, SigningIdentifier: signingID, BinaryDigest: digest},
		Stderr:   os.Stderr,
		Faults:   f,
		Exit:     os.Exit,
	}
	return s.Serve(ctx, os.Stdin, os.Stdout)
}

// selfDigest is the SHA-256 of this executable, reported so identities can pin the binary.
func selfDigest() (string, error) {
	path, err := os.Executable()
	if err != nil {
		return "", err
	}
	return artifact.FileSHA256(path)
}
