//go:build !(darwin && arm64)

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

package main

import (
	"fmt"
	"runtime"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
)

// run refuses: the ladder drives the Neural Engine, which only macOS on Apple silicon has.
func run(options) (bool, error) {
	return false, fmt.Errorf("%w: this is %s/%s; run make ane-smoke on a Mac with Apple silicon (a virtual machine has no Neural Engine either)",
		ane.ErrUnsupported, runtime.GOOS, runtime.GOARCH)
}
