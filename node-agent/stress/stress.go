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

// Package stress is the residency stress tool's engine: it runs the seed's three cases
// against real sim worker processes under the supervisor and the serving path, and writes a
// schema 2 report with a payload-free admission timeline.
//
//   - residency-safety: 37 concurrent requests, checked for numbers, leased evictions, budget,
//     overlapping compiles and resource refusals; it must pass.
//   - cold-throughput: the same workload as characterisation: completions, errors, wall time.
//   - compile-scheduling: each model alone, a small shape beside a wide one, six shapes at
//     once, and a request the queue refuses early; no two compiles may overlap and no resource
//     refusal may occur; latencies are reported against the standalone times.
package stress

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/serving"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

// Cases the tool runs.
var Cases = []string{"residency-safety", "cold-throughput", "compile-scheduling"}

// Config configures a run.
type Config struct {
	Case         string
	WorkerBinary string
	// StateDir holds each scenario's own (cold) aned cache.
	StateDir string
	// Scale multiplies the sim's compile and load times; 1 is seed scale.
	Scale float64
	// AdmissionBound is the test-only admission-wait backstop (the seed's 2100 s), not a
	// production deadline change.
	AdmissionBound time.Duration
	// ProgramLimit, if set, is the stand-in device's machine-wide program limit (120 if zero):
	// set it under the supervisor's budget and the no-resource-refusal check must fire.
	ProgramLimit int
	Log          logr.Logger
}

// Report is the schema 2 report.
type Report struct {
	Schema          int             `json:"schema"`
	Case            string          `json:"case"`
	WallMs          float64         `json:"wall_ms"`
	AdmissionBoundS float64         `json:"admission_bound_s"`
	SimScale        float64         `json:"sim_scale"`
	Requests        []RequestRecord `json:"requests"`
	Timeline        []TimelineEvent `json:"timeline"`
	Latencies       []Latency       `json:"latencies,omitempty"`
	Checks          []Check         `json:"checks"`
	Passed          bool            `json:"passed"`
}

// RequestRecord is one request's outcome.
type RequestRecord struct {
	ID      string  `json:"id"`
	Model   string  `json:"model"`
	Tokens  int     `json:"tokens"`
	Outcome string  `json:"outcome"`
	Ms      float64 `json:"ms"`
	Buckets []int   `json:"buckets,omitempty"`
}

// TimelineEvent is one payload-free timeline entry, in monotonic milliseconds since the start.
type TimelineEvent struct {
	Ms        float64 `json:"t_ms"`
	Event     string  `json:"event"`
	RequestID string  `json:"request_id,omitempty"`
	Model     string  `json:"model"`
	Shape     int     `json:"shape"`
	Ticket    uint64  `json:"ticket,omitempty"`
	RPC       string  `json:"rpc,omitempty"`
	// Riders are the other requests an exchange carried parts of.
	Riders []string `json:"riders,omitempty"`
	// Charge is what a reservation, an eviction's acknowledgement or a refund moved; Used the
	// executables charged after it.
	Charge int `json:"charge,omitempty"`
	Used   int `json:"used,omitempty"`
	// at orders the timeline exactly (the milliseconds above are rounded).
	at time.Duration
}

// Latency compares a scenario's request with its standalone time.
type Latency struct {
	Scenario     string  `json:"scenario"`
	RequestID    string  `json:"request_id"`
	Ms           float64 `json:"ms"`
	StandaloneMs float64 `json:"standalone_ms,omitempty"`
}

// Check is one assertion of the case.
type Check struct {
	Name   string `json:"name"`
	Passed bool   `json:"passed"`
	Detail string `json:"detail,omitempty"`
}

// model is a catalog model of the seed.
type model struct {
	lane, identity    string
	layers, dims, max int
}

// layersOf is what one shape of each lane charges, known to the stress tool apart from the
// supervisor: the budget check recomputes the charges from it.
var layersOf = map[string]int{gte.lane: gte.layers, qwen.lane: qwen.layers}

