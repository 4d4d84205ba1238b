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

// Package memlimit keeps a process's Go heap under its container's memory limit.
//
// The Go runtime does not know the container's limit: left to its default (GOGC=100) it lets
// the heap grow to twice what is live before collecting, and keeps freed pages a while, so a
// controller whose caches hold 90 MB at a thousand Macs reached 330 MiB of RSS, past the 256Mi
// its Deployment allows: the kernel would have killed it. A soft limit a little under the
// container's makes it collect harder and return memory as it nears the limit instead. That is
// the runtime's memory limit (GOMEMLIMIT), used as the Go GC guide suggests (golang/website,
// _content/doc/gc-guide.html, "Suggested uses": take advantage of it where the program alone
// holds a container's memory, leaving 5-10 % of headroom for memory the runtime does not
// see).
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
)

// The files that hold the limit of the cgroup a containerised process runs in, relative to
// /sys/fs/cgroup: cgroup v2's memory.max ("max" for none), or cgroup v1's
// memory.limit_in_bytes (a page-rounded MaxInt64 for none). A container runtime mounts its
// own cgroup there.
const (
	v2File = "memory.max"
	v1File = "memory/memory.limit_in_bytes"
)

// unlimitedV1 is the least value cgroup v1 reports for no limit (MaxInt64 rounded down to a
// page); anything from a pebibyte up is taken as none.
const unlimitedV1 = 1 << 50

// FromCgroup returns the memory limit of the cgroup mounted at cgroup (os.DirFS of
// /sys/fs/cgroup in a container); zero when it sets none or there is no cgroup to read.
func FromCgroup(cgroup fs.FS) (int64, error) {
	for _, name := range []string{v2File, v1File} {
		b, err := fs.ReadFile(cgroup, name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		s := strings.TrimSpace(string(b))
		if s == "max" {
			return 0, nil
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("cgroup %s reads %q, not a byte count", name, s)
		}
		if n >= unlimitedV1 {
			return 0, nil
		}
		return n, nil
	}
	return 0, nil
}

// Soft is the soft limit for a container limit: ratio of it, or none (zero) when there is no
// limit or the ratio is not in (0, 1].
func Soft(limit int64, ratio float64) int64 {
	if limit <= 0 || ratio <= 0 || ratio > 1 || math.IsNaN(ratio) {
		return 0
	}
	return int64(float64(limit) * ratio)
}

// Apply sets the runtime's soft memory limit to soft, unless the process was started with
// GOMEMLIMIT (the runtime took that already, and an operator's word stands) or soft is zero.
// It returns the limit in force afterwards (math.MaxInt64 for none) and whether it set it.
func Apply(soft int64) (int64, bool) {
	if os.Getenv("GOMEMLIMIT") != "" || soft <= 0 {
		return debug.SetMemoryLimit(-1), false
	}
	debug.SetMemoryLimit(soft)
	return soft, true
}
