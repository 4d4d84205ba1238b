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

package memlimit

import (
	"math"
	"runtime/debug"
	"testing"
	"testing/fstest"
)

func TestTheContainersLimitIsReadFromEitherCgroupVersion(t *testing.T) {
	const nsRoot = "0::/\n" // a cgroup namespace of the container's own: it is the root
	for _, tc := range []struct {
		name  string
		files fstest.MapFS
		self  string
		want  int64
		err   bool
	}{
		{"cgroup v2 with a limit", fstest.MapFS{"memory.max": {Data: []byte("268435456\n")}}, nsRoot, 268435456, false},
		{"cgroup v2 without one", fstest.MapFS{"memory.max": {Data: []byte("max\n")}}, nsRoot, 0, false},
		{"cgroup v1 with a limit", fstest.MapFS{"memory/memory.limit_in_bytes": {Data: []byte("536870912\n")}}, "4:memory:/\n", 536870912, false},
		{"cgroup v1 without one", fstest.MapFS{"memory/memory.limit_in_bytes": {Data: []byte("9223372036854771712\n")}}, "4:memory:/\n", 0, false},
		{"v2 is read before v1", fstest.MapFS{"memory.max": {Data: []byte("1048576")}, "memory/memory.limit_in_bytes": {Data: []byte("2097152")}},
			"4:cpu,memory:/\n0::/\n", 1048576, false},
		{"no cgroup", fstest.MapFS{}, "", 0, false},
		{"nothing said of the process's cgroup: the root's", fstest.MapFS{"memory.max": {Data: []byte("1048576")}}, "", 1048576, false},
		// Without a cgroup namespace of its own the process sees the host's hierarchy, whose
		// root has no memory.max: the limit is on its container's cgroup, or on the pod's above.
		{"v2 without a namespace: the container's", fstest.MapFS{
			"kubepods/pod1/memory.max":     {Data: []byte("max")},
			"kubepods/pod1/ctr/memory.max": {Data: []byte("268435456")},
		}, "0::/kubepods/pod1/ctr\n", 268435456, false},
		{"v2 without a namespace: the least of the pod's and the container's", fstest.MapFS{
			"kubepods/pod1/memory.max":     {Data: []byte("134217728")},
			"kubepods/pod1/ctr/memory.max": {Data: []byte("268435456")},
		}, "0::/kubepods/pod1/ctr\n", 134217728, false},
		{"v1 without a namespace", fstest.MapFS{
			"memory/docker/abc/memory.limit_in_bytes": {Data: []byte("268435456")},
			"memory/memory.limit_in_bytes":            {Data: []byte("9223372036854771712")},
		}, "12:pids:/docker/abc\n4:memory:/docker/abc\n0::/docker/abc\n", 268435456, false},
		{"a path outside the namespace's view is read from its root", fstest.MapFS{"memory.max": {Data: []byte("1048576")}}, "0::/../..\n", 1048576, false},
		{"not a number", fstest.MapFS{"memory.max": {Data: []byte("lots\n")}}, nsRoot, 0, true},
		{"not positive", fstest.MapFS{"memory.max": {Data: []byte("0\n")}}, nsRoot, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FromCgroup(tc.files, tc.self)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want one: %v", err, tc.err)
			}
			if got != tc.want {
				t.Fatalf("limit %d, want %d", got, tc.want)
			}
		})
	}
}

func TestTheSoftLimitIsTheRatioOfALimitAndNoneWithout(t *testing.T) {
	for _, tc := range []struct {
		limit int64
		ratio float64
		want  int64
	}{
		{256 << 20, 0.9, 241591910},
		{256 << 20, DefaultRatio, 192 << 20},
		{256 << 20, 1, 256 << 20},
		{0, 0.9, 0},
		{256 << 20, 0, 0},
		{256 << 20, 1.5, 0},
		{256 << 20, math.NaN(), 0},
	} {
		if got := Soft(tc.limit, tc.ratio); got != tc.want {
			t.Errorf("Soft(%d, %g) = %d, want %d", tc.limit, tc.ratio, got, tc.want)
		}
	}
}

func TestApplySetsTheRuntimesLimitUnlessGOMEMLIMITWasGiven(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })

	t.Setenv("GOMEMLIMIT", "") // as unset, for the runtime too; restored after the test
	if got, set := Apply(200 << 20); !set || got != 200<<20 || debug.SetMemoryLimit(-1) != 200<<20 {
		t.Fatalf("Apply(200Mi) = %d, %v; runtime limit %d", got, set, debug.SetMemoryLimit(-1))
	}
	debug.SetMemoryLimit(math.MaxInt64)
	if got, set := Apply(0); set || got != math.MaxInt64 {
		t.Fatalf("Apply(0) = %d, %v: no limit must leave the runtime's", got, set)
	}

	t.Setenv("GOMEMLIMIT", "300MiB")
	debug.SetMemoryLimit(300 << 20) // as the runtime took it at start
	if got, set := Apply(200 << 20); set || got != 300<<20 {
		t.Fatalf("Apply with GOMEMLIMIT given = %d, %v: the operator's limit must stand", got, set)
	}
}

func TestParseTakesAQuantityOfAtLeastMinAndZeroForNone(t *testing.T) {
	for value, want := range map[string]int64{"0": 0, "16Mi": Min, "256Mi": 256 << 20, "1Gi": 1 << 30} {
		if got, err := Parse("--memory-limit", value); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", value, got, err, want)
		}
	}
	for _, bad := range []string{"lots", "-1Mi", "512m", "256", "1Ki", "15Mi"} {
		if got, err := Parse("--memory-limit", bad); err == nil {
			t.Errorf("Parse(%q) took %d", bad, got)
		}
	}
}
