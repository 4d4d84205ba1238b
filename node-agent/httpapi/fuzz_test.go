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

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/internal/workertest"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/serving"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

// workerBinary is synapse-ane-worker, built once for the package's tests.
var workerBinary string

func TestMain(m *testing.M) { os.Exit(workertest.Main(m, &workerBinary)) }

const fuzzDims = 32

// laneCatalog serves the given lanes by name ("<namespace>/<name>" or the name).
type laneCatalog []Lane

func (c laneCatalog) Lookup(model string) ([]Lane, bool, error) {
	for _, l := range c {
		if model == l.Key || model == l.Name {
			return []Lane{l}, true, nil
		}
	}
	return nil, false, refusal.New(refusal.UnknownLane, model, "no such lane on this node")
}

func (c laneCatalog) Lanes() []Lane { return c }

// realLanes serves one lane per task through the real API, serving, the residency supervisor and
// one real sim worker process per lane. Its lanes take 128 tokens an input and 1024 a call, so
// small bodies reach every limit.
func realLanes(tb testing.TB, tasks ...string) (*Server, *supervisor.Supervisor, []string) {
	tb.Helper()
	clk := clock.RealClock{}
	host := workerhost.New(workerhost.Config{Binary: workerBinary, Backend: "sim", StateDir: tb.TempDir(), SimScale: 1e-6, Log: logr.Discard(), Clock: clk})
	sup := supervisor.New(supervisor.Config{Clock: clk, Spawner: host, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sup.Run(ctx) }()
	srv := serving.New(serving.Supervised(sup), clk)
	var cat laneCatalog
	var keys []string
	tb.Cleanup(func() {
		for _, k := range keys {
			_ = sup.Retire(context.Background(), k)
		}
		cancel()
		<-done
	})
	rungs := []int{32, 128}
	for _, task := range tasks {
		name := "fuzz-" + task
		key := "default/" + name
		if err := sup.LoadModel(ctx, supervisor.ModelSpec{Lane: key, Identity: name, Model: name, Dimensions: fuzzDims, Layers: 1,
			Rungs: rungs, MaxResidentShapes: 2, AdmissionBound: 600 * time.Second}); err != nil {
			tb.Fatal(err)
		}
		keys = append(keys, key)
		srv.AddLane(serving.Lane{Name: key, Task: task, Rungs: rungs, Ceiling: 128, Dimensions: fuzzDims})
		cat = append(cat, Lane{Namespace: "default", Name: name, Key: key, Model: name, Task: task, Device: "sim", Rungs: rungs, Ceiling: 128,
			Dimensions: fuzzDims, VectorSpace: name, Tokenizer: tokenizer.Sim{}, Deadline: 30 * time.Second, MaxBatchTokens: 1024})
	}
	return New(Config{Node: "mac-fuzz", Catalog: cat, Runner: srv, Clock: clk, Auth: apiauth.Anonymous{}}), sup, keys
}

// The statuses a call may be answered with: none is a 500, whatever the body.
var fuzzStatuses = []int{200, 400, 404, 405, 413, 422, 429, 503, 504}

// A path in an answer: what error bodies must never carry.
var fuzzPath = regexp.MustCompile(`(^|[\s"'(=:])/[A-Za-z0-9_.-]+/`)

// fuzzCall sends body to path through the real handler and checks what every answer must be:
// an allowed status, JSON, a typed error with no path in it, and no worker restarted.
func fuzzCall(t *testing.T, api *Server, sup *supervisor.Supervisor, keys []string, path string, body []byte) map[string]any {
	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
	if !slices.Contains(fuzzStatuses, rec.Code) {
		t.Fatalf("status %d for %q: %s", rec.Code, body, rec.Body)
	}
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("the answer to %q is not JSON: %v: %s", body, err, rec.Body)
	}
	// A body that is not JSON is never served, however much of it is read before it is
	// checked (deferValue).
	if rec.Code == 200 && !json.Valid(body) {
		t.Fatalf("%q, not JSON, was answered 200: %s", body, rec.Body)
	}
	if rec.Code != 200 {
		e, _ := out["error"].(map[string]any)
		code, _ := e["code"].(string)
		msg, _ := e["message"].(string)
		if code == "" || msg == "" || rec.Header().Get("X-Synapse-Error-Code") != code {
			t.Fatalf("an untyped error for %q: %s", body, rec.Body)
		}
		if fuzzPath.MatchString(msg) {
			t.Fatalf("the error for %q carries a path: %s", body, msg)
		}
		if rec.Code == 429 && rec.Header().Get("Retry-After") == "" {
			t.Fatalf("429 without Retry-After for %q", body)
		}
	}
	// No request, valid or not, faults a worker.
	for _, k := range keys {
		if snap, ok := sup.Snapshot(k); !ok || snap.Generation != 1 || snap.Restarts != 0 {
			t.Fatalf("after %q lane %s is at generation %d with %d restarts", body, k, snap.Generation, snap.Restarts)
		}
	}
	return out
}

