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
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// LaneSnapshot is what the agent reports of one loaded lane.
type LaneSnapshot struct {
	Generation int64
	// Running: the current generation's worker is connected and serving. Recovering: it
	// faulted and its replacement is not connected yet. Retiring: it is being unloaded.
	Running, Recovering, Retiring bool
	// Resident are the resident rungs; Cached the rungs the worker reported held by aned.
	Resident, Cached []int
	// Admitting is the lane's admission on the wire, if any.
	Admitting *AdmissionProgress
	// LastFault is the most recent fault of any generation; Restarts counts the replacements
	// started after faults.
	LastFault *Fault
	Restarts  int
}

// AdmissionProgress is an admission on the wire: its rung, the layers the worker reported
// done (0 from a worker that reports no progress), its layers, and when it is predicted done.
type AdmissionProgress struct {
	Rung                    int
	LayersDone, LayersTotal int
	Started, PredictedDone  time.Time
}

// Fault is a worker fault as the status reports it.
type Fault struct {
	Code    string
	Message string
	At      time.Time
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

// Counts are the supervisor's lifetime counters.
type Counts struct {
	// Compiles and CacheLoads split the admissions: compiled, or loaded from aned's cache.
	Compiles, CacheLoads int
	// Evictions counts acknowledged releases; Restarts the replacement workers connected.
	Evictions, Restarts int
}

// Snapshot returns lane's state, and false if it is not loaded.
func (s *Supervisor) Snapshot(lane string) (LaneSnapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[lane]
	if m == nil {
		return LaneSnapshot{}, false
	}
	out := LaneSnapshot{
		Generation: m.gen,
		Running:    m.state == running,
		Recovering: m.state == recovering,
		Retiring:   m.state == retiring || m.state == retired,
		Restarts:   m.restarts,
	}
	for r, sh := range m.shapes {
		if sh.state == resident {
			out.Resident = append(out.Resident, r)
		}
	}
	for r := range m.cached {
		out.Cached = append(out.Cached, r)
	}
	slices.Sort(out.Resident)
	slices.Sort(out.Cached)
	if m.admitting != nil {
		a := m.admitting.AdmissionProgress
		a.LayersDone = int(m.admitting.done.Load())
		out.Admitting = &a
	}
	if m.lastFault != nil {
		f := *m.lastFault
		out.LastFault = &f
	}
	return out, true
}

// Lanes lists the loaded lanes.
func (s *Supervisor) Lanes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.models))
	for lane := range s.models {
		out = append(out, lane)
	}
	slices.Sort(out)
	return out
}

// Node returns the machine-wide picture.
func (s *Supervisor) Node() NodeSnapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clk.Now()
	out := NodeSnapshot{Budget: s.budget, Used: s.used, QueueLength: s.queue.Len(), Counts: s.counts}
	drain := now
	if j := s.queue.Running(); j != nil {
		out.Running = j.Owner + "@" + strconv.Itoa(j.Shape.Rung)
		if m := s.models[j.Owner]; m != nil && m.admitting != nil {
			drain = maxTime(drain, m.admitting.PredictedDone)
		}
	}
	for _, j := range s.queue.Queued() {
		drain = drain.Add(j.Prediction.Cost)
	}
	if out.QueueLength > 0 {
		out.PredictedDrain = drain
	}
	return out
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// admissionState is a model's admission on the wire; done is written by the worker's
// goroutine as it reports layers.
type admissionState struct {
	AdmissionProgress
	done atomic.Int32
}

type progressKey struct{}

// ReportProgress is how a Worker's Admit reports layers done: the supervisor puts a sink in
// the admission's context. It does nothing for a context without one.
func ReportProgress(ctx context.Context, layersDone int) {
	if st, ok := ctx.Value(progressKey{}).(*admissionState); ok {
		st.done.Store(int32(layersDone))
	}
}

func withProgress(ctx context.Context, st *admissionState) context.Context {
	return context.WithValue(ctx, progressKey{}, st)
}
