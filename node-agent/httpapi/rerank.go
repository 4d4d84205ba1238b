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
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

// rerankRequest is the request Cohere, Jina and TEI-style clients send. A document is a string
// or an object with a text field.
type rerankRequest struct {
	Model           string    `json:"model"`
	Query           *string   `json:"query"`
	Documents       []rawJSON `json:"documents"`
	TopN            *int      `json:"top_n"`
	ReturnDocuments bool      `json:"return_documents"`
}

type rerankResponse struct {
	Object  string         `json:"object"`
	Model   string         `json:"model"`
	Results []rerankResult `json:"results"`
	Usage   rerankUsage    `json:"usage"`
	Synapse ranOn          `json:"synapse"`
}

type rerankResult struct {
	Index          int       `json:"index"`
	RelevanceScore float32   `json:"relevance_score"`
	Document       *document `json:"document,omitempty"`
}

type document struct {
	Text string `json:"text"`
}

type rerankUsage struct {
	TotalTokens int `json:"total_tokens"`
}

func (s *Server) rerank(w http.ResponseWriter, r *http.Request) {
	c := s.begin(w, r, "rerank")
	// A panic in the handler (net/http recovers it) must not keep the call's work slot.
	defer c.release()
	var req rerankRequest
	// The documents, most of a large body, are read once: counted, checked and split here,
	// not checked and then skipped by the decoder first (see deferValue).
	documents, deferred, err := c.decodeDeferring(&req, "documents")
	if err == nil && deferred {
		req.Documents, err = splitDocuments(documents)
	}
	if err != nil {
		c.fail(err)
		return
	}
	if req.Query == nil || *req.Query == "" {
		c.fail(badRequest("invalid_request", "query", "query is required and must not be empty"))
		return
	}
	if len(req.Documents) == 0 {
		c.fail(badRequest("invalid_request", "documents", "documents is required and must not be empty"))
		return
	}
	if len(req.Documents) > MaxInputs {
		c.fail(badRequest("too_many_inputs", "documents", fmt.Sprintf("%d documents in one call; at most %d", len(req.Documents), MaxInputs)))
		return
	}
	if req.TopN != nil && *req.TopN < 1 {
		c.fail(badRequest("invalid_request", "top_n", "top_n must be at least 1"))
		return
	}
	// Checked here, read as text one at a time as they are tokenised: the documents stay in
	// the body they came in, not copied into strings all at once.
	for i, raw := range req.Documents {
		if err := checkDocument(raw); err != nil {
			c.fail(badRequest("invalid_request", "documents", fmt.Sprintf("documents[%d]: %v", i, err)))
			return
		}
	}
	lanes, byName, err := s.candidates(c, req.Model, "rerank")
	if err != nil {
		c.fail(err)
		return
	}
	lane, sequences, err := s.route(c, req.Model, "rerank", lanes, byName, func(r *reader) ([][]uint32, error) { return rerankSequences(r, *req.Query, req.Documents) })
	if err != nil {
		c.fail(err)
		return
	}
	res, err := c.run(lane, "rerank", sequences)
	if err != nil {
		c.fail(err)
		return
	}
	out := rerankResponse{Object: "list", Model: req.Model, Results: make([]rerankResult, len(res.Scores)), Synapse: c.ranOn(lane, res)}
	for i, sc := range res.Scores {
		out.Results[i] = rerankResult{Index: i, RelevanceScore: sc}
	}
	// By relevance, ties in input order.
	slices.SortStableFunc(out.Results, func(a, b rerankResult) int {
		switch {
		case a.RelevanceScore > b.RelevanceScore:
			return -1
		case a.RelevanceScore < b.RelevanceScore:
			return 1
		}
		return 0
	})
	if req.TopN != nil && *req.TopN < len(out.Results) {
		out.Results = out.Results[:*req.TopN]
	}
	if req.ReturnDocuments {
		for i := range out.Results {
			text, err := documentText(req.Documents[out.Results[i].Index])
			if err != nil { // checked above: never
				c.fail(badRequest("invalid_request", "documents", fmt.Sprintf("documents[%d]: %v", out.Results[i].Index, err)))
				return
			}
			out.Results[i].Document = &document{Text: text}
		}
	}
	out.Usage.TotalTokens = c.tokens
	c.ok(out)
}