func FuzzEmbeddingsRequest(f *testing.F) {
	api, sup, keys := realLanes(f, "embed")
	for _, seed := range []string{
		`{"model": "default/fuzz-embed", "input": "hello world"}`,
		`{"model": "fuzz-embed", "input": ["a", "b c", "d e f"], "encoding_format": "base64"}`,
		`{"model": "default/fuzz-embed", "input": [1, 2, 3]}`,
		`{"model": "default/fuzz-embed", "input": [[1, 2], [4294967295], [7]]}`,
		`{"model": "default/fuzz-embed", "input": [[1, 2], "x"]}`,
		`{"model": "default/fuzz-embed", "input": [` + strings.Repeat("1,", 200) + `1]}`,
		`{"model": "default/fuzz-embed", "input": "` + strings.Repeat("w ", 129) + `"}`,
		`{"model": "default/fuzz-embed", "input": ["` + strings.Repeat("w ", 100) + `", "` + strings.Repeat("w ", 100) + `"], "dimensions": 32}`,
		`{"model": "default/fuzz-embed", "input": [-1]}`, `{"model": "default/fuzz-embed", "input": []}`, `{"model": "default/fuzz-embed", "input": null}`,
		`{"model": "default/fuzz-embed", "input": "\ud800 \u0000 \"q\""}`, `{"model": 7}`, `[]`, `{`, ``, `{"model": "default/fuzz-embed", "input": "a"} x`,
		// The input's value is read after the rest of the body is checked: keys matched as
		// encoding/json matches them, the last one winning, and values that are not JSON.
		`{"INPUT": [1, 2], "model": "default/fuzz-embed", "Input": "last"}`, `{"model": "default/fuzz-embed", "input": [1, 2 3]}`,
		`{"model": "default/fuzz-embed", "input": [1, 2,]}`, `{"model": "default/fuzz-embed", "input": ["a\u00"]}`,
		`{"model": "default/fuzz-embed", "input": [1, 2], "x": [}`, "{\"model\": \"default/fuzz-embed\", \"input\": \"a\x01\"}",
		`{"model": "default/fuzz-embed", "input": [` + strings.Repeat("1,", 200) + `x]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out := fuzzCall(t, api, sup, keys, "/v1/embeddings", body)
		data, _ := out["data"].([]any)
		for _, d := range data {
			e := d.(map[string]any)["embedding"]
			if s, ok := e.(string); ok {
				if len(s) != (4*fuzzDims+2)/3*4 {
					t.Fatalf("a base64 vector of %d characters", len(s))
				}
				continue
			}
			v, _ := e.([]any)
			if len(v) != fuzzDims {
				t.Fatalf("a vector of %d dimensions for %q", len(v), body)
			}
			for _, x := range v {
				if f, ok := x.(float64); !ok || math.IsNaN(f) || math.IsInf(f, 0) {
					t.Fatalf("a vector holds %v", x)
				}
			}
		}
	})
}

func FuzzRerankRequest(f *testing.F) {
	api, sup, keys := realLanes(f, "rerank")
	for _, seed := range []string{
		`{"model": "default/fuzz-rerank", "query": "what is it", "documents": ["one thing", "another thing"]}`,
		`{"model": "fuzz-rerank", "query": "q", "documents": [{"text": "a"}, "b"], "top_n": 1, "return_documents": true}`,
		`{"model": "default/fuzz-rerank", "query": "` + strings.Repeat("q ", 126) + `", "documents": ["d"]}`,
		`{"model": "default/fuzz-rerank", "query": "` + strings.Repeat("q ", 100) + `", "documents": ["d", "d", "d", "d", "d", "d", "d", "d", "d", "d", "d"]}`,
		`{"model": "default/fuzz-rerank", "query": "q", "documents": [" "]}`,
		`{"model": "default/fuzz-rerank", "query": "", "documents": ["d"]}`,
		`{"model": "default/fuzz-rerank", "query": "q", "documents": [{"title": "x"}]}`,
		`{"model": "default/fuzz-rerank", "query": "q", "documents": ["d"], "top_n": 0}`,
		`{"model": "default/fuzz-rerank", "query": "q", "documents": [1]}`, `{"query": "q"}`, `{`,
		// Documents that are most of the body are read after the rest is checked.
		`{"model": "default/fuzz-rerank", "query": "q", "documents": ["` + strings.Repeat("d ", 40) + `", {"text": "e"}]}`,
		`{"model": "default/fuzz-rerank", "query": "q", "documents": ["` + strings.Repeat("d ", 40) + `" "e"]}`,
		`{"model": "default/fuzz-rerank", "query": "q", "Documents": null, "documents": "` + strings.Repeat("d ", 40) + `"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out := fuzzCall(t, api, sup, keys, "/v1/rerank", body)
		results, _ := out["results"].([]any)
		seen, prev := map[float64]bool{}, math.Inf(1)
		for _, r := range results {
			m := r.(map[string]any)
			i, _ := m["index"].(float64)
			score, _ := m["relevance_score"].(float64)
			if seen[i] || score > prev || math.IsNaN(score) {
				t.Fatalf("results out of order or repeated: %v", results)
			}
			seen[i], prev = true, score
		}
	})
}
