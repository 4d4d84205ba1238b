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

// Package workertest builds synapse-ane-worker for tests that run real worker processes.
package workertest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Main builds the worker, points *path at it, runs the package's tests and removes the build:
// the whole of a TestMain, as os.Exit(workertest.Main(m, &workerBinary)).
func Main(m *testing.M, path *string) int {
	bin, cleanup, err := Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer cleanup()
	*path = bin
	return m.Run()
}

// Build compiles the worker into a temporary folder and returns its path and a cleanup.
func Build() (string, func(), error) {
	dir, err := os.MkdirTemp("", "synapse-worker-")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "synapse-ane-worker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/ck-synapse/synapse-fleet/node-agent/cmd/synapse-ane-worker").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("building the worker: %v\n%s", err, out)
	}
	return bin, func() { os.RemoveAll(dir) }, nil
}
