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

// Package memlimit keeps the memory a Go process's runtime manages (its heap, stacks and their
// bookkeeping) under a share of its container's memory limit.
//
// The Go runtime does not know the container's limit: left to its default (GOGC=100) it lets
// the heap grow to twice what is live before collecting, and keeps freed pages a while, so a
// controller with about 65 MB live at a thousand Macs reached 330 MiB of RSS, past the 256Mi its
// Deployment allows. A soft limit under the container's makes the runtime collect harder and
// return freed memory as it nears it; only memory that is live past the limit can still take
// the process to the kernel's. That is the runtime's memory limit (GOMEMLIMIT), used as the Go
// GC guide suggests (golang/website, _content/doc/gc-guide.html, "Suggested uses": take
// advantage of it where the program alone holds a container's memory, leaving headroom for
// memory the runtime does not see; it suggests 5-10 %, the controller needs more: see
// DefaultRatio).
package memlimit

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
)

// The files that hold a cgroup's memory limit, under its directory in the cgroup filesystem
// (/sys/fs/cgroup): cgroup v2's memory.max ("max" for none), or cgroup v1's
// memory.limit_in_bytes, under the memory controller's hierarchy (a page-rounded MaxInt64 for
// none). The kernel documents both: Documentation/admin-guide/cgroup-v2.rst, "memory.max", and
// Documentation/admin-guide/cgroup-v1/memory.rst.
const (
	v2File = "memory.max"
	v1Dir  = "memory"
	v1File = "memory.limit_in_bytes"
)

// unlimitedV1 is the least value cgroup v1 reports for no limit (MaxInt64 rounded down to a
// page); anything from a pebibyte up is taken as none.
const unlimitedV1 = 1 << 50

// FromCgroup returns the memory limit the process runs under: the least limit set on its
// cgroup or on any cgroup above it (a container's, or a pod's around it), read from the cgroup
// filesystem cgroup (os.DirFS of /sys/fs/cgroup). self is what /proc/self/cgroup says, which
// names the process's cgroup in each hierarchy: in a container with a cgroup namespace of its
// own that is the root, "/"; without one, the whole path from the host's root. It returns zero
// when no limit is set or there is nothing to read.
func FromCgroup(cgroup fs.FS, self string) (int64, error) {
	v2, v1 := "/", "/"
	for _, line := range strings.Split(self, "\n") {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(strings.TrimSpace(line), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case slices.Contains(strings.Split(parts[1], ","), "memory"):
			v1 = parts[2]
		}
	}
	if limit, err := leastAbove(cgroup, "", v2, v2File); err != nil || limit > 0 {
		return limit, err
	}
	return leastAbove(cgroup, v1Dir, v1, v1File)
}

// leastAbove is the least limit in file over the cgroup at path under root and every cgroup
// above it; zero for none.
func leastAbove(cgroup fs.FS, root, cgPath, file string) (int64, error) {
	// A path outside the namespace's view (shown as ../..) is read from the namespace's root.
	dir := path.Clean("/" + cgPath)
	if strings.Contains(cgPath, "..") {
		dir = "/"
	}
	var least int64
	for {
		name := path.Join(root, strings.TrimPrefix(dir, "/"), file)
		limit, err := read(cgroup, name)
		if err != nil {
			return 0, err
		}
		if limit > 0 && (least == 0 || limit < least) {
			least = limit
		}
		if dir == "/" {
			return least, nil
		}
		dir = path.Dir(dir)
	}
}

// read is the limit in one cgroup file: zero when it sets none or does not exist.
func read(cgroup fs.FS, name string) (int64, error) {
	b, err := fs.ReadFile(cgroup, name)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
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

// DefaultRatio is the share of its container's memory limit the controller's runtime is kept
// under. The rest is for memory the runtime does not see but the container's limit counts:
// above all the binary's own pages, mapped from its file (the cgroup charges page cache too).
// At a thousand Macs those were 45 MiB of the controller's resident memory, 17 % of its
// Deployment's 256Mi: at 0.9 (the 5-10 % of headroom the GC guide suggests for a program that
// maps little) the runtime's share and the binary's together reached 273 MiB, past the limit,
// which the kernel meets by evicting the binary's pages while it runs.
const DefaultRatio = 0.75

// Soft is the soft limit for a container limit: ratio of it, or none (zero) when there is no
// limit or the ratio is not in (0, 1].
func Soft(limit int64, ratio float64) int64 {
	if limit <= 0 || ratio <= 0 || ratio > 1 || math.IsNaN(ratio) {
		return 0
	}
	return int64(float64(limit) * ratio)
}

// Min is the least limit a flag may give: a quantity read as milli-bytes ("512m" is half a
// byte, not 512 MiB) or as bytes ("256" meant as 256Mi) would have the collector run without end.
const Min = 16 << 20

// Parse reads a memory limit given to flag as a quantity (512Mi, 1Gi): its bytes, zero for
// "0" (none). A value that is not a quantity, or is under Min, is refused, saying how to write it.
func Parse(flag, value string) (int64, error) {
	q, err := resource.ParseQuantity(value)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", flag, value, err)
	}
	if q.IsZero() {
		return 0, nil
	}
	if limit := q.Value(); limit >= Min {
		return limit, nil
	}
	return 0, fmt.Errorf("%s %q: a limit is at least 16Mi (write mebibytes as Mi, gibibytes as Gi; 0 for none)", flag, value)
}

// FromEnv reports whether the process was started with GOMEMLIMIT, which the runtime has
// already applied (the runtime takes "" as unset).
func FromEnv() bool { return os.Getenv("GOMEMLIMIT") != "" }

// Apply sets the runtime's soft memory limit to soft, unless the process was started with
// GOMEMLIMIT (the runtime took that already, and an operator's word stands) or soft is zero.
// It returns the limit in force afterwards (math.MaxInt64 for none) and whether it set it.
func Apply(soft int64) (int64, bool) {
	if FromEnv() || soft <= 0 {
		return debug.SetMemoryLimit(-1), false
	}
	debug.SetMemoryLimit(soft)
	return soft, true
}