var (
	gte   = model{"gte-modernbert-base", "gte-modernbert-base", 22, 768, 4}
	qwen  = model{"qwen3-embedding-0.6b", "qwen3-embedding-0.6b", 28, 1024, 3}
	rungs = []int{128, 256, 512, 1024, 2048, 4096, 8192}
)

// rig is one supervisor, its workers and the serving path, with the timeline recorder.
type rig struct {
	cfg     Config
	start   time.Time
	sup     *supervisor.Supervisor
	srv     *serving.Server
	stop    func()
	mu      sync.Mutex
	events  []TimelineEvent
	records []RequestRecord
}

func newRig(ctx context.Context, cfg Config, dir string, start time.Time) (*rig, error) {
	r := &rig{cfg: cfg, start: start}
	host := workerhost.New(workerhost.Config{Binary: cfg.WorkerBinary, Backend: "sim", StateDir: dir, SimScale: cfg.Scale, Log: cfg.Log,
		Env: func(string, int64) []string {
			if cfg.ProgramLimit == 0 {
				return nil
			}
			return []string{fmt.Sprintf("SYNAPSE_SIM_PROGRAM_LIMIT=%d", cfg.ProgramLimit)}
		}})
	r.sup = supervisor.New(supervisor.Config{Clock: clock.RealClock{}, Spawner: host, Log: cfg.Log, Trace: r.record})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.sup.Run(rctx) }()
	r.stop = func() { cancel(); <-done }
	r.srv = serving.New(serving.Supervised(r.sup), clock.RealClock{})
	for _, m := range []model{gte, qwen} {
		spec := supervisor.ModelSpec{Lane: m.lane, Identity: m.identity, Model: m.identity, Dimensions: m.dims, Layers: m.layers,
			Rungs: rungs, MaxResidentShapes: m.max, AdmissionBound: cfg.AdmissionBound}
		if err := r.sup.LoadModel(ctx, spec); err != nil {
			r.close(ctx)
			return nil, err
		}
		r.srv.AddLane(serving.Lane{Name: m.lane, Task: "embed", Rungs: rungs, Ceiling: rungs[len(rungs)-1], Dimensions: m.dims})
	}
	return r, nil
}

func (r *rig) close(ctx context.Context) {
	for _, m := range []model{gte, qwen} {
		_ = r.sup.Retire(ctx, m.lane)
	}
	r.stop()
}

func (r *rig) record(e supervisor.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, TimelineEvent{Ms: ms(e.At.Sub(r.start)), Event: string(e.Kind), RequestID: e.RequestID,
		Model: e.Lane, Shape: e.Rung, Ticket: e.Ticket, RPC: e.RPC, Riders: e.Riders, Charge: e.Charge, Used: e.Used, at: e.At.Sub(r.start)})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// request runs one embedding request, retrying shape_compiling after its retry time as a
// client does, and checks its numbers.
func (r *rig) request(ctx context.Context, id string, m model, tokens int, deadline time.Time, retry bool) (RequestRecord, [][]float32, error) {
	seq := make([]uint32, tokens)
	for i := range seq {
		seq[i] = uint32(1000 + (i*7+tokens)%30000)
	}
	began := time.Now()
	rec := RequestRecord{ID: id, Model: m.lane, Tokens: tokens}
	var res *serving.Result
	var err error
	for attempt := 0; ; attempt++ {
		res, err = r.srv.Run(supervisor.WithRequestID(ctx, id), m.lane, "embed", [][]uint32{seq}, deadline)
		var rf *refusal.Error
		if !retry || attempt >= 3 || !errors.As(err, &rf) || rf.Code != refusal.ShapeCompiling {
			break
		}
		time.Sleep(rf.RetryAfter)
	}
	rec.Ms = ms(time.Since(began))
	if err != nil {
		rec.Outcome = string(refusal.CodeOf(err))
		if rec.Outcome == "" {
			rec.Outcome = err.Error()
		}
	} else {
		rec.Outcome, rec.Buckets = "ok", res.Buckets
		want := worker.Embed(m.identity, m.dims, seq)
		if !slices.Equal(res.Vectors[0], want) {
			err = fmt.Errorf("request %s: the vector is not the model's embedding of its input", id)
		}
	}
	r.mu.Lock()
	r.records = append(r.records, rec)
	r.mu.Unlock()
	var vecs [][]float32
	if res != nil {
		vecs = res.Vectors
	}
	return rec, vecs, err
}

