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
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/authentication/user"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
)

// countingBody counts the bytes a handler read of a request body.
type countingBody struct {
	r    io.Reader
	read int
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.read += n
	return n, err
}

func (b *countingBody) Close() error { return nil }

// TestABulkBodyIsReadOnlyForACallerSomeLaneAdmits: a large body is read (holding one of the
// few bulk slots) only once the caller is allowed some lane of the node at the endpoint; an
// authenticated caller no lane admits is refused 403 without a byte of it read, and one that
// the node serves no lane for is refused 404 so; a caller allowed one lane gets its body read
// and its lane's answer.
func TestABulkBodyIsReadOnlyForACallerSomeLaneAdmits(t *testing.T) {
	auth := &fakeAuth{users: map[string]string{"t-none": "nobody", "t-embed": "embedder", "t-rerank": "reranker"},
		allow: map[string][]string{"embedder": {"team/embed/embeddings"}, "reranker": {"team/rerank/rerank"}}}
	s := New(Config{Node: "mac-1", Catalog: fakeCatalog{}, Runner: &fakeRunner{}, Clock: clocktesting.NewFakeClock(epoch), Auth: auth})
	// A valid call padded past DefaultLargeBody with spaces, which JSON allows between tokens.
	large := func(model, field, value string) []byte {
		b, _ := json.Marshal(map[string]any{"model": model, field: value})
		return append(b[:len(b)-1], append(bytes.Repeat([]byte(" "), DefaultLargeBody), '}')...)
	}
	empty := New(Config{Node: "mac-1", Catalog: laneCatalog{}, Runner: &fakeRunner{}, Clock: clocktesting.NewFakeClock(epoch), Auth: auth})
	for _, tc := range []struct {
		name, token, path string
		server            *Server
		body              []byte
		status            int
		code              string
		read              bool
	}{
		{"no lane admits the caller", "t-none", "/v1/embeddings", nil, large("team/embed", "input", "a text"), 403, CodeForbidden, false},
		{"only a lane of the other endpoint admits the caller", "t-rerank", "/v1/embeddings", nil, large("team/embed", "input", "a text"), 403, CodeForbidden, false},
		{"a lane admits the caller", "t-embed", "/v1/embeddings", nil, large("team/embed", "input", "a text"), 200, "", true},
		{"a small body goes to its lane's own authorization", "t-none", "/v1/embeddings", nil, []byte(`{"model":"team/embed","input":"a text"}`), 403, CodeForbidden, true},
		{"a body of unknown length (chunked) is as large", "t-none", "/v1/embeddings", nil, []byte(`{"model":"team/embed","input":"a text"}`), 403, CodeForbidden, false},
		{"no lane of the node answers the endpoint", "t-embed", "/v1/embeddings", empty, large("team/embed", "input", "a text"), 404, "unknown_lane", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := &countingBody{r: bytes.NewReader(tc.body)}
			req := httptest.NewRequest(http.MethodPost, tc.path, body)
			req.ContentLength = int64(len(tc.body))
			if strings.Contains(tc.name, "chunked") {
				req.ContentLength = -1
			}
			req.Header.Set("Authorization", "Bearer "+tc.token)
			rec, srv := httptest.NewRecorder(), s
			if tc.server != nil {
				srv = tc.server
			}
			srv.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.code != "" && !strings.Contains(rec.Body.String(), `"code":"`+tc.code+`"`) {
				t.Errorf("answer %s, want code %s", rec.Body, tc.code)
			}
			if got := body.read > 0; got != tc.read {
				t.Errorf("%d bytes of the body read; read: %v, want %v", body.read, got, tc.read)
			}
		})
	}
}

// decidingAuth lets embedder call team/embed and cannot decide any other lane's access.
type decidingAuth struct{ fakeAuth }

func (a *decidingAuth) Authorize(ctx context.Context, u user.Info, acc apiauth.Access) (bool, string, error) {
	if acc.Namespace+"/"+acc.Lane == "team/embed" {
		return a.fakeAuth.Authorize(ctx, u, acc)
	}
	return false, "", errors.New("the API server is away")
}

// TestALaneThatCannotBeDecidedDoesNotHideOneThatAdmits: a lane whose decision cannot be had
// now does not end the search for one that admits the caller; with none admitting and one
// undecided, the answer is 503 (retry), not 403.
func TestALaneThatCannotBeDecidedDoesNotHideOneThatAdmits(t *testing.T) {
	auth := &decidingAuth{fakeAuth{users: map[string]string{"t-embed": "embedder", "t-none": "nobody"},
		allow: map[string][]string{"embedder": {"team/embed/embeddings"}}}}
	s := New(Config{Node: "mac-1", Catalog: fakeCatalog{}, Runner: &fakeRunner{}, Clock: clocktesting.NewFakeClock(epoch), Auth: auth})
	b, _ := json.Marshal(map[string]any{"model": "team/embed", "input": "a text"})
	large := append(b[:len(b)-1], append(bytes.Repeat([]byte(" "), DefaultLargeBody), '}')...)
	for token, want := range map[string]int{"t-embed": 200, "t-none": 503} {
		req := httptest.NewRequest(http.MethodPost, "/v1/embeddings", bytes.NewReader(large))
		req.Header.Set("Authorization", "Bearer "+token)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != want {
			t.Errorf("%s: answered %d %.200s, want %d", token, rec.Code, rec.Body, want)
		}
	}
}
