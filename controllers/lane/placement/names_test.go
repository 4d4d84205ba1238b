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

package placement

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

// TestPlacementNamesNeverCollide: names built by joining a lane's and a node's collided (lane
// ca-b on node m, lane ca on node b-m: both ca-b-m), and the second lane stayed unplaced; each
// pair now has its own name, a valid one, within a name's length whatever the node's.
func TestPlacementNamesNeverCollide(t *testing.T) {
	long := strings.Repeat("mac-studio.", 22) + "local" // 247 characters, a valid node name
	pairs := [][2]string{{"ca-b", "m"}, {"ca", "b-m"}, {"ca", "b.m"}, {"ca-b", "m." + long[:200]}, {"ca", "b-m." + long[:200]},
		{strings.Repeat("l", 63), long}, {strings.Repeat("l", 63), long + "x"}, {"gte", long}}
	seen := map[string][2]string{}
	for _, pair := range pairs {
		name := placementName(pair[0], pair[1])
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("lane %s on node %s: name %q is invalid: %v", pair[0], pair[1], name, errs)
		}
		if other, ok := seen[name]; ok {
			t.Errorf("lane %s on node %s and lane %s on node %s share the name %q", pair[0], pair[1], other[0], other[1], name)
		}
		seen[name] = pair
		if name != placementName(pair[0], pair[1]) {
			t.Errorf("lane %s on node %s: the name changes from one call to the next", pair[0], pair[1])
		}
	}
	if got := placementName("gte", "mac-1"); !strings.HasPrefix(got, "gte-mac-1-") {
		t.Errorf("placementName(gte, mac-1) = %q, want gte-mac-1-<hash>: the lane and the node first, for a person to read", got)
	}
}