// Run runs one case.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.AdmissionBound == 0 {
		cfg.AdmissionBound = 2100 * time.Second
	}
	rep := &Report{Schema: 2, Case: cfg.Case, AdmissionBoundS: cfg.AdmissionBound.Seconds(), SimScale: cfg.Scale}
	start := time.Now()
	var rigs []*rig
	var err error
	switch cfg.Case {
	case "residency-safety", "cold-throughput":
		rigs, err = residency(ctx, cfg, rep, start)
	case "compile-scheduling":
		rigs, err = scheduling(ctx, cfg, rep, start)
	default:
		return nil, fmt.Errorf("unknown case %q; the cases are %v", cfg.Case, Cases)
	}
	rep.WallMs = ms(time.Since(start))
	for _, r := range rigs {
		rep.Timeline = append(rep.Timeline, r.events...)
		rep.Requests = append(rep.Requests, r.records...)
	}
	slices.SortStableFunc(rep.Timeline, func(a, b TimelineEvent) int { return cmp.Compare(a.at, b.at) })
	if err != nil {
		return rep, err
	}
	rep.Checks = append(rep.Checks, noOverlappingCompiles(rep.Timeline), noResourceRefusal(rep.Requests))
	if cfg.Case == "residency-safety" {
		rep.Checks = append(rep.Checks, noLeasedEviction(rep.Timeline), budgetHeld(rep.Timeline, supervisor.DefaultBudget, layersOf),
			everyRequestServed(rep.Requests, 37))
	}
	rep.Passed = true
	if cfg.Case != "cold-throughput" {
		for _, c := range rep.Checks {
			rep.Passed = rep.Passed && c.Passed
		}
	}
	return rep, nil
}

func compare(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// residencyWorkload is the 37 requests: both models, lengths across the ladder, deterministic.
func residencyWorkload() []struct {
	m      model
	tokens int
} {
	lengths := []int{17, 100, 200, 300, 500, 700, 1000, 1500, 2000, 3000, 60, 129}
	var out []struct {
		m      model
		tokens int
	}
	for i := range 37 {
		m := gte
		if i%3 == 1 {
			m = qwen
		}
		out = append(out, struct {
			m      model
			tokens int
		}{m, lengths[(i*5)%len(lengths)]})
	}
	return out
}

func residency(ctx context.Context, cfg Config, rep *Report, start time.Time) ([]*rig, error) {
	r, err := newRig(ctx, cfg, cfg.StateDir+"/"+cfg.Case, start)
	if err != nil {
		return nil, err
	}
	defer r.close(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var numeric []string
	for i, w := range residencyWorkload() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, vecs, err := r.request(ctx, fmt.Sprintf("r%02d", i), w.m, w.tokens, time.Time{}, true)
			if err == nil && len(vecs) == 1 {
				var norm float64
				for _, v := range vecs[0] {
					norm += float64(v) * float64(v)
				}
				if math.Abs(norm-1) > 1e-4 {
					err = fmt.Errorf("r%02d: norm %v", i, norm)
				}
			}
			if err != nil && refusal.CodeOf(err) == "" {
				mu.Lock()
				numeric = append(numeric, err.Error())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	rep.Checks = append(rep.Checks, Check{Name: "numerical", Passed: len(numeric) == 0, Detail: fmt.Sprint(numeric)})
	return []*rig{r}, nil
}
