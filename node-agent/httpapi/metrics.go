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

package httpapi

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	inflight *prometheus.GaugeVec
	routing  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synapse_agent_requests_total",
			Help: "API calls by lane (namespace/name), endpoint and result code (ok or the refusal code).",
		}, []string{"lane", "endpoint", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "synapse_agent_request_duration_seconds",
			Help:    "Latency of answered API calls, from arrival to the answer, by lane, endpoint and the largest bucket the call ran on.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"lane", "endpoint", "bucket"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "synapse_agent_requests_in_flight",
			Help: "API calls running or waiting on a lane (its queue depth).",
		}, []string{"lane"}),
	}
	m.routing = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "synapse_agent_routing_decisions_total",
		Help: "Routing decisions by reason, made before each call runs.",
	}, []string{"reason"})
	reg.MustRegister(m.requests, m.latency, m.inflight, m.routing)
	return m
}
