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
	"context"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
)

// environment gathers stage 1's findings. r is nil when the framework did not open.
func environment(r *ane.Runtime, o options) Environment {
	e := Environment{OS: runtime.GOOS, Arch: runtime.GOARCH, UID: os.Getuid(), TMPDIR: os.Getenv("TMPDIR"), GoTempDir: os.TempDir()}
	e.MacOSVersion, _ = syscall.Sysctl("kern.osproductversion")
	e.MacOSBuild, _ = syscall.Sysctl("kern.osversion")
	e.Chip, _ = syscall.Sysctl("machdep.cpu.brand_string")
	if v, err := syscall.SysctlUint32("kern.hv_vmm_present"); err == nil {
		vm := v == 1
		e.VirtualMachine = &vm
	}
	if r != nil {
		e.Device = r.DeviceInfo()
		e.TempDir = r.Sources().Root
		e.ModelURLSet = r.SetsModelURL()
	}
	if exe, err := os.Executable(); err == nil {
		e.SigningIdentifier = signingIdentifier(command("/usr/bin/codesign", "-dv", exe))
	}
	if _, err := os.Stat(o.worker); err == nil {
		e.WorkerPath = o.worker
		e.WorkerSigningIdentifier = signingIdentifier(command("/usr/bin/codesign", "-dv", o.worker))
	}
	e.LaunchdManager = strings.TrimSpace(command("/bin/launchctl", "managername"))
	e.LaunchdDomain = launchdDomain(e.LaunchdManager, e.UID)
	return e
}

// command runs a tool for at most 10 s and returns what it printed (codesign -dv prints on
// stderr).
func command(name string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, name, args...).CombinedOutput()
	return string(out)
}
