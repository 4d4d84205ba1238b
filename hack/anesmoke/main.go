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

// Command anesmoke is `make ane-smoke`: run by a Mac owner on real hardware, it compiles one
// tiny transformer layer (a Qwen3-style layer with random weights: norms, grouped-query
// attention with the rotary embedding, a SwiGLU MLP) on the Neural Engine, checks that aned
// holds it on a second build of the same program, evaluates it against the CPU reference, and
// prints the timings. Anywhere else it says why it cannot run.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "ane-smoke:", err)
		os.Exit(1)
	}
}
