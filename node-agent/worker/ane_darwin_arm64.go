//go:build darwin && arm64

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

import "errors"

// ErrANEUnavailable: the ane backend cannot run here. The worker never falls back to sim.
var ErrANEUnavailable = errors.New("the ane backend is not built yet: the purego binding to the Neural Engine lands with its own issue")

// NewANE returns the real Neural Engine backend. Until the binding lands it refuses to start,
// so that nothing runs on the stand-in while claiming the Neural Engine.
func NewANE() (Backend, error) { return nil, ErrANEUnavailable }
