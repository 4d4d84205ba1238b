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

package rollout

import (
	"testing"
	"time"
)

// TestTheProgressDeadlineRunsFromTheRolloutsLastMove: a rollout that moves (a placement made or
// serving, an old one gone, the switch, a new generation) starts its deadline again; one that
// does not exceeds it once the deadline has passed since it last moved, and says when that is.
func TestTheProgressDeadlineRunsFromTheRolloutsLastMove(t *testing.T) {
	t0 := time.Unix(1000, 0)
	deadline := 10 * time.Minute
	prev := Mark{Generation: 2, Updated: 1, UpdatedReady: 0, Old: 3, Space: "a"}
	for _, tc := range []struct {
		name     string
		cur      Mark
		since    *time.Time
		now      time.Time
		at       time.Time
		exceeded bool
		wake     time.Duration
	}{
		{"a rollout starts its deadline now", prev, nil, t0, t0, false, deadline},
		{"standing still, it waits out the deadline", prev, &t0, t0.Add(4 * time.Minute), t0, false, 6 * time.Minute},
		{"standing still past the deadline, it is exceeded", prev, &t0, t0.Add(deadline), t0, true, 0},
		{"a placement made moves it", Mark{2, 2, 0, 3, "a"}, &t0, t0.Add(deadline), t0.Add(deadline), false, deadline},
		{"a placement serving moves it", Mark{2, 1, 1, 3, "a"}, &t0, t0.Add(deadline), t0.Add(deadline), false, deadline},
		{"an old placement gone moves it", Mark{2, 1, 0, 2, "a"}, &t0, t0.Add(deadline), t0.Add(deadline), false, deadline},
		{"the switch moves it", Mark{2, 1, 0, 3, "b"}, &t0, t0.Add(deadline), t0.Add(deadline), false, deadline},
		{"a new generation starts it again", Mark{3, 1, 0, 3, "a"}, &t0, t0.Add(deadline), t0.Add(deadline), false, deadline},
		{"a placement lost does not move it", Mark{2, 0, 0, 3, "a"}, &t0, t0.Add(deadline), t0, true, 0},
	} {
		at, exceeded, wake := Progress(prev, tc.cur, tc.since, tc.now, deadline)
		if !at.Equal(tc.at) || exceeded != tc.exceeded || wake != tc.wake {
			t.Errorf("%s: got at %v exceeded %v wake %v, want %v %v %v", tc.name, at, exceeded, wake, tc.at, tc.exceeded, tc.wake)
		}
	}
}
