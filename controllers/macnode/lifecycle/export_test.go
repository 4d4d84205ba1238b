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

package lifecycle

// HeartbeatsKept is how many nodes' last renewals the controller keeps in memory: one per node
// it has seen and not seen deleted.
func (c *Controller) HeartbeatsKept() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.beats)
}

// ReleasesRemembered is how many released placements the controller remembers, of every node:
// those the cache may still list.
func (c *Controller) ReleasesRemembered() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, uids := range c.released {
		n += len(uids)
	}
	return n
}
