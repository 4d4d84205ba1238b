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

package worker

import (
	"errors"
	"fmt"
	"runtime"
)

// ErrANEUnavailable: the ane backend cannot run here. The worker never falls back to sim.
var ErrANEUnavailable = errors.New("the ane backend requires macOS on Apple silicon")

// NewANE returns the real Neural Engine backend; on this system there is none.
func NewANE() (Backend, error) {
	return nil, fmt.Errorf("%w (this worker runs on %s/%s); run the stand-in explicitly with --backend sim", ErrANEUnavailable, runtime.GOOS, runtime.GOARCH)
}
