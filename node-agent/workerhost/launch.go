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

package workerhost

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// Streams is a started worker as the host speaks to it: its standard streams, a way to end it
// at once, and a way to confirm that it has exited. A process gives them (startProcess); so can
// anything that ends its streams as a process's exit does.
type Streams struct {
	Stdin  io.WriteCloser
	Stdout io.Reader
	Stderr io.Reader
	// Kill ends the worker at once, which ends any read or write of its streams in progress; it
	// may be called again, and after the worker has exited.
	Kill func() error
	// Wait returns once the worker has exited, with how it exited. The host calls it once,
	// after it has read Stderr to its end.
	Wait func() error
	// Pid, if not 0, is the process's id, logged with its lines.
	Pid int
}

// startProcess starts generation gen of spec's worker as a synapse-ane-worker process.
func (cfg Config) startProcess(spec supervisor.ModelSpec, gen int64) (Streams, error) {
	args := []string{"--backend", cfg.Backend, "--state-dir", cfg.StateDir, "--sim-scale", fmt.Sprint(cfg.SimScale)}
	if cfg.SigningIdentifier != "" {
		args = append(args, "--signing-identifier", cfg.SigningIdentifier)
	}
	cmd := exec.Command(cfg.Binary, args...)
	// The native compiler needs the normal per-user temporary folder: no TMPDIR override.
	cmd.Env = slicesWithout(os.Environ(), "TMPDIR=")
	// Named in its environment, so an operator (or a test) can tell which lane a process serves.
	cmd.Env = append(cmd.Env, "SYNAPSE_LANE="+spec.Lane, fmt.Sprintf("SYNAPSE_WORKER_GENERATION=%d", gen))
	if cfg.Env != nil {
		cmd.Env = append(cmd.Env, cfg.Env(spec.Lane, gen)...)
	}
	if cfg.Lock != nil {
		cmd.ExtraFiles = []*os.File{cfg.Lock} // fd 3 in the worker
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return Streams{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return Streams{}, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return Streams{}, err
	}
	if err := cmd.Start(); err != nil {
		return Streams{}, fmt.Errorf("starting %s: %w", cfg.Binary, err)
	}
	kill := func() error {
		err := cmd.Process.Kill()
		if errors.Is(err, os.ErrProcessDone) {
			return nil
		}
		return err
	}
	return Streams{Stdin: stdin, Stdout: stdout, Stderr: stderr, Kill: kill, Wait: cmd.Wait, Pid: cmd.Process.Pid}, nil
}

func slicesWithout(env []string, prefix string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, prefix) {
			out = append(out, e)
		}
	}
	return out
}
