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
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
)

// WorkerIdentifier is the signing identifier the agent's worker is signed with
// (config/agent/macos/sign-worker.sh).
const WorkerIdentifier = "synapse-ane-worker"

// checkEnvironment is stage 1's verdict on what was found: an error for what stops the
// Neural Engine path, warnings for what would hurt it, and a one-line summary.
func checkEnvironment(e Environment, openErr error) (summary string, warnings []string, err error) {
	summary = fmt.Sprintf("macOS %s (%s), %s, temporary folder %s, launchd %s", orUnknown(e.MacOSVersion), orUnknown(e.MacOSBuild),
		orUnknown(e.Chip), orUnknown(e.TempDir), orUnknown(e.LaunchdManager))
	switch {
	case e.VirtualMachine != nil && *e.VirtualMachine || e.Device.VirtualMachine != nil && *e.Device.VirtualMachine:
		return summary, nil, errors.New("this is a virtual machine: it has no Neural Engine")
	case openErr != nil:
		return summary, nil, openErr
	case e.Device.HasANE != nil && !*e.Device.HasANE:
		return summary, nil, errors.New("the framework says this machine has no Neural Engine")
	case macOSMajor(e.MacOSVersion) < 15:
		return summary, nil, fmt.Errorf("macOS %q: the programs are main<ios18>, which needs macOS 15 or later", e.MacOSVersion)
	case e.TempDir == "":
		return summary, nil, errors.New("Foundation gave no temporary folder for the compiler's sources")
	}
	if e.TMPDIR == "" {
		warnings = append(warnings, fmt.Sprintf("TMPDIR is unset (as for a launchd job): Go's os.TempDir() is %s, but the compiler reads %s, where the sources are written", e.GoTempDir, e.TempDir))
	} else if filepath.Clean(e.TMPDIR) != filepath.Clean(e.TempDir) {
		warnings = append(warnings, fmt.Sprintf("TMPDIR is %s but the compiler reads %s; the agent starts workers without a TMPDIR of its own", e.TMPDIR, e.TempDir))
	}
	if id := e.SigningIdentifier; id == "" || strings.HasPrefix(id, "a.out") {
		warnings = append(warnings, fmt.Sprintf("this binary's signing identifier is %q: unsigned Go binaries share the a.out partition of aned's cache (make ane-smoke signs it)", id))
	}
	switch {
	case e.WorkerPath == "":
		warnings = append(warnings, "no worker binary was found to check its signing identifier (--worker)")
	case e.WorkerSigningIdentifier != WorkerIdentifier:
		warnings = append(warnings, fmt.Sprintf("the worker %s is signed %q, not %q: run config/agent/macos/sign-worker.sh, or it compiles into another aned cache partition than the one its identity was certified with",
			e.WorkerPath, e.WorkerSigningIdentifier, WorkerIdentifier))
	}
	if e.UID == 0 {
		warnings = append(warnings, "running as root: the agent's LaunchDaemon names a UserName, so workers run as that user with its temporary folder and aned cache; run the daemon ladder (make ane-smoke-daemon) to check that domain")
	}
	if !e.ModelURLSet {
		warnings = append(warnings, "the framework has no -setModelURL:; the compiler's default folder, where the sources are written, is relied on")
	}
	return summary, warnings, nil
}

// macOSMajor is the major version of "15.2", or 0.
func macOSMajor(version string) int {
	major, _, _ := strings.Cut(version, ".")
	n, err := strconv.Atoi(major)
	if err != nil {
		return 0
	}
	return n
}