// splitDocuments reads a deferred documents value into its elements, as the decoder reads
// []rawJSON: more than MaxInputs are refused on a count before the value is checked as JSON;
// null is none; anything but an array is refused as the decoder refuses it.
func splitDocuments(raw []byte) ([]rawJSON, error) {
	if i := skipSpace(raw, 0); i < len(raw) && raw[i] == '[' {
		if n, err := countUpTo(raw[i:], MaxInputs+1, nil); err == nil && n > MaxInputs {
			return nil, badRequest("too_many_inputs", "documents", fmt.Sprintf("more than %d documents in one call; at most %d", MaxInputs, MaxInputs))
		}
	}
	if err := checkDeferred(raw, "documents"); err != nil {
		return nil, err
	}
	var docs []rawJSON
	switch raw[0] {
	case 'n':
		return nil, nil
	case '[':
		err := elements(raw, 0, func(e []byte) error {
			docs = append(docs, rawJSON(e))
			return nil
		})
		return docs, err
	}
	return nil, badRequest("invalid_json", "documents", "the body is not valid JSON: documents must be an array")
}

// errDocumentShape refuses a document that is neither a string nor an object with a text field,
// errNoText an object without a text field that is a string.
var (
	errDocumentShape = errors.New("a document is a string or an object with a text field")
	errNoText        = errors.New("a document object needs a text field")
)

// checkDocument checks that raw, a JSON value already checked as JSON, is a document: a string,
// or an object with a text field that is one. Nothing of it is copied.
func checkDocument(raw rawJSON) error {
	raw = bytes.TrimSpace(raw)
	switch {
	case len(raw) > 0 && raw[0] == '"':
		return nil
	case len(raw) > 0 && raw[0] == '{':
		var d struct {
			Text *stringShape `json:"text"`
		}
		if err := json.Unmarshal(raw, &d); err != nil || d.Text == nil {
			return errNoText
		}
		return nil
	}
	return errDocumentShape
}

// stringShape accepts a JSON string and keeps nothing of it.
type stringShape struct{}

func (*stringShape) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '"' {
		return errDocumentShape
	}
	return nil
}

// documentText is a document's text (see checkDocument).
func documentText(raw rawJSON) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '{' {
		var d struct {
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(raw, &d); err != nil || d.Text == nil {
			return "", errNoText
		}
		return *d.Text, nil
	}
	text, err := jsonString(raw)
	if err != nil {
		return "", errDocumentShape
	}
	return text, nil
}

// rerankSequences is each document's sequence for the lane: the query, the separator and the
// document, as the lane's own tokenizer encodes them. Each document is tokenised within what the
// ceiling leaves after the query and the separator, and the call's pairs within its batch
// bound, before its pair is built: a long query repeated over many documents is refused, not
// copied.
func rerankSequences(r *reader, queryText string, documents []rawJSON) ([][]uint32, error) {
	// The query must leave room for the separator and one token of document.
	query, err := r.textWithin(queryText, "query", "the query", r.lane.Ceiling-2, 0)
	if err != nil {
		return nil, err
	}
	if len(query) == 0 {
		return nil, badRequest("invalid_request", "query", "the query has no tokens")
	}
	r.left += len(query) // the query is charged with each pair below
	sequences := make([][]uint32, len(documents))
	for i, raw := range documents {
		what := fmt.Sprintf("documents[%d] (after the query's %d tokens and the separator)", i, len(query))
		room := min(r.lane.Ceiling, r.left) - len(query) - 1
		t, err := documentText(raw)
		if err != nil {
			return nil, badRequest("invalid_request", "documents", fmt.Sprintf("documents[%d]: %v", i, err))
		}
		doc, err := r.textWithin(t, "documents", what, room, len(query)+1)
		if err != nil {
			return nil, err
		}
		if len(doc) == 0 {
			return nil, &apiError{status: http.StatusUnprocessableEntity, code: string(refusal.UnsupportedShape), param: "documents",
				message: fmt.Sprintf("documents[%d] has no tokens", i)}
		}
		seq := make([]uint32, 0, len(query)+1+len(doc))
		sequences[i] = append(append(append(seq, query...), tokenizer.Separator), doc...)
	}
	return sequences, nil
}
