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
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

// hfTokenizer is the byte-level BPE test tokenizer, read once: a token covers at most 6 bytes.
var hfTokenizer = sync.OnceValue(func() *tokenizer.HF {
	tk, err := tokenizer.LoadHF("../tokenizer/testdata/bytelevel_bpe.json")
	if err != nil {
		panic(err)
	}
	return tk
})

func words(n int) string { return strings.TrimSpace(strings.Repeat("w ", n)) }

// Every input is checked against its lane's ceiling, and a call's inputs together against the
// lane's batch bound, while they are read: nothing over either reaches the lane, and the answer
// is typed (422 unsupported_shape for an input, 413 batch_too_large for the call).
func TestLimitsAreCheckedBeforeAnythingRuns(t *testing.T) {
	ts, _, runner := newTestServer(t)
	many := make([]string, 3)
	for i := range many {
		many[i] = words(100) // 300 tokens on a lane that takes 200 in one call
	}
	manyJSON, _ := json.Marshal(many)
	docs, _ := json.Marshal([]string{words(60), words(60), words(60)}) // with a 10-token query: 213
	for _, tc := range []struct {
		name, path, body string
		status           int
		code, message    string
	}{
		{"token ids over the ceiling, counted", "/v1/embeddings", `{"model": "embed", "input": ` + idArray(600) + `}`, 422, "unsupported_shape", "600 tokens"},
		{"a million token ids", "/v1/embeddings", `{"model": "embed", "input": ` + idArray(1_000_000) + `}`, 422, "unsupported_shape", "1000000 tokens"},
		// Refused for its size before it is read as JSON: a flood of such bodies costs a count
		// of their elements each, not two passes of the JSON scanner.
		{"token ids over the ceiling, refused before the input is checked", "/v1/embeddings",
			`{"model": "embed", "input": [` + strings.Repeat("7,", 600) + `07]}`, 422, "unsupported_shape", "601 tokens"},
		{"more inputs than a call takes, refused before the input is checked", "/v1/embeddings",
			`{"model": "embed", "input": [` + strings.Repeat(`"a",`, MaxInputs+1) + `x]}`, 400, "too_many_inputs", "more than 2048 inputs"},
		// Only token ids are counted before the parse: an input whose elements are not all
		// ids is told what is wrong with it, not its size.
		{"more documents than a call takes, refused before they are checked", "/v1/rerank",
			`{"model": "rerank", "query": "q", "documents": [` + strings.Repeat(`"d",`, MaxInputs+1) + `x]}`, 400, "too_many_inputs", "more than 2048 documents"},
		{"documents that are not an array", "/v1/rerank", `{"model": "rerank", "query": "q", "documents": "` + words(100) + `"}`, 400, "invalid_json", "documents must be an array"},
		{"large documents that are not JSON", "/v1/rerank", `{"model": "rerank", "query": "q", "documents": ["` + words(100) + `" "d"]}`, 400, "invalid_json", "documents"},
		{"a negative token id among many", "/v1/embeddings", `{"model": "embed", "input": [-1,` + strings.Repeat("1,", 600) + `1]}`, 400, "invalid_request", "token id 0 (-1)"},
		{"a string among many token ids", "/v1/embeddings", `{"model": "embed", "input": [1, "x",` + strings.Repeat("1,", 600) + `1]}`, 400, "invalid_request", "token id 1"},
		{"an input within the bounds that is not JSON", "/v1/embeddings", `{"model": "embed", "input": [1, 2 3]}`, 400, "invalid_json", "not valid JSON"},
		{"a large input within the bounds that is not JSON", "/v1/embeddings", `{"model": "embed", "input": [` + strings.Repeat("1,", 300) + `01]}`, 400, "invalid_json", "input"},
		{"text over the ceiling", "/v1/embeddings", `{"model": "embed", "input": ["a", "` + words(513) + `"]}`, 422, "unsupported_shape", "input[1]"},
		{"a batch over the lane's bound", "/v1/embeddings", `{"model": "tight", "input": ` + string(manyJSON) + `}`, 413, CodeBatchTooLarge, "200 tokens"},
		{"token-id inputs over the bound", "/v1/embeddings", `{"model": "tight", "input": [` + idArray(128) + `,` + idArray(100) + `]}`, 413, CodeBatchTooLarge, "maxBatchTokens"},
		{"a query that leaves no room", "/v1/rerank", `{"model": "rerank", "query": "` + words(511) + `", "documents": ["d"]}`, 422, "unsupported_shape", "the query"},
		{"a document past the ceiling with its query", "/v1/rerank", `{"model": "rerank", "query": "` + words(500) + `", "documents": ["d", "` + words(12) + `"]}`, 422, "unsupported_shape", "documents[1]"},
		{"pairs over the bound, each within the ceiling", "/v1/rerank", `{"model": "tight-rerank", "query": "` + words(10) + `", "documents": ` + string(docs) + `}`, 413, CodeBatchTooLarge, "200 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(runner.calls)
			resp, body := post(t, ts.URL+tc.path, tc.body)
			e, _ := body["error"].(map[string]any)
			if resp.StatusCode != tc.status || e == nil || e["code"] != tc.code || !strings.Contains(e["message"].(string), tc.message) {
				t.Fatalf("got %d %v; want %d %s saying %q", resp.StatusCode, body, tc.status, tc.code, tc.message)
			}
			if len(runner.calls) != before {
				t.Fatal("a call over a limit reached the lane")
			}
		})
	}
	// At the bounds exactly, calls run.
	for _, body := range []string{
		`{"model": "embed", "input": ` + idArray(512) + `}`,
		`{"model": "tight", "input": [` + idArray(128) + `,` + idArray(72) + `]}`,
		`{"model": "rerank", "query": "` + words(510) + `", "documents": ["d"]}`,
	} {
		if resp, out := post(t, ts.URL+pathOf(body), body); resp.StatusCode != 200 {
			t.Fatalf("at the bound: %d %v", resp.StatusCode, out)
		}
	}
	// One input of more token ids than a call may have inputs is one input, not a batch.
	resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "gte", "input": `+idArray(MaxInputs+1)+`}`)
	if resp.StatusCode != 200 || !slices.Equal(runner.calls[len(runner.calls)-1][0], ids(MaxInputs+1)) {
		t.Fatalf("%d token ids: %d %v", MaxInputs+1, resp.StatusCode, body)
	}
}

func pathOf(body string) string {
	if strings.Contains(body, `"query"`) {
		return "/v1/rerank"
	}
	return "/v1/embeddings"
}

// bytesPerCall is what call allocates, on average over n calls after one to warm up.
func bytesPerCall(n int, call func()) float64 {
	call()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range n {
		call()
	}
	runtime.ReadMemStats(&after)
	return float64(after.TotalAlloc-before.TotalAlloc) / float64(n)
}

// A flat array of token ids is read from the body into the one slice that runs, with no copy in
// between whose size follows the body's (the body itself is read once). Before, the input was
// copied as raw JSON, then as one json.Number string per id, then as ids: several times the body.
func TestTokenIDsAreReadWithoutCopiesProportionalToTheBody(t *testing.T) {
	_, s, runner := newTestServer(t)
	payload := `{"model": "gte", "input": ` + idArray(8000) + `}`
	call := func() {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(payload)))
		if rec.Code != 200 {
			t.Fatalf("%d %s", rec.Code, rec.Body)
		}
	}
	perCall := bytesPerCall(20, call)
	// The body (about 39 KB) once, the ids (32 KB), the answer (a 16-dimension vector) and
	// bookkeeping: under three times the body. The old path allocated over six times it.
	if limit := 3 * float64(len(payload)); perCall > limit {
		t.Fatalf("%.0f bytes allocated per call of a %d-byte body; want under %.0f", perCall, len(payload), limit)
	}
	if got := runner.calls[len(runner.calls)-1][0]; len(got) != 8000 || got[7999] != 8000 {
		t.Fatalf("the ids read are wrong: %d of them", len(got))
	}
}

// A rerank call's documents stay in the body until each is tokenised: a call refused at its
// first document (over the ceiling) allocates about its body, once, not the body again as
// strings of every document, as it did when all were read as text before routing.
func TestRerankDocumentsAreReadAsTextOnlyAsTheyAreTokenised(t *testing.T) {
	_, s, runner := newTestServer(t)
	doc := strings.Repeat("w ", 2048) // 4 KiB, 2048 tokens: over the lane's ceiling
	docs := make([]string, 1000)
	for i := range docs {
		docs[i] = `"` + doc + `"`
	}
	payload := `{"model": "rerank", "query": "q", "documents": [` + strings.Join(docs, ",") + `]}`
	call := func() {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/rerank", strings.NewReader(payload)))
		if rec.Code != 422 || !strings.Contains(rec.Body.String(), "documents[0]") {
			t.Fatalf("%d %.300s: want the first document refused over the ceiling", rec.Code, rec.Body)
		}
	}
	before := len(runner.calls)
	perCall := bytesPerCall(5, call)
	if limit := 1.5 * float64(len(payload)); perCall > limit {
		t.Fatalf("%.0f bytes allocated per call of a %d-byte body; want under %.0f", perCall, len(payload), limit)
	}
	if len(runner.calls) != before {
		t.Fatal("the lane was called")
	}
}

// Answers carry a code and words, never a file path or a worker's stderr: those go to the log.
func TestErrorBodiesCarryNoPathsOrWorkerStderr(t *testing.T) {
	ts, _, runner := newTestServer(t)
	for _, tc := range []struct {
		name   string
		err    error
		code   string
		status int
		keep   string
	}{
		{"a load failure naming its artifact", refusal.New(refusal.EngineCrashed, "team/embed",
			"the lane failed to load: ArtifactIntegrityError: /var/lib/synapse/artifacts/gte/1/p/params.json: digest mismatch"), "engine_crashed", 503, "ArtifactIntegrityError"},
		{"a worker fault with its last words", refusal.New(refusal.EngineCrashed, "team/embed",
			"worker fault: EOF; it said: panic: runtime error at /Users/builder/src/worker.go:12 | goroutine 1"), "engine_crashed", 503, "worker fault: EOF"},
		{"an error that is not a refusal", errors.New("open /etc/synapse/secret: permission denied"), "internal_error", 500, "log"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runner.err = tc.err
			resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "embed", "input": "a"}`)
			e := body["error"].(map[string]any)
			msg := e["message"].(string)
			if resp.StatusCode != tc.status || e["code"] != tc.code || !strings.Contains(msg, tc.keep) {
				t.Fatalf("%d %v", resp.StatusCode, body)
			}
			for _, leak := range []string{"/var/lib", "params.json", "/Users", "panic", "goroutine", "/etc/synapse", "secret"} {
				if strings.Contains(msg, leak) {
					t.Fatalf("the answer %q carries %q", msg, leak)
				}
			}
		})
	}
	runner.err = nil
}

