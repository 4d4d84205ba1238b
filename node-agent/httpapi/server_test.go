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
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/serving"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

const dims = 16

// fakeCatalog serves lanes of namespace team: embed and rerank by name, and the model "gte"
// by three embed lanes with different ladders (short: 128..512 with 256 resident; also: the
// same ladder, nothing resident; long: 1024..8192).
type fakeCatalog struct{}

func testLane(name, task string, rungs []int, resident ...int) Lane {
	return Lane{Namespace: "team", Name: name, Key: "team/" + name, Model: "gte", Task: task, Device: "ane", Rungs: rungs,
		Ceiling: rungs[len(rungs)-1], Dimensions: dims, VectorSpace: "gte/v1", Tokenizer: tokenizer.Sim{}, Deadline: 30 * time.Second,
		Resident: func() []int { return resident }}
}

func (fakeCatalog) Lookup(model string) ([]Lane, bool, error) {
	switch model {
	case "team/embed", "embed":
		l := testLane("embed", "embed", []int{128, 256, 512})
		return []Lane{l}, true, nil
	case "team/rerank", "rerank":
		return []Lane{testLane("rerank", "rerank", []int{128, 256, 512})}, true, nil
	case "gte":
		return []Lane{testLane("short", "embed", []int{128, 256, 512}, 256), testLane("also", "embed", []int{128, 256, 512}),
			testLane("long", "embed", []int{1024, 2048, 4096, 8192})}, false, nil
	case "solo":
		return []Lane{testLane("solo", "embed", []int{128})}, false, nil
	case "idsonly":
		l := testLane("idsonly", "embed", []int{128})
		l.Tokenizer = nil
		return []Lane{l}, true, nil
	case "mixed", "mixed-rerank":
		// One vector space, two tokenizers: one token per character on a short ladder, one per
		// word on a long one.
		task := map[bool]string{true: "rerank", false: "embed"}[model == "mixed-rerank"]
		chars := testLane("chars", task, []int{128})
		chars.Tokenizer = charTokenizer{}
		return []Lane{chars, testLane("words", task, []int{512})}, false, nil
	case "spaces", "team/v1", "team/v2":
		v1, v2 := testLane("v1", "embed", []int{128}), testLane("v2", "embed", []int{128})
		v2.VectorSpace = "gte/v2"
		switch model {
		case "team/v1":
			return []Lane{v1}, true, nil
		case "team/v2":
			return []Lane{v2}, true, nil
		}
		return []Lane{v1, v2}, false, nil
	case "tight", "tight-rerank":
		l := testLane(model, map[bool]string{true: "rerank", false: "embed"}[model == "tight-rerank"], []int{128})
		l.MaxBatchTokens = 200
		return []Lane{l}, true, nil
	case "hf", "hf-rerank":
		l := testLane(model, map[bool]string{true: "rerank", false: "embed"}[model == "hf-rerank"], []int{128})
		l.Tokenizer = hfTokenizer()
		return []Lane{l}, true, nil
	case "picky", "picky-rerank":
		l := testLane(model, map[bool]string{true: "rerank", false: "embed"}[model == "picky-rerank"], []int{128})
		l.Tokenizer = pickyTokenizer{}
		return []Lane{l}, true, nil
	}
	return nil, false, refusal.New(refusal.UnknownLane, model, "no such lane on this node")
}

// Lanes lists the lanes Lookup answers with (each lane once, by its key).
func (c fakeCatalog) Lanes() []Lane {
	seen := map[string]Lane{}
	for _, model := range []string{"embed", "rerank", "gte", "solo", "idsonly", "mixed", "mixed-rerank", "spaces", "tight", "tight-rerank", "hf", "hf-rerank", "picky", "picky-rerank"} {
		lanes, _, _ := c.Lookup(model)
		for _, l := range lanes {
			seen[l.Key+"/"+l.Task] = l
		}
	}
	out := make([]Lane, 0, len(seen))
	for _, l := range seen {
		out = append(out, l)
	}
	return out
}

// fakeRunner computes the sim model's outputs, or answers err.
type fakeRunner struct {
	mu        sync.Mutex
	err       error
	calls     [][][]uint32
	lanes     []string
	deadlines []time.Time
}

