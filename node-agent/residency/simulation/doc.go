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

// Package simulation drives the residency core with seeded random schedules of requests (bursts
// at one instant too), cancellations, deadlines, prewarm, retirements (while loading, and loads
// while retiring), observations (withdrawn too) and every worker fault the seed names, at any
// point of any exchange, idle crashes and outcome reports delivered twice, over a simulated
// machine: worker processes with one stream each, aned's machine-wide cache and a
// one-layer-at-a-time compiler stand-in. Time is virtual; every choice comes from one seeded
// generator, so a seed replays exactly.
//
// After every step it checks the core's own invariants (CheckInvariants) and the ones only the
// machine and the clients can see. Safety: at most one compile on the device, no charge refunded
// before its release was acknowledged or its process's exit confirmed, no leased shape evicted,
// every request answered exactly once, a prewarm admission started only while nothing waits and
// its lane is quiet, a worker's own error freeing the gate at once. Promises: a shape_compiling
// answer names a compile that stays queued for twice the retry it told, at least a second.
// Progress, once faults stop: every request answered within its bound, an unknown outcome's
// hold ended within 35 s of its worker's restart, and a request that arrives after every trace
// of the faults is gone never refused for one. The mutation gate (hack/mutate) shows each check
// can fail.
package simulation
