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
	"sync"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
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

// Spawner starts worker processes.
type Spawner interface {
	// Spawn starts generation gen of the model's worker and waits until it has loaded the
	// model. cached lists the rungs it reports held by aned (LOADED's optional
	// ane_cached_shapes; nil from an older worker).
	Spawn(ctx context.Context, spec ModelSpec, gen int64) (w Worker, cached []int, err error)
}

type (
	// ModelSpec is one model to keep resident: a lane on this node.
	ModelSpec = residency.ModelSpec
	// Admission is what a worker reports for an admitted shape.
	Admission = residency.Admission
	// WorkerError is an error the worker itself answered with: the call did not run and the
	// worker is not restarted. Every other error of a Worker is a fault.
	WorkerError = residency.WorkerError
	// LaneSnapshot is what the agent reports of one loaded lane.
	LaneSnapshot = residency.LaneSnapshot
	// NodeSnapshot is the machine-wide picture.
	NodeSnapshot = residency.NodeSnapshot
	// AdmissionProgress is an admission on the wire.
	AdmissionProgress = residency.AdmissionProgress
	// Fault is a worker fault as the status reports it.
	Fault = residency.Fault
	// Counts are the supervisor's lifetime counters.
	Counts = residency.Counts
	// PrewarmSummary reports a lane's background load of its prewarm rungs.
	PrewarmSummary = residency.PrewarmSummary
)

// stream is a worker's single request/reply channel: every exchange holds mu for its whole
// request and reply. The generation counts who holds or waits for it, as a hint for eviction.
type stream struct {
	mu  sync.Mutex
	w   Worker
	gen *residency.Gen
}

// do runs one exchange on the stream.
func (st *stream) do(f func(Worker) error) error {
	st.gen.Enter()
	defer st.gen.Exit()
	st.mu.Lock()
	defer st.mu.Unlock()
	return f(st.w)
}

func streamOf(g *residency.Gen) *stream { return g.Conn.(*stream) }

type progressKey struct{}

// ReportProgress is how a Worker's Admit reports layers done: the supervisor puts a sink in
// the admission's context. It does nothing for a context without one.
func ReportProgress(ctx context.Context, layersDone int) {
	if p, ok := ctx.Value(progressKey{}).(*residency.Progress); ok {
		p.Report(layersDone)
	}
}

func withProgress(ctx context.Context, p *residency.Progress) context.Context {
	return context.WithValue(ctx, progressKey{}, p)
}
