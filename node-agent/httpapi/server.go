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

// Package httpapi is the agent's HTTP API: OpenAI-compatible embeddings, rerank in the shape
// Cohere, Jina and TEI clients use, health, readiness and Prometheus metrics; the
// admin calls are a handler of their own (NewAdmin), which the agent serves only on a local
// socket.
// It decodes and checks a request, tokenises it, runs it on the lane through serving, and says
// in every answer where it ran. Every refusal is typed: a machine-readable code, the right
// status, and for a compiling shape the time to retry.
package httpapi

import (
	"context"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/serving"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

// MaxBodyBytes bounds a request body; a larger one is refused with 413.
const MaxBodyBytes = 32 << 20

// Lane is what the API needs of a lane served on this node.
type Lane struct {
	// Namespace and Name are the CatalogLane's; Key is the lane's name in serving; Model the
	// model it serves.
	Namespace, Name, Key, Model string
	Task                        string
	// Device is the worker backend that computes the lane's answers, as every answer says it:
	// ane (the Neural Engine) or sim (the stand-in), never the lane's device for the stand-in.
	Device string
	// Rungs are the lane's buckets, ascending; Ceiling the longest input it takes.
	Rungs      []int
	Ceiling    int
	Dimensions int
	// VectorSpace is the lane's identity's vectorSpaceID: lanes of one model in different
	// spaces are never chosen between for a caller who named only the model.
	VectorSpace string
	// Tokenizer encodes text for this lane (nil: token ids only); each lane uses its own.
	Tokenizer tokenizer.Tokenizer
	// Deadline bounds a request from its arrival (the lane's requestDeadlineSeconds).
	Deadline time.Duration
	// MaxBatchTokens bounds the tokens of one call (DefaultMaxBatchTokens if zero; never below
	// the ceiling); a call over it is refused batch_too_large (413) while its inputs are read.
	MaxBatchTokens int
	// Resident, if set, lists the buckets resident now (routing prefers them among equals).
	Resident func() []int
}

// Catalog resolves a request's model to the lanes of this node that may serve it: the lane it
// names ("<namespace>/<lane>", or a lane name unique on the node; byName), or else every lane
// of that model, among which the API routes. It answers with a refusal when there is none.
type Catalog interface {
	Lookup(model string) (lanes []Lane, byName bool, err error)
	// Lanes lists every lane placed on the node, servable now or not, in no order.
	Lanes() []Lane
}

// Runner runs composed calls (serving.Server).
type Runner interface {
	Run(ctx context.Context, lane, task string, sequences [][]uint32, deadline time.Time) (*serving.Result, error)
}

// Config configures the API.
type Config struct {
	// Node is this node's name, reported with every answer.
	Node    string
	Catalog Catalog
	Runner  Runner
	Clock   clock.Clock
	// Log receives what answers leave out: the whole error of a call that failed on the node.
	Log logr.Logger
	// Ready reports whether the agent serves (nil: ready); /readyz answers 503 with its error.
	Ready func() error
	// Registry holds the API's metrics and is served on /metrics with everything else
	// registered in it.
	Registry *prometheus.Registry
	// Auth lets calls in (nil: none is, but the probes).
	Auth Auth
	// Work bounds the calls parsing and tokenising at once (zero: the defaults).
	Work WorkLimits
}

// Server is the HTTP API.
type Server struct {
	cfg     Config
	metrics *metrics
	mux     *http.ServeMux
	work    *workGate
}

// New returns the API and registers its metrics in cfg.Registry.
func New(cfg Config) *Server {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, metrics: newMetrics(cfg.Registry), mux: http.NewServeMux(), work: newWorkGate(cfg.Work, cfg.Clock)}
	s.mux.HandleFunc("POST /v1/embeddings", s.embeddings)
	s.mux.HandleFunc("POST /v1/rerank", s.rerank)
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	s.mux.HandleFunc("GET /readyz", s.readyz)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry}))
	return s
}

// ServeHTTP implements http.Handler: unknown paths and methods get a typed JSON error too.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// A call's deadline runs from its arrival: the review of its token, its authorization and
	// every wait after count against it.
	if !s.admit(w, &r, s.cfg.Clock.Now()) {
		return
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		code, status := "not_found", http.StatusNotFound
		if _, p := s.mux.Handler(withMethod(r, http.MethodPost)); p != "" {
			code, status = "method_not_allowed", http.StatusMethodNotAllowed
		} else if _, p := s.mux.Handler(withMethod(r, http.MethodGet)); p != "" {
			code, status = "method_not_allowed", http.StatusMethodNotAllowed
		}
		writeError(w, &apiError{status: status, code: code, message: r.Method + " " + r.URL.Path + " is not served here"})
		return
	}
	h.ServeHTTP(w, r)
}

func withMethod(r *http.Request, m string) *http.Request {
	c := r.Clone(r.Context())
	c.Method = m
	return c
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if s.cfg.Ready != nil {
		if err := s.cfg.Ready(); err != nil {
			w.Header().Set("Retry-After", "1") // defaultRetryAfter: readiness comes back when it does
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	_, _ = w.Write([]byte("ok\n"))
}
