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

// Package simulation drives the residency core with seeded random schedules of requests,
// cancellations, deadlines, prewarm, retirements (while loading too), observations and every
// worker fault the seed names, at any point of any exchange, over a simulated machine: worker
// processes with one stream each, aned's machine-wide cache and a one-layer-at-a-time compiler
// stand-in. Time is virtual; every choice comes from one seeded generator, so a seed replays
// exactly. After every step of the core it checks the core's own invariants and the ones only
// the machine can see: at most one compile on the device, no charge refunded before its
// release was acknowledged or its process's exit confirmed, no leased shape evicted, every
// request answered exactly once, and, once faults stop, within its bound.
package simulation
