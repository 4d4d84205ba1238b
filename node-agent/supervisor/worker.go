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

	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

type (
	// Worker is the seam to one worker process (residency.Worker).
	Worker = residency.Worker
	// Spawner starts worker processes (residency.Spawner).
	Spawner = residency.Spawner
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