// A tokenizer's refusal of a text goes back in the answer with its reason, but a reason that
// quotes the text (regexp2's timeout quotes all of it) is cut: a 64 KiB document costs the
// caller a short answer, not its own text back.
func TestATokenizersRefusalDoesNotSendTheTextBack(t *testing.T) {
	ts, _, _ := newTestServer(t)
	text := "zebra " + strings.Repeat("y", 64<<10)
	for _, tc := range []struct{ path, body string }{
		{"/v1/embeddings", `{"model": "picky", "input": ["fine", "` + text + `"]}`},
		{"/v1/rerank", `{"model": "picky-rerank", "query": "fine", "documents": ["` + text + `"]}`},
	} {
		resp, body := post(t, ts.URL+tc.path, tc.body)
		e, _ := body["error"].(map[string]any)
		msg, _ := e["message"].(string)
		if resp.StatusCode != 422 || e["code"] != "tokenization_failed" || !strings.Contains(msg, "the vocabulary has no z") {
			t.Fatalf("%s: %d %v; want 422 tokenization_failed with the tokenizer's reason", tc.path, resp.StatusCode, e)
		}
		if len(msg) > 2*MaxReasonBytes || !strings.Contains(msg, "more bytes)") {
			t.Fatalf("%s: a message of %d bytes for a reason of 64 KiB: %.300s", tc.path, len(msg), msg)
		}
	}
}

