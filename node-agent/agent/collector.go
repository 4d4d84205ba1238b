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

package agent

import (
	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the supervisor's machine-wide and per-lane state at scrape time.
type collector struct {
	a                                          *Agent
	used, budget, queue, wait                  *prometheus.Desc
	compiles, cacheLoads, evictions, restarts  *prometheus.Desc
	resident, generation, laneRestarts, paused *prometheus.Desc
}

func newCollector(a *Agent) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("synapse_agent_"+name, help, labels, nil)
	}
	return &collector{a: a,
		used:         d("executables_in_use", "Layer executables charged: resident, admitting and evicting shapes."),
		budget:       d("executables_budget", "The machine's layer executables."),
		queue:        d("compile_queue_length", "Admissions queued or running in the machine-wide compile queue."),
		wait:         d("compile_queue_predicted_wait_seconds", "Predicted time until the compile queue is empty."),
		compiles:     d("admissions_compiled_total", "Admissions that compiled their layers."),
		cacheLoads:   d("admissions_cache_hits_total", "Admissions loaded from aned's cache without compiling."),
		evictions:    d("evictions_total", "Shapes released to make room, acknowledged by their worker."),
		restarts:     d("worker_restarts_total", "Replacement workers connected after faults."),
		resident:     d("resident_shapes", "Resident shapes per lane.", "lane"),
		generation:   d("worker_generation", "The current worker generation per lane.", "lane"),
		laneRestarts: d("lane_worker_restarts_total", "Replacement workers per lane.", "lane"),
		paused:       d("paused", "1 while the node is paused."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.used, c.budget, c.queue, c.wait, c.compiles, c.cacheLoads, c.evictions, c.restarts,
		c.resident, c.generation, c.laneRestarts, c.paused} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	sup := c.a.sup
	n := sup.Node()
	now := c.a.cfg.Clock.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	gauge(c.used, float64(n.Used))
	gauge(c.budget, float64(n.Budget))
	gauge(c.queue, float64(n.QueueLength))
	wait := 0.0
	if !n.PredictedDrain.IsZero() {
		wait = max(n.PredictedDrain.Sub(now).Seconds(), 0)
	}
	gauge(c.wait, wait)
	counter(c.compiles, float64(n.Compiles))
	counter(c.cacheLoads, float64(n.CacheLoads))
	counter(c.evictions, float64(n.Evictions))
	counter(c.restarts, float64(n.Restarts))
	for _, lane := range sup.Lanes() {
		snap, ok := sup.Snapshot(lane)
		if !ok {
			continue
		}
		gauge(c.resident, float64(len(snap.Resident)), lane)
		gauge(c.generation, float64(snap.Generation), lane)
		counter(c.laneRestarts, float64(snap.Restarts), lane)
	}
	p := 0.0
	if c.a.isPaused() {
		p = 1
	}
	gauge(c.paused, p)
}
