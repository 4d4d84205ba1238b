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

package residency

import (
	"context"
	"time"
)

// Worker is the owner's seam to one worker process (one generation of one loaded
// model). Every call is one request/reply exchange on the worker's single stream; the
// supervisor serialises them with the stream's mutex, so an implementation never sees two at
// once. A process-backed implementation and a hand-written fake implement it.
type Worker interface {
	// Admit compiles or loads every layer of rung and makes it resident.
	Admit(ctx context.Context, rung int) (Admission, error)
	// Evict releases rung; it returns once the worker acknowledged the release.
	Evict(ctx context.Context, rung int) error
	// Exchange runs one inference request on resident rung. The payload and the reply are
	// opaque to the supervisor (serialised protocol messages for a process worker).
	Exchange(ctx context.Context, rung int, payload []byte) ([]byte, error)
	// Inventory lists the rungs the worker holds resident.
	Inventory(ctx context.Context) ([]int, error)
	// Probe times the fastest of 5 evaluations of resident rung on the device and on a
	// CPU-only reference of the same artifact (the runtime placement probe).
	Probe(ctx context.Context, rung int) (device, cpu time.Duration, err error)
	// Close closes the worker's channel: it finishes and exits.
	Close() error
	// Kill ends the process.
	Kill() error
	// Exited is closed once the process's exit is confirmed (waited on).
	Exited() <-chan struct{}
}

// Spawner starts worker processes.
type Spawner interface {
	// Spawn starts generation gen of the model's worker and waits until it has loaded the
	// model. cached lists the rungs it reports held by aned (LOADED's optional
	// ane_cached_shapes; nil from an older worker).
	Spawn(ctx context.Context, spec ModelSpec, gen int64) (w Worker, cached []int, err error)
}
