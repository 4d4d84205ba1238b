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

// Package compilequeue holds the decisions of the machine-wide Neural Engine compile queue:
// what a shape admission is predicted to cost, in which order queued admissions start, when a
// waiting request is answered shape_compiling, and when a compile nobody waits for is dropped.
//
// Apple's compiler serves one layer at a time for the whole machine, so compiles run side by
// side gain no throughput and make a small shape wait one wide layer per layer of its own. At
// most one cold compile runs at a time; queued ones start in order of a fixed start key,
// arrival plus predicted cost, so cheap compiles go first and a wide compile is passed only by
// compiles that arrive less than its own cost after it.
//
// The package is pure: it holds no goroutines and reads no clock. The supervisor's scheduler
// goroutine, which owns the queue, passes the time of its injected clock into every call.
package compilequeue
