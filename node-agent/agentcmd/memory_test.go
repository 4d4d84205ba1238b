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

package agentcmd

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/go-logr/logr"
)

// The soft memory limit: the default, a value given, none, GOMEMLIMIT over the default but not
// over a value given, and a value that is not a quantity refused.
func TestMemoryLimitFromTheFlagOrGOMEMLIMIT(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	for _, tc := range []struct {
		name, value, env string
		explicit         bool
		want             int64
	}{
		{"the default", DefaultMemoryLimit, "", false, math.MaxInt64},
		{"a value given", "1Gi", "", true, 1 << 30},
		{"none", "0", "", true, math.MaxInt64},
		{"GOMEMLIMIT over the default", DefaultMemoryLimit, "300MiB", false, -1},
		{"a value given over GOMEMLIMIT", "100Mi", "300MiB", true, 100 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMEMLIMIT", tc.env)
			want := tc.want
			if want == -1 {
				// The runtime read GOMEMLIMIT at start; stand in for it here.
				want = 300 << 20
				debug.SetMemoryLimit(want)
			}
			got, err := memoryLimit(tc.value, tc.explicit, logr.Discard())
			if err != nil || got != want || debug.SetMemoryLimit(-1) != want {
				t.Fatalf("limit %d (runtime %d), %v; want %d", got, debug.SetMemoryLimit(-1), err, want)
			}
		})
	}
	for _, bad := range []string{"lots", "-1Mi", "512m", "1Ki"} {
		if _, err := memoryLimit(bad, true, logr.Discard()); err == nil {
			t.Errorf("--memory-limit %q was taken", bad)
		}
	}
}
