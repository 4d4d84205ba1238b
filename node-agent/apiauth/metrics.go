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

package apiauth

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	authn, authz *prometheus.CounterVec
	reviews      *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		authn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synapse_agent_authentications_total",
			Help: "Calls authenticated, by result: authenticated, rejected (a token the API server refused), no_token, error (no review could be made).",
		}, []string{"result"}),
		authz: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synapse_agent_authorizations_total",
			Help: "Authorization decisions, by result: allowed, denied, error (no review could be made).",
		}, []string{"result"}),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "synapse_agent_auth_reviews_total",
			Help: "Reviews asked of the API server (TokenReview, SubjectAccessReview), by result (ok, error), calls refused a review because too many were in flight (review none, result busy), and tokens not known good refused a review because the refusals' budget is spent (review none, result throttled); decisions not asked again come from the caches.",
		}, []string{"review", "result"}),
	}
	return m
}

func (m *metrics) describe(ch chan<- *prometheus.Desc) {
	m.authn.Describe(ch)
	m.authz.Describe(ch)
	m.reviews.Describe(ch)
}

func (m *metrics) collect(ch chan<- prometheus.Metric) {
	m.authn.Collect(ch)
	m.authz.Collect(ch)
	m.reviews.Collect(ch)
}

func (m *metrics) reviewed(review string, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.reviews.WithLabelValues(review, result).Inc()
}
