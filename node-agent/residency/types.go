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
	"errors"
	"fmt"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
)

const (
	// DefaultBudget is the machine-wide number of layer executables, pending admissions and
	// evictions included.
	DefaultBudget = 100
	// HandoffWindow is how long a finished admission's cohort keeps its shape protected.
	HandoffWindow = 250 * time.Millisecond
	// UnknownOutcomeGateHold bounds how long an admission of unknown outcome holds the compile
	// gate after its worker's restart began, if the old process's exit is not confirmed.
	UnknownOutcomeGateHold = 35 * time.Second
	// MinRetryAfter is the least retry time a shape_compiling answer gives (the queue's, which
	// keeps the compile for twice what it told).
	MinRetryAfter = compilequeue.MinRetryAfter
)

// Ticket identifies one slow-path request.
type Ticket = compilequeue.Ticket

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
	// on a shape whose placement has not been checked. The core never calls it; the owner does,
	// on its own goroutine as it applies the measurement: it must return at once and must not
	// wait for the supervisor.
	Probe func(rung int, gen int64, device, cpu time.Duration) error
}

func (s ModelSpec) fits(rung int) bool {
	for _, r := range s.Rungs {
		if r == rung {
			return true
		}
	}
	return false
}

// WorkerError is an error the worker itself answered with: the call did not run, the stream
// is healthy and the worker is not restarted. Every other error of a worker call is a fault (I/O,
// a malformed reply, a bounded call that timed out): its outcome is unknown, and the worker goes
// through confirmed-exit recovery.
type WorkerError struct {
	// Code is the worker's machine-readable code, for example ane_resources_exhausted.
	Code    string
	Message string
}

func (e *WorkerError) Error() string { return fmt.Sprintf("worker refused: %s: %s", e.Code, e.Message) }

// IsWorkerError reports whether err is the worker's own refusal rather than a fault.
func IsWorkerError(err error) bool {
	var we *WorkerError
	return errors.As(err, &we)
}

// Admission is what a worker reports for an admitted shape. The two counts are optional
// additions to protocol v3: an older worker omits them (nil), and the admission is then taken
// for a compile and its rung is not marked cached.
type Admission struct {
	CacheHitLayers *int
	CompiledLayers *int
}

// Counts are the core's lifetime counters.
type Counts struct {
	// Compiles and CacheLoads split the admissions: compiled, or loaded from aned's cache.
	Compiles, CacheLoads int
	// Evictions counts acknowledged releases; Restarts the replacement workers connected.
	Evictions, Restarts int
}

// Fault is a worker fault as the status reports it.
type Fault struct {
	Code    string
	Message string
	At      time.Time
}

// AdmissionProgress is an admission on the wire: its rung, the layers the worker reported
// done (0 from a worker that reports no progress), its layers, and when it is predicted done.
type AdmissionProgress struct {
	Rung                    int
	LayersDone, LayersTotal int
	Started, PredictedDone  time.Time
}

// PrewarmSummary reports a lane's background load of its prewarm rungs.
type PrewarmSummary struct {
	// State is Running, Finished or Cancelled.
	State string
	// Loaded are the rungs prewarm admitted; LoadedFromCache and Compiled split them.
	Loaded                    []int
	LoadedFromCache, Compiled int
	AlreadyResident           int
	SkippedForBudget          int
	Failed                    int
	Total                     time.Duration
}

// LaneSnapshot is what the agent reports of one loaded lane.
type LaneSnapshot struct {
	Generation int64
	// Loading: the first worker is starting. Running: the current generation's worker is
	// connected and serving. Recovering: it faulted and its replacement is not connected yet.
	// Retiring: it is being unloaded.
	Loading, Running, Recovering, Retiring bool
	// Resident are the resident rungs; Cached the rungs the worker reported held by aned.
	Resident, Cached []int
	// Admitting is the lane's admission on the wire, if any.
	Admitting *AdmissionProgress
	// LastFault is the most recent fault of any generation; Restarts counts the replacements
	// started after faults.
	LastFault *Fault
	Restarts  int
}

// NodeSnapshot is the machine-wide picture.
type NodeSnapshot struct {
	Budget, Used int
	// QueueLength counts the queued and running admissions; Running names the running one's
	// lane and rung; PredictedDrain is when the queue is predicted empty.
	QueueLength    int
	Running        string
	PredictedDrain time.Time
	Counts
}
