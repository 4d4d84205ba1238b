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

package compilequeue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// traceJob is one admission of a replayed trace.
type traceJob struct {
	arrival time.Duration
	req     Request
	cost    time.Duration
}

// seedTrace is a deterministic trace of n admissions with the seed's calibrated costs: models
// of 22 and 28 layers, rungs 128 to 8192, a third of them cached in aned (loads of 3.5 to
// 45 ms a layer), arriving as a Poisson stream at about 80% utilisation.
func seedTrace(n int, seed uint64) []traceJob {
	rng := rand.New(rand.NewPCG(seed, 1))
	costs := NewCostModel()
	rungs := []int{128, 256, 512, 1024, 2048, 4096, 8192}
	var jobs []traceJob
	var total time.Duration
	for i := range n {
		model, layers := "gte-modernbert-base", 22
		if rng.IntN(2) == 1 {
			model, layers = "qwen3-embedding-0.6b", 28
		}
		// Small rungs are asked for more often than wide ones.
		rung := rungs[min(rng.IntN(4)+rng.IntN(4), len(rungs)-1)]
		cached := rng.IntN(3) == 0
		r := Request{Ticket: Ticket(i + 1), Owner: fmt.Sprintf("w%d", i), Shape: Shape{model, rung},
			Layers: layers, Cached: cached, Bound: 1000 * time.Hour}
		c := costs.Predict(r.Shape, layers, cached).Cost
		jobs = append(jobs, traceJob{req: r, cost: c})
		total += c
	}
	mean := float64(total) / float64(n) / 0.8
	var t time.Duration
	for i := range jobs {
		jobs[i].arrival = t
		t += time.Duration(rng.ExpFloat64() * mean)
	}
	return jobs
}

// replay runs the trace through the queue on a virtual clock and returns each job's flow time
// (completion minus arrival), in trace order.
func replay(jobs []traceJob) []time.Duration {
	q := New(NewCostModel())
	flow := make([]time.Duration, len(jobs))
	index := map[string]int{}
	for i, j := range jobs {
		index[j.req.Owner] = i
	}
	now, next := t0, 0
	var running *Job
	var runningEnd time.Time
	for next < len(jobs) || q.Len() > 0 {
		// Advance to the next event: an arrival, the running job's end, or the head's hold.
		var wake time.Time
		if running == nil {
			var j *Job
			j, _, wake = q.Elect(now)
			if j != nil {
				q.Start(now, j)
				running, runningEnd = j, now.Add(jobs[index[j.Owner]].cost)
				continue
			}
		}
		events := []time.Time{}
		if next < len(jobs) {
			events = append(events, t0.Add(jobs[next].arrival))
		}
		if running != nil {
			events = append(events, runningEnd)
		}
		if !wake.IsZero() {
			events = append(events, wake)
		}
		now = slices.MinFunc(events, func(a, b time.Time) int { return a.Compare(b) })
		if running != nil && !runningEnd.After(now) {
			i := index[running.Owner]
			flow[i] = now.Sub(t0.Add(jobs[i].arrival))
			q.Finish(running)
			running = nil
		}
		for next < len(jobs) && !t0.Add(jobs[next].arrival).After(now) {
			q.Submit(now, jobs[next].req)
			next++
		}
	}
	return flow
}

// fifo serves the trace in arrival order, one at a time.
func fifo(jobs []traceJob) []time.Duration {
	flow := make([]time.Duration, len(jobs))
	var free time.Duration
	for i, j := range jobs {
		start := max(free, j.arrival)
		free = start + j.cost
		flow[i] = free - j.arrival
	}
	return flow
}

// srpt is preemptive shortest-remaining-processing-time on one machine: the optimal total
// flow time, a lower bound no non-preemptive schedule beats.
func srpt(jobs []traceJob) []time.Duration {
	flow := make([]time.Duration, len(jobs))
	remaining := map[int]time.Duration{}
	now, next := time.Duration(0), 0
	for next < len(jobs) || len(remaining) > 0 {
		if len(remaining) == 0 {
			now = max(now, jobs[next].arrival)
		}
		for next < len(jobs) && jobs[next].arrival <= now {
			remaining[next] = jobs[next].cost
			next++
		}
		cur := -1
		for i, r := range remaining {
			if cur < 0 || r < remaining[cur] || (r == remaining[cur] && i < cur) {
				cur = i
			}
		}
		run := remaining[cur]
		if next < len(jobs) && jobs[next].arrival-now < run {
			run = jobs[next].arrival - now
		}
		now += run
		remaining[cur] -= run
		if remaining[cur] == 0 {
			delete(remaining, cur)
			flow[cur] = now - jobs[cur].arrival
		}
	}
	return flow
}

func sum(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s
}

// BenchmarkCompileTrace replays a seed-calibrated trace and reports total flow time over the
// preemptive-SRPT lower bound, for this queue and for plain FIFO, and how long a small shape
// asked beside a wide one takes against its standalone compile time.
func BenchmarkCompileTrace(b *testing.B) {
	jobs := seedTrace(200, 42)
	lower := sum(srpt(jobs))
	var ours []time.Duration
	for b.Loop() {
		ours = replay(jobs)
	}
	b.ReportMetric(float64(sum(ours))/float64(lower), "queue/srpt")
	b.ReportMetric(float64(sum(fifo(jobs)))/float64(lower), "fifo/srpt")

	costs := NewCostModel()
	wide := Request{Ticket: 1, Owner: "w1", Shape: Shape{"qwen3-embedding-0.6b", 4096}, Layers: 28, Bound: time.Hour}
	small := Request{Ticket: 2, Owner: "w2", Shape: Shape{"gte-modernbert-base", 128}, Layers: 22, Bound: time.Hour}
	standalone := costs.Predict(small.Shape, 22, false).Cost
	pair := []traceJob{
		{arrival: 0, req: wide, cost: costs.Predict(wide.Shape, 28, false).Cost},
		{arrival: 10 * time.Millisecond, req: small, cost: standalone},
	}
	b.ReportMetric(float64(replay(pair)[1])/float64(standalone), "small-beside-wide/standalone")
	b.ReportMetric(float64(fifo(pair)[1])/float64(standalone), "small-beside-wide-fifo/standalone")
}

// TestTraceReplayBeatsFIFOAndNeverBeatsTheLowerBound checks the replay harness itself: SRPT is
// a lower bound, and on a trace of mixed sizes start-key order beats arrival order.
func TestTraceReplayBeatsFIFOAndNeverBeatsTheLowerBound(t *testing.T) {
	jobs := seedTrace(200, 42)
	ours, lower, plain := sum(replay(jobs)), sum(srpt(jobs)), sum(fifo(jobs))
	if ours < lower || plain < lower {
		t.Fatalf("a schedule beat the SRPT lower bound: ours %v, fifo %v, srpt %v", ours, plain, lower)
	}
	if ours >= plain {
		t.Fatalf("start-key order (%v) is no better than FIFO (%v)", ours, plain)
	}
}
