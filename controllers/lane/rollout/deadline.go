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

import "time"

// Mark is where a rollout stood at a pass: what the next pass compares to see whether it moved.
type Mark struct {
	// Generation is the lane's generation the rollout goes to.
	Generation int64
	// Updated and UpdatedReady count the placements of the latest spec and those that serve;
	// Old the placements of an earlier spec left.
	Updated, UpdatedReady, Old int
	// Space is the vector space the lane answers in.
	Space string
}

// movedFrom reports whether the rollout moved since prev, as a Deployment's progresses: a new
// spec to go to, a placement of the latest spec made or serving, an old one gone, the switch.
func (m Mark) movedFrom(prev Mark) bool {
	return m.Generation != prev.Generation || m.Updated > prev.Updated || m.UpdatedReady > prev.UpdatedReady ||
		m.Old < prev.Old || m.Space != prev.Space
}

// Progress is the progress deadline's verdict: at is when the rollout last moved (now if it
// moved since prev, which was marked at since; a rollout without since starts now), exceeded
// says deadline has passed since then, and wake is how long until it does.
func Progress(prev, cur Mark, since *time.Time, now time.Time, deadline time.Duration) (at time.Time, exceeded bool, wake time.Duration) {
	at = now
	if since != nil && !cur.movedFrom(prev) {
		at = *since
	}
	end := at.Add(deadline)
	if !now.Before(end) {
		return at, true, 0
	}
	return at, false, end.Sub(now)
}
