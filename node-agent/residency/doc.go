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

// Package residency is the direct-ANE residency supervisor's core: a deterministic state
// machine in the shape of etcd's raft. It keeps each loaded model's shapes resident within the
// machine-wide budget of layer executables, routes requests, runs the machine-wide compile
// queue through its single gate, evicts, hands a finished admission to the requests that joined
// it, probes, prewarms, retires models and recovers faulted workers.
//
// The core owns no goroutine, lock, clock or I/O. Its owner feeds it inputs through Step, each
// with the time of the owner's clock, and collects what to do through Ready: worker calls to
// start, answers to send, the view to publish and when to step it again. Every input that
// reports an outcome names the lane, worker generation and job or load it is about, and an
// outcome about anything else (an older generation, a finished job) changes nothing, so a late
// or repeated report can never refund twice, free the gate twice or hand out a shape that is
// gone.
//
// The one concurrent part is the lease fast path: requests lease a resident shape on the View
// the owner last published, with one atomic add on the shape's Cell, and release it with one
// more. The owner reads the same atomics to decide evictions and drains; a Cell it closes (for
// an eviction, a retirement or a faulted generation) can never be leased again, so a shape the
// owner decides to evict is never leased.
package residency
