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

package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Worker is the supervisor's seam to one worker process (one generation of one loaded
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

// Admission is what a worker reports for an admitted shape. The two counts are optional
// additions to protocol v3: an older worker omits them (nil), and the admission is then taken
// for a compile.
type Admission struct {
	CacheHitLayers *int
	CompiledLayers *int
}

// Spawner starts worker processes.
type Spawner interface {
	// Spawn starts generation gen of the model's worker and waits until it has loaded the
	// model. cached lists the rungs it reports held by aned (LOADED's optional
	// ane_cached_shapes; nil from an older worker).
	Spawn(ctx context.Context, spec ModelSpec, gen int64) (w Worker, cached []int, err error)
}

// WorkerError is an error the worker itself answered with: the exchange did not run, the
// stream is healthy and the worker is not restarted. Every other error from a Worker is a
// fault (I/O, a malformed reply, a bounded exchange that timed out): its outcome is unknown,
// and the worker goes through confirmed-exit recovery.
type WorkerError struct {
	// Code is the worker's machine-readable code, for example ane_resources_exhausted.
	Code    string
	Message string
}

func (e *WorkerError) Error() string { return fmt.Sprintf("worker refused: %s: %s", e.Code, e.Message) }

func isWorkerError(err error) bool {
	var we *WorkerError
	return errors.As(err, &we)
}

// ModelSpec is one model to keep resident: a lane on this node.
type ModelSpec struct {
	// Lane identifies the loaded model (its lane); each has its own worker generations.
	Lane string
	// Identity is the model's certified identity: workers of the same identity compile the
	// same programs, so they share cost measurements.
	Identity string
	// Model is the model's name; Dimensions the length of its output vectors.
	Model      string
	Dimensions int
	// Layers is the number of per-layer executables one shape charges.
	Layers int
	// Rungs is the ladder, ascending.
	Rungs []int
	// MaxResidentShapes caps the model's resident rungs; at the cap it evicts its own.
	MaxResidentShapes int
	// AdmissionBound bounds a request's wait for admission (at most 600 s).
	AdmissionBound time.Duration
	// ArtifactDir is the verified artifact the worker loads ("" for a worker that needs none).
	ArtifactDir string
	// Probe, when set, gates every loaded shape: before the shape's first lease is granted, the
	// runtime placement probe runs on it and Probe judges the measurement. An error refuses
	// that lease and every later one on the shape until it is loaded again, so no request runs
	// on a shape whose placement has not been checked.
	Probe func(rung int, gen int64, device, cpu time.Duration) error
}