func (f *fakeRunner) Run(_ context.Context, lane, task string, seqs [][]uint32, deadline time.Time) (*serving.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, seqs)
	f.lanes = append(f.lanes, lane)
	f.deadlines = append(f.deadlines, deadline)
	if f.err != nil {
		return nil, f.err
	}
	res := &serving.Result{Buckets: []int{128}, Generations: []int64{3}}
	for _, s := range seqs {
		if task == "embed" {
			res.Vectors = append(res.Vectors, worker.Embed(lane, dims, s))
			continue
		}
		i := slices.Index(s, tokenizer.Separator)
		res.Scores = append(res.Scores, worker.Score(lane, dims, s[:i], s[i+1:]))
	}
	return res, nil
}

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newTestServer(t *testing.T) (*httptest.Server, *Server, *fakeRunner) {
	t.Helper()
	runner := &fakeRunner{}
	s := New(Config{Node: "mac-1", Catalog: fakeCatalog{}, Runner: runner, Clock: clocktesting.NewFakeClock(epoch),
		Auth: apiauth.Anonymous{}})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts, s, runner
}

func post(t *testing.T, url, body string) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("the answer is not JSON: %v", err)
	}
	return resp, out
}

func TestEmbeddingsWorkWithTheOfficialOpenAIClient(t *testing.T) {
	ts, _, runner := newTestServer(t)
	client := openai.NewClient(option.WithBaseURL(ts.URL+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	inputs := []string{"the first passage", "a second, longer passage about Macs", "third"}
	got, err := client.Embeddings.New(context.Background(), openai.EmbeddingNewParams{
		Model: "team/embed",
		Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: inputs},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Data) != len(inputs) {
		t.Fatalf("%d embeddings for %d inputs", len(got.Data), len(inputs))
	}
	tokens := 0
	for i, in := range inputs {
		ids := simIDs(in)
		tokens += len(ids)
		want := worker.Embed("team/embed", dims, ids)
		d := got.Data[i]
		if d.Index != int64(i) || len(d.Embedding) != dims {
			t.Fatalf("data[%d]: index %d, %d dimensions", i, d.Index, len(d.Embedding))
		}
		for k := range want {
			if float32(d.Embedding[k]) != want[k] {
				t.Fatalf("data[%d][%d] = %v, want %v: not the input's own embedding", i, k, d.Embedding[k], want[k])
			}
		}
	}
	if got.Usage.PromptTokens != int64(tokens) || got.Usage.TotalTokens != int64(tokens) {
		t.Fatalf("usage %+v, want %d tokens", got.Usage, tokens)
	}
	if !runner.deadlines[0].Equal(epoch.Add(30 * time.Second)) {
		t.Fatalf("deadline %s, want the lane's 30 s from arrival", runner.deadlines[0])
	}
}

func TestEmbeddingsAcceptEveryInputFormAndSayWhereTheyRan(t *testing.T) {
	ts, _, runner := newTestServer(t)
	for _, tc := range []struct {
		input string
		want  [][]uint32
	}{
		{`"one text"`, [][]uint32{simIDs("one text")}},
		{`["a", "b c"]`, [][]uint32{simIDs("a"), simIDs("b c")}},
		{`[5, 6, 7]`, [][]uint32{{5, 6, 7}}},
		{`[[1, 2], [4294967295]]`, [][]uint32{{1, 2}, {4294967295}}},
		{` [ 1 ,2 ] `, [][]uint32{{1, 2}}},
		{`"esc\u0061ped \"quotes\""`, [][]uint32{simIDs(`escaped "quotes"`)}},
	} {
		resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "embed", "input": `+tc.input+`}`)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %v", tc.input, resp.StatusCode, body)
		}
		if last := runner.calls[len(runner.calls)-1]; !slices.EqualFunc(last, tc.want, slices.Equal) {
			t.Fatalf("%s: ran %v, want %v", tc.input, last, tc.want)
		}
		if n := len(body["data"].([]any)); n != len(tc.want) {
			t.Fatalf("%s: %d embeddings", tc.input, n)
		}
		ran := body["synapse"].(map[string]any)
		if ran["lane"] != "team/embed" || ran["node"] != "mac-1" || ran["device"] != "ane" || ran["routing_reason"] != "model_names_lane/smallest_fitting_bucket" ||
			ran["vector_space"] != "gte/v1" {
			t.Fatalf("synapse field %v", ran)
		}
		h := resp.Header
		if h.Get("X-Synapse-Lane") != "team/embed" || h.Get("X-Synapse-Node") != "mac-1" || h.Get("X-Synapse-Device") != "ane" ||
			h.Get("X-Synapse-Buckets") != "128" || h.Get("X-Synapse-Worker-Generations") != "3" || h.Get("X-Synapse-Routing-Reason") != "model_names_lane/smallest_fitting_bucket" ||
			h.Get("X-Synapse-Vector-Space") != "gte/v1" {
			t.Fatalf("headers %v", h)
		}
	}
}

func ids(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(i + 1)
	}
	return out
}

func idArray(n int) string {
	b, _ := json.Marshal(ids(n))
	return string(b)
}

func TestTooManyInputsAreRefusedNotCut(t *testing.T) {
	ts, _, runner := newTestServer(t)
	many, _ := json.Marshal(make([]string, MaxInputs+1))
	resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "embed", "input": `+string(many)+`}`)
	if resp.StatusCode != 400 || body["error"].(map[string]any)["code"] != "too_many_inputs" || len(runner.calls) != 0 {
		t.Fatalf("%d inputs: %d %v", MaxInputs+1, resp.StatusCode, body)
	}
}

func TestAModelServedBySeveralLanesIsRoutedBeforeItRunsWithTheReasonRecorded(t *testing.T) {
	ts, s, runner := newTestServer(t)
	for _, tc := range []struct {
		name, model string
		input       string
		lane        string
		reason      string
		status      int
		code        string
	}{
		{"the model names a lane", "team/embed", idArray(10), "team/embed", ReasonLaneNamed, 200, ""},
		{"one lane serves the model", "solo", idArray(10), "team/solo", ReasonOnlyLane, 200, ""},
		{"only one lane takes the input", "gte", idArray(3000), "team/long", ReasonOnlyFittingLane, 200, ""},
		{"a resident bucket breaks the tie", "gte", idArray(200), "team/short", ReasonResidentBucket, 200, ""},
		{"the smallest bucket wins", "gte", idArray(300), "team/also", ReasonSmallestBucket, 200, ""},
		{"no lane takes the input", "gte", idArray(9000), "", "", 422, "unsupported_shape"},
		{"no lane takes it here either", "solo", idArray(129), "", "", 422, "unsupported_shape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(runner.calls)
			resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "`+tc.model+`", "input": `+tc.input+`}`)
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %v", resp.StatusCode, body)
			}
			if tc.status != 200 {
				if body["error"].(map[string]any)["code"] != tc.code || len(runner.calls) != before {
					t.Fatalf("%v; calls %d -> %d", body, before, len(runner.calls))
				}
				return
			}
			ran := body["synapse"].(map[string]any)
			want := tc.reason + "/smallest_fitting_bucket"
			if ran["lane"] != tc.lane || ran["routing_reason"] != want || resp.Header.Get("X-Synapse-Routing-Reason") != want {
				t.Fatalf("ran on %v for %v, want %s for %s", ran["lane"], ran["routing_reason"], tc.lane, want)
			}
			if n := testutil.ToFloat64(s.metrics.routing.WithLabelValues(want)); n < 1 {
				t.Fatalf("the decision %s was not counted", want)
			}
		})
	}
	// A model with lanes for another task only.
	resp, body := post(t, ts.URL+"/v1/rerank", `{"model": "gte", "query": "q", "documents": ["d"]}`)
	if resp.StatusCode != 400 || body["error"].(map[string]any)["code"] != "invalid_request" {
		t.Fatalf("rerank on an embed-only model: %d %v", resp.StatusCode, body)
	}
}

func TestBase64EmbeddingsAreLittleEndianFloat32(t *testing.T) {
	ts, _, _ := newTestServer(t)
	_, body := post(t, ts.URL+"/v1/embeddings", `{"model": "team/embed", "input": "hello", "encoding_format": "base64"}`)
	raw, err := base64.StdEncoding.DecodeString(body["data"].([]any)[0].(map[string]any)["embedding"].(string))
	if err != nil {
		t.Fatal(err)
	}
	want := worker.Embed("team/embed", dims, simIDs("hello"))
	if len(raw) != 4*dims {
		t.Fatalf("%d bytes", len(raw))
	}
	for i := range want {
		if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != want[i] {
			t.Fatalf("[%d] = %v, want %v", i, got, want[i])
		}
	}
}

func TestRerankSortsByRelevanceWithInputIndexes(t *testing.T) {
	ts, _, _ := newTestServer(t)
	docs := []string{"apple pie recipe", "the apple neural engine", "neural engine on apple silicon macs", "weather today"}
	resp, body := post(t, ts.URL+"/v1/rerank", `{"model": "team/rerank", "query": "apple neural engine", "documents": ["apple pie recipe",
		{"text": "the apple neural engine"}, "neural engine on apple silicon macs", "weather today"], "top_n": 3, "return_documents": true}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%d %v", resp.StatusCode, body)
	}
	q := simIDs("apple neural engine")
	results := body["results"].([]any)
	if len(results) != 3 {
		t.Fatalf("%d results, want top_n 3", len(results))
	}
	prev := math.Inf(1)
	seen := map[int]bool{}
	for _, r := range results {
		r := r.(map[string]any)
		i := int(r["index"].(float64))
		score := r["relevance_score"].(float64)
		want := worker.Score("team/rerank", dims, q, simIDs(docs[i]))
		if float32(score) != want || r["document"].(map[string]any)["text"] != docs[i] || seen[i] {
			t.Fatalf("result %v: want index %d's score %v and text", r, i, want)
		}
		if score > prev {
			t.Fatalf("results not by relevance: %v", results)
		}
		prev, seen[i] = score, true
	}
}

func TestRefusalsAreTypedWithTheRightStatus(t *testing.T) {
	ts, _, runner := newTestServer(t)
	compiling := &refusal.Error{Code: refusal.ShapeCompiling, Lane: "team/embed", RetryAfter: 2500 * time.Millisecond, Message: "rung 2048 compiles"}
	for _, tc := range []struct {
		name, path, body string
		runErr           error
		status           int
		code             string
	}{
		{"malformed JSON", "/v1/embeddings", `{"model": "embed", "input": `, nil, 400, "invalid_json"},
		{"two JSON values", "/v1/embeddings", `{"model": "embed", "input": "a"} {}`, nil, 400, "invalid_json"},
		{"no model", "/v1/embeddings", `{"input": "a"}`, nil, 400, "invalid_request"},
		{"no input", "/v1/embeddings", `{"model": "embed"}`, nil, 400, "invalid_request"},
		{"empty input array", "/v1/embeddings", `{"model": "embed", "input": []}`, nil, 400, "invalid_request"},
		{"mixed input", "/v1/embeddings", `{"model": "embed", "input": ["a", 1]}`, nil, 400, "invalid_request"},
		{"negative token id", "/v1/embeddings", `{"model": "embed", "input": [1, -2]}`, nil, 400, "invalid_request"},
		{"fractional token id", "/v1/embeddings", `{"model": "embed", "input": [1.5]}`, nil, 400, "invalid_request"},
		{"token id too large", "/v1/embeddings", `{"model": "embed", "input": [4294967296]}`, nil, 400, "invalid_request"},
		{"unknown encoding", "/v1/embeddings", `{"model": "embed", "input": "a", "encoding_format": "int8"}`, nil, 400, "invalid_request"},
		{"other dimensions", "/v1/embeddings", `{"model": "embed", "input": "a", "dimensions": 8}`, nil, 400, "unsupported_dimensions"},
		{"wrong task", "/v1/embeddings", `{"model": "rerank", "input": "a"}`, nil, 400, "invalid_request"},
		{"unknown lane", "/v1/embeddings", `{"model": "team/nothing", "input": "a"}`, nil, 404, "unknown_lane"},
		{"over the ceiling", "/v1/embeddings", `{"model": "embed", "input": "a"}`, refusal.New(refusal.UnsupportedShape, "team/embed", "input 0 has 9000 tokens"), 422, "unsupported_shape"},
		{"deadline", "/v1/embeddings", `{"model": "embed", "input": "a"}`, refusal.New(refusal.DeadlineExceeded, "team/embed", "late"), 504, "deadline_exceeded"},
		{"crashed", "/v1/embeddings", `{"model": "embed", "input": "a"}`, refusal.New(refusal.EngineCrashed, "team/embed", "boom"), 503, "engine_crashed"},
		{"resources", "/v1/embeddings", `{"model": "embed", "input": "a"}`, refusal.New(refusal.ResourcesExhausted, "team/embed", "full"), 503, "ane_resources_exhausted"},
		{"paused", "/v1/embeddings", `{"model": "embed", "input": "a"}`, refusal.New(refusal.NodePaused, "team/embed", "paused"), 503, "node_paused"},
		{"off the device", "/v1/embeddings", `{"model": "embed", "input": "a"}`, refusal.New(refusal.ComputeUnitMismatch, "team/embed", "ratio 0.97"), 503, "compute_unit_mismatch"},
		{"no backend", "/v1/embeddings", `{"model": "embed", "input": "a"}`, refusal.New(refusal.BackendUnavailable, "team/embed", "dead"), 503, "backend_unavailable"},
		{"no query", "/v1/rerank", `{"model": "rerank", "documents": ["a"]}`, nil, 400, "invalid_request"},
		{"no documents", "/v1/rerank", `{"model": "rerank", "query": "q", "documents": []}`, nil, 400, "invalid_request"},
		{"empty document", "/v1/rerank", `{"model": "rerank", "query": "q", "documents": ["a", " "]}`, nil, 422, "unsupported_shape"},
		{"bad document", "/v1/rerank", `{"model": "rerank", "query": "q", "documents": [{"title": "a"}]}`, nil, 400, "invalid_request"},
		{"top_n zero", "/v1/rerank", `{"model": "rerank", "query": "q", "documents": ["a"], "top_n": 0}`, nil, 400, "invalid_request"},
		{"unknown path", "/v1/completions", `{}`, nil, 404, "not_found"},
		{"text for a lane without a tokenizer", "/v1/embeddings", `{"model": "idsonly", "input": "a"}`, nil, 400, "text_input_unsupported"},
		{"text the tokenizer cannot encode", "/v1/embeddings", `{"model": "picky", "input": ["fine", "zebra"]}`, nil, 422, "tokenization_failed"},
		{"a document the tokenizer cannot encode", "/v1/rerank", `{"model": "picky-rerank", "query": "fine", "documents": ["zebra"]}`, nil, 422, "tokenization_failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner.err = tc.runErr
			before := len(runner.calls)
			resp, body := post(t, ts.URL+tc.path, tc.body)
			e, _ := body["error"].(map[string]any)
			if resp.StatusCode != tc.status || e == nil || e["code"] != tc.code || e["message"] == "" || resp.Header.Get("X-Synapse-Error-Code") != tc.code {
				t.Fatalf("got %d %v, want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
			if tc.runErr == nil && len(runner.calls) != before {
				t.Fatal("a request refused by the API reached the lane")
			}
		})
	}

	runner.err = &refusal.Error{Code: refusal.Overloaded, Lane: "team/embed", RetryAfter: time.Second, Message: "64 running and 256 waiting"}
	resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "embed", "input": "a"}`)
	if e := body["error"].(map[string]any); resp.StatusCode != 429 || e["code"] != "overloaded" || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("overloaded: %d %v Retry-After %q", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}

	runner.err = compiling
	resp, body = post(t, ts.URL+"/v1/embeddings", `{"model": "embed", "input": "a"}`)
	e := body["error"].(map[string]any)
	if resp.StatusCode != 503 || e["code"] != "shape_compiling" || e["retry_after_ms"] != float64(2500) || resp.Header.Get("Retry-After") != "3" {
		t.Fatalf("shape_compiling: %d %v Retry-After %q", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	}

	req, _ := http.NewRequest(http.MethodGet, ts.URL+"/v1/embeddings", nil)
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET /v1/embeddings: %d", r.StatusCode)
	}
	big := `{"model": "embed", "input": "` + strings.Repeat("a", MaxBodyBytes) + `"}`
	resp, body = post(t, ts.URL+"/v1/embeddings", big)
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized body: %d %v", resp.StatusCode, body)
	}
}

func TestMetricsCountCallsByLaneAndCode(t *testing.T) {
	ts, s, runner := newTestServer(t)
	post(t, ts.URL+"/v1/embeddings", `{"model": "embed", "input": "a"}`)
	runner.err = refusal.New(refusal.EngineCrashed, "team/embed", "boom")
	post(t, ts.URL+"/v1/embeddings", `{"model": "embed", "input": "a"}`)
	if n := testutil.ToFloat64(s.metrics.requests.WithLabelValues("team/embed", "embeddings", "ok")); n != 1 {
		t.Fatalf("ok calls %v", n)
	}
	if n := testutil.ToFloat64(s.metrics.requests.WithLabelValues("team/embed", "embeddings", "engine_crashed")); n != 1 {
		t.Fatalf("crashed calls %v", n)
	}
	resp, err := http.Get(ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if !strings.Contains(buf.String(), `synapse_agent_request_duration_seconds_count{bucket="128",endpoint="embeddings",lane="team/embed"} 1`) {
		t.Fatalf("/metrics lacks the latency histogram:\n%s", buf.String())
	}
}

// simIDs is what the sim tokenizer makes of text.
func simIDs(text string) []uint32 {
	ids, _ := tokenizer.Sim{}.Encode(text)
	return ids
}

// pickyTokenizer cannot encode a text that holds a z, and says so quoting the text, as some
// tokenizers' errors do.
type pickyTokenizer struct{}

func (pickyTokenizer) EncodeContext(ctx context.Context, text string, max int) ([]uint32, error) {
	if strings.Contains(text, "z") {
		return nil, fmt.Errorf("the vocabulary has no z: %q", text)
	}
	return tokenizer.Sim{}.EncodeContext(ctx, text, max)
}

// charTokenizer gives one token per character.
type charTokenizer struct{}

func (charTokenizer) Encode(text string) ([]uint32, error) {
	var ids []uint32
	for _, r := range text {
		ids = append(ids, 1+uint32(r)%1000)
	}
	return ids, nil
}

func (c charTokenizer) EncodeContext(_ context.Context, text string, max int) ([]uint32, error) {
	ids, _ := c.Encode(text)
	if max > 0 && len(ids) > max {
		return nil, &tokenizer.TooLongError{Max: max, Tokens: len(ids)}
	}
	return ids, nil
}

// Lanes of one model may tokenize differently: each lane is judged on, and runs, its own
// tokenizer's tokens. (With the first lane's tokens for all, the short text below would run
// word tokens on the character lane, and the long one would be sent to the character lane,
// whose tokenizer makes it longer than its ceiling.)
func TestEachLaneTokenizesTheInputWithItsOwnTokenizer(t *testing.T) {
	ts, _, runner := newTestServer(t)
	long := strings.TrimSpace(strings.Repeat("tokens differ ", 20)) // 40 words, 279 characters
	for _, tc := range []struct {
		name, path, body, lane, reason string
		want                           [][]uint32
	}{
		{"a short text fits both: the smaller bucket, with its own tokens", "/v1/embeddings", `{"model": "mixed", "input": "hi there"}`,
			"team/chars", ReasonSmallestBucket, [][]uint32{must(charTokenizer{}.Encode("hi there"))}},
		{"a long text fits only the word lane by its own count", "/v1/embeddings", `{"model": "mixed", "input": "` + long + `"}`,
			"team/words", ReasonOnlyFittingLane, [][]uint32{simIDs(long)}},
		{"rerank sequences too", "/v1/rerank", `{"model": "mixed-rerank", "query": "q", "documents": ["` + long + `"]}`,
			"team/words", ReasonOnlyFittingLane, [][]uint32{append(append(simIDs("q"), tokenizer.Separator), simIDs(long)...)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := post(t, ts.URL+tc.path, tc.body)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %v", resp.StatusCode, body)
			}
			ran := body["synapse"].(map[string]any)
			if ran["lane"] != tc.lane || ran["routing_reason"] != tc.reason+bucketPolicy {
				t.Fatalf("ran on %v for %v; want %s for %s", ran["lane"], ran["routing_reason"], tc.lane, tc.reason)
			}
			last := len(runner.calls) - 1
			if runner.lanes[last] != tc.lane || !slices.EqualFunc(runner.calls[last], tc.want, slices.Equal) {
				t.Fatalf("lane %s ran %v; want its own tokens %v", runner.lanes[last], runner.calls[last], tc.want)
			}
		})
	}
}

// A model served in two vector spaces: a caller who names only the model is refused before
// anything runs (its vectors could come from either space); naming the lane is served.
func TestAModelServedInSeveralVectorSpacesIsRefusedUnlessTheRequestNamesTheLane(t *testing.T) {
	ts, _, runner := newTestServer(t)
	resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "spaces", "input": "a"}`)
	e, _ := body["error"].(map[string]any)
	if resp.StatusCode != 400 || e == nil || e["code"] != CodeAmbiguousModel || !strings.Contains(e["message"].(string), "team/v2") {
		t.Fatalf("a model in two vector spaces: %d %v", resp.StatusCode, body)
	}
	if len(runner.calls) != 0 {
		t.Fatal("an ambiguous call reached a lane")
	}
	for _, lane := range []string{"team/v1", "team/v2"} {
		resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "`+lane+`", "input": "a"}`)
		if resp.StatusCode != 200 || body["synapse"].(map[string]any)["lane"] != lane {
			t.Fatalf("naming %s: %d %v", lane, resp.StatusCode, body)
		}
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
