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
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
)

// deferValue hands back the value encoding/json would decode into the field (keys matched
// case-insensitively, the last one winning) and the rest of the body with it replaced by null.
func TestDeferValueFindsTheFieldAsEncodingJSONDoes(t *testing.T) {
	ids := "[" + strings.Repeat("1, ", 50) + "2]"
	text := `"` + strings.Repeat("a b ", 50) + `"`
	for _, body := range []string{
		`{"model": "m", "input": ` + ids + `}`,
		`{"input":` + text + `,"model":"m"}`,
		` { "Model" : "m" , "INPUT" : [` + ids + `, [2]] } `,
		`{"input": [1], "input": ` + text + `}`,
		`{"input": [1], "model": "m", "InPuT": {"nested": ["]", "}", ` + text + `]}}`,
		`{"model": "m\"}", "input": "a\\\"b` + strings.Repeat("c", 100) + `"}`,
	} {
		rest, value, ok := deferValue([]byte(body), "input")
		if !ok {
			t.Errorf("%s: not found", body)
			continue
		}
		var want struct {
			Input rawJSON `json:"input"`
		}
		if err := json.Unmarshal([]byte(body), &want); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(value, want.Input) {
			t.Errorf("%s: value %s, want %s", body, value, want.Input)
		}
		var got map[string]any
		if err := json.Unmarshal(rest, &got); err != nil {
			t.Errorf("%s: the rest %s is not JSON: %v", body, rest, err)
		}
	}
}

// Bodies deferValue cannot read as an object with the field are left to json.Unmarshal whole.
func TestDeferValueLeavesWhatItCannotReadToTheDecoder(t *testing.T) {
	for _, body := range []string{
		``, `[]`, `{}`, `{"model": "m"}`, `{"input": [1, 2}`, `{"input": [1] "model": "m"}`, `{"input": 1} x`,
		`{"input": "unterminated}`, `{"input": [1, 2], `, `{"input"`, `{"input": `, `{"in\`, `{input: 1}`,
		// An escaped key, and a value that is not most of the body (its bulk is elsewhere,
		// which deferring would copy), are left to the decoder too.
		`{"in\u0070ut": [1, 2, 3, 4, 5, 6, 7, 8, 9]}`, `{"input": [1], "user": "` + strings.Repeat("x", 100) + `"}`,
	} {
		if _, _, ok := deferValue([]byte(body), "input"); ok {
			t.Errorf("%q was read as an object with an input", body)
		}
	}
}

// What the two checks pass (the rest by json.Unmarshal, the value by json.Valid) is JSON, and
// no JSON body with the field is left to the decoder.
func FuzzDeferValueChecksAsTheWholeBody(f *testing.F) {
	for _, seed := range []string{`{"model": "m", "input": [1, 2]}`, `{"input": [1, 2 3]}`, `{"input": "a", "x": [}`, `{"INPUT": 1, "input": 2}`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		rest, value, ok := deferValue(body, "input")
		if !ok {
			// A JSON object whose input is most of it, with no escape anywhere, is deferred.
			var v struct {
				Input rawJSON `json:"input"`
			}
			if json.Valid(body) && !bytes.Contains(body, []byte{'\\'}) && json.Unmarshal(body, &v) == nil && v.Input != nil &&
				2*len(v.Input) >= len(body) {
				t.Fatalf("%q was left to the decoder", body)
			}
			return
		}
		if (json.Valid(rest) && json.Valid(value)) != json.Valid(body) {
			t.Fatalf("%q: rest %q and value %q pass, the body does not, or the other way round", body, rest, value)
		}
	})
}

// repeated reads an endless run of one byte.
type repeated byte

func (b repeated) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// A body of unknown length (chunked) is read up to the bound, whole, and one over it is
// refused 413; its buffer grows by doubling to the bound and no further, so reading it costs
// about twice the bound, not the three and more append's own growth took.
func TestABodyOfUnknownLengthIsReadWithinItsBound(t *testing.T) {
	read := func(n int64) ([]byte, error, uint64) {
		r := httptest.NewRequest(http.MethodPost, "/v1/embeddings", io.LimitReader(repeated('a'), n))
		r.ContentLength = -1
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		body, err := readBody(httptest.NewRecorder(), r)
		runtime.ReadMemStats(&after)
		return body, err, after.TotalAlloc - before.TotalAlloc
	}
	body, err, _ := read(MaxBodyBytes)
	if err != nil || len(body) != MaxBodyBytes {
		t.Fatalf("a body of exactly the bound: %d bytes, %v", len(body), err)
	}
	body, err, alloc := read(MaxBodyBytes + 1)
	var ae *apiError
	if !errors.As(err, &ae) || ae.status != http.StatusRequestEntityTooLarge || ae.code != "request_too_large" || body != nil {
		t.Fatalf("a body over the bound: %d bytes, %v", len(body), err)
	}
	if alloc > 2*MaxBodyBytes+(1<<20) {
		t.Fatalf("reading a body over the bound allocated %d MiB", alloc>>20)
	}
}

// A rerank document is checked without copies before routing (checkDocument) and read as text
// later (documentText): the two must agree on every document, or a document passed by the
// first would be refused after the call was authorized and routed, or the other way round.
func TestCheckDocumentAgreesWithDocumentText(t *testing.T) {
	for _, doc := range []string{
		`"plain"`, `"esc\"aped \u00e9 \ud83d\ude00"`, `"\u0000"`, "\"\xff invalid utf-8\"", `""`,
		`{"text": "t"}`, `{"text": ""}`, `{"text": 5}`, `{"text": null}`, `{"Text": "case"}`, `{"te\u0078t": "escaped key"}`,
		`{"text": "a", "text": 5}`, `{"text": 5, "text": "a"}`, `{"other": "x"}`, `{}`, ` {"text": "spaced"} `,
		`5`, `null`, `true`, `["text"]`, `[]`,
	} {
		checked := checkDocument(rawJSON(doc))
		_, read := documentText(rawJSON(doc))
		if (checked == nil) != (read == nil) {
			t.Errorf("%s: checked %v, read %v", doc, checked, read)
		}
	}
}