// A text of several MiB in one input, or as a rerank query, is answered with the typed refusal
// of an input over the ceiling: on a lane whose tokenizer bounds the bytes a token covers, for
// its size before it is encoded (the answer says so in bytes); on the Sim tokenizer's, at the
// ceiling's next token. Nothing reaches the lane.
func TestAMultiMiBTextIsRefusedAsOverTheCeiling(t *testing.T) {
	ts, _, runner := newTestServer(t)
	huge := "hello" + strings.Repeat(" world", 4<<20/6)
	for _, tc := range []struct{ name, path, body, message string }{
		{"an input on a lane with a byte bound", "/v1/embeddings", `{"model": "hf", "input": "` + huge + `"}`, "input has 4194305 bytes, more than the 128 tokens"},
		{"a query on a lane with a byte bound", "/v1/rerank", `{"model": "hf-rerank", "query": "` + huge + `", "documents": ["hello"]}`, "the query has 4194305 bytes, more than the 126 tokens"},
		{"an input on a Sim lane", "/v1/embeddings", `{"model": "embed", "input": ["` + huge + `"]}`, "input[0] has more than the 512 tokens"},
		{"a query on a Sim lane", "/v1/rerank", `{"model": "rerank", "query": "` + huge + `", "documents": ["d"]}`, "the query has more than the 510 tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(runner.calls)
			resp, body := post(t, ts.URL+tc.path, tc.body)
			e, _ := body["error"].(map[string]any)
			if resp.StatusCode != 422 || e == nil || e["code"] != "unsupported_shape" || !strings.Contains(e["message"].(string), tc.message) ||
				!strings.Contains(e["message"].(string), "not truncated") {
				t.Fatalf("got %d %v; want 422 unsupported_shape saying %q", resp.StatusCode, e, tc.message)
			}
			if len(runner.calls) != before {
				t.Fatal("the lane was called")
			}
		})
	}
	// Within the bound the same lane answers.
	if resp, body := post(t, ts.URL+"/v1/embeddings", `{"model": "hf", "input": "hello world"}`); resp.StatusCode != 200 {
		t.Fatalf("a short text: %d %v", resp.StatusCode, body)
	}
}
