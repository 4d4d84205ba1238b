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
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apiserver/pkg/authentication/user"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
)

// fakeAuth knows tokens by name and lets each user do what allow lists, as "ns/lane/subresource"
// or a path; it records what it was asked.
type fakeAuth struct {
	mu       sync.Mutex
	users    map[string]string // token -> user name
	allow    map[string][]string
	authnErr error
	authzErr error
	asked    []apiauth.Access
}

func (f *fakeAuth) AuthenticateRequest(r *http.Request) (user.Info, bool, string, error) {
	if f.authnErr != nil {
		return nil, false, "", f.authnErr
	}
	name, ok := f.users[apiauth.BearerToken(r)]
	if !ok {
		return nil, false, "unknown token", nil
	}
	return &user.DefaultInfo{Name: name}, true, "", nil
}

func (f *fakeAuth) Authorize(_ context.Context, u user.Info, a apiauth.Access) (bool, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, a)
	if f.authzErr != nil {
		return false, "", f.authzErr
	}
	what := a.Path
	if what == "" {
		what = a.Namespace + "/" + a.Lane + "/" + a.Subresource
	}
	if slices.Contains(f.allow[u.GetName()], what) {
		return true, "", nil
	}
	return false, "RBAC: not allowed", nil
}

func newAuthServer(t *testing.T, auth Auth) (*httptest.Server, *fakeRunner) {
	t.Helper()
	runner := &fakeRunner{}
	s := New(Config{Node: "mac-1", Catalog: fakeCatalog{}, Runner: runner, Clock: clocktesting.NewFakeClock(epoch), Auth: auth})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return ts, runner
}

func postAs(t *testing.T, url, token, body string) (*http.Response, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return do(t, req)
}

func do(t *testing.T, req *http.Request) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatal(err)
		}
	}
	return resp, m
}

func TestCallsWithoutAValidTokenAreRefused401InTheOpenAIEnvelope(t *testing.T) {
	auth := &fakeAuth{users: map[string]string{"good": "alice"}, allow: map[string][]string{"alice": {"team/embed/embeddings"}}}
	ts, runner := newAuthServer(t, auth)
	for _, token := range []string{"", "bad"} {
		resp, body := postAs(t, ts.URL+"/v1/embeddings", token, `{"model": "team/embed", "input": "x"}`)
		if resp.StatusCode != http.StatusUnauthorized || errorCodeOf(body) != CodeUnauthorized || errorTypeOf(body) != "invalid_request_error" {
			t.Fatalf("token %q: %d %v", token, resp.StatusCode, body)
		}
		if !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("token %q: no WWW-Authenticate challenge: %v", token, resp.Header)
		}
	}
	// Unknown paths and the metrics are behind authentication too; the probes are not.
	for _, path := range []string{"/nowhere", "/metrics", "/admin/pause"} {
		req, _ := http.NewRequest(http.MethodGet, ts.URL+path, nil)
		if resp, body := do(t, req); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, body)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if resp, _ := do(t, mustRequest(t, http.MethodGet, ts.URL+path)); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	if resp, body := postAs(t, ts.URL+"/v1/embeddings", "good", `{"model": "team/embed", "input": "x"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("alice: %d %v", resp.StatusCode, body)
	}
	if len(runner.calls) != 1 {
		t.Fatalf("ran %d calls, want only alice's", len(runner.calls))
	}
	if got := auth.asked; len(got) != 1 || got[0] != (apiauth.Access{Namespace: "team", Lane: "embed", Subresource: "embeddings"}) {
		t.Fatalf("asked %+v", got)
	}
}

func TestALaneTheCallerMayNotCallIsRefused403AndNeverRun(t *testing.T) {
	auth := &fakeAuth{users: map[string]string{"a": "alice"}, allow: map[string][]string{"alice": {"team/embed/embeddings"}}}
	ts, runner := newAuthServer(t, auth)
	// The embed lane's rerank subresource, and another lane.
	resp, body := postAs(t, ts.URL+"/v1/rerank", "a", `{"model": "team/rerank", "query": "q", "documents": ["d"]}`)
	if resp.StatusCode != http.StatusForbidden || errorCodeOf(body) != CodeForbidden {
		t.Fatalf("rerank: %d %v", resp.StatusCode, body)
	}
	if msg := errorMessageOf(body); !strings.Contains(msg, "alice may not create cataloglanes/rerank of lane team/rerank") {
		t.Fatalf("message %q", msg)
	}
	resp, body = postAs(t, ts.URL+"/v1/embeddings", "a", `{"model": "team/v1", "input": "x"}`)
	if resp.StatusCode != http.StatusForbidden || errorCodeOf(body) != CodeForbidden {
		t.Fatalf("v1: %d %v", resp.StatusCode, body)
	}
	if len(runner.calls) != 0 {
		t.Fatalf("ran %d refused calls", len(runner.calls))
	}
	// The metrics are a path of their own.
	req := mustRequest(t, http.MethodGet, ts.URL+"/metrics")
	req.Header.Set("Authorization", "Bearer a")
	if resp, body := do(t, req); resp.StatusCode != http.StatusForbidden || errorCodeOf(body) != CodeForbidden {
		t.Fatalf("metrics: %d %v", resp.StatusCode, body)
	}
	auth.allow["alice"] = append(auth.allow["alice"], "/metrics")
	if resp, _ := do(t, req); resp.StatusCode != http.StatusOK {
		t.Fatalf("metrics allowed: %d", resp.StatusCode)
	}
}

func TestAModelIsRoutedOnlyToTheLanesTheCallerMayCall(t *testing.T) {
	// Of the model's three lanes, "short" would win (smallest bucket, resident); bob may call
	// only "also" and "long".
	auth := &fakeAuth{users: map[string]string{"b": "bob", "c": "carol"}, allow: map[string][]string{
		"bob": {"team/also/embeddings", "team/long/embeddings"}}}
	ts, runner := newAuthServer(t, auth)
	resp, body := postAs(t, ts.URL+"/v1/embeddings", "b", `{"model": "gte", "input": "x"}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Synapse-Lane") != "team/also" {
		t.Fatalf("bob: %d %v %v", resp.StatusCode, resp.Header, body)
	}
	if runner.lanes[0] != "team/also" {
		t.Fatalf("ran on %v", runner.lanes)
	}
	resp, body = postAs(t, ts.URL+"/v1/embeddings", "c", `{"model": "gte", "input": "x"}`)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(errorMessageOf(body), "any lane of model gte") {
		t.Fatalf("carol: %d %v", resp.StatusCode, body)
	}
}

func TestAnAuthDecisionThatCannotBeMadeIs503NotARefusalOrAPass(t *testing.T) {
	auth := &fakeAuth{users: map[string]string{"a": "alice"}, allow: map[string][]string{"alice": {"team/embed/embeddings"}}}
	ts, runner := newAuthServer(t, auth)
	// The API server away, too many reviews in flight, too many made-up tokens lately: each is
	// 503 with a time to come back.
	for _, err := range []error{errors.New("the API server is away"), apiauth.ErrBusy, apiauth.ErrTooManyRefused} {
		auth.authnErr = err
		resp, body := postAs(t, ts.URL+"/v1/embeddings", "a", `{"model": "team/embed", "input": "x"}`)
		if resp.StatusCode != http.StatusServiceUnavailable || errorCodeOf(body) != CodeAuthUnavailable || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("authn error %v: %d %v %v", err, resp.StatusCode, resp.Header, body)
		}
	}
	auth.authnErr, auth.authzErr = nil, errors.New("the API server is away")
	for _, model := range []string{"team/embed", "gte"} {
		resp, body := postAs(t, ts.URL+"/v1/embeddings", "a", `{"model": "`+model+`", "input": "x"}`)
		if resp.StatusCode != http.StatusServiceUnavailable || errorCodeOf(body) != CodeAuthUnavailable || resp.Header.Get("Retry-After") != "1" {
			t.Fatalf("authz error, %s: %d %v %v", model, resp.StatusCode, resp.Header, body)
		}
	}
	if len(runner.calls) != 0 {
		t.Fatalf("ran %d calls", len(runner.calls))
	}
}

func TestAnAgentWithoutAuthLetsNoCallIn(t *testing.T) {
	ts, runner := newAuthServer(t, nil)
	resp, body := postAs(t, ts.URL+"/v1/embeddings", "anything", `{"model": "team/embed", "input": "x"}`)
	if resp.StatusCode != http.StatusUnauthorized || errorCodeOf(body) != CodeUnauthorized || len(runner.calls) != 0 {
		t.Fatalf("%d %v", resp.StatusCode, body)
	}
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func errorField(body map[string]any, k string) string {
	e, _ := body["error"].(map[string]any)
	s, _ := e[k].(string)
	return s
}

func errorCodeOf(body map[string]any) string    { return errorField(body, "code") }
func errorTypeOf(body map[string]any) string    { return errorField(body, "type") }
func errorMessageOf(body map[string]any) string { return errorField(body, "message") }

// waitingAuth authenticates every token and answers no access review until the review's
// context ends.
type waitingAuth struct{}

func (waitingAuth) AuthenticateRequest(*http.Request) (user.Info, bool, string, error) {
	return &user.DefaultInfo{Name: "someone"}, true, "", nil
}

func (waitingAuth) Authorize(ctx context.Context, _ user.Info, _ apiauth.Access) (bool, string, error) {
	<-ctx.Done()
	return false, "", ctx.Err()
}

// TestAnAccessReviewEndsAtTheCallsDeadline: once the body names the lane, the wait for the
// caller's access review is the call's, bounded by its deadline on the lane, and a deadline
// that passes there is answered deadline_exceeded (504), not auth_unavailable.
func TestAnAccessReviewEndsAtTheCallsDeadline(t *testing.T) {
	l := testLane("quick", "embed", []int{128})
	l.Deadline = 50 * time.Millisecond
	s := New(Config{Node: "mac-1", Catalog: laneCatalog{l}, Runner: &fakeRunner{}, Clock: clocktesting.NewFakeClock(epoch), Auth: waitingAuth{}})
	req := httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(`{"model":"team/quick","input":"a text"}`))
	req.Header.Set("Authorization", "Bearer t")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	if rec.Code != http.StatusGatewayTimeout || !strings.Contains(rec.Body.String(), `"code":"deadline_exceeded"`) {
		t.Fatalf("answered %d %s, want 504 deadline_exceeded", rec.Code, rec.Body)
	}
}

// steppingAuth allows every call, and its review of a token takes step of the fake clock.
type steppingAuth struct {
	clk  *clocktesting.FakeClock
	step time.Duration
}

func (a steppingAuth) AuthenticateRequest(*http.Request) (user.Info, bool, string, error) {
	a.clk.Step(a.step)
	return &user.DefaultInfo{Name: "someone"}, true, "", nil
}

func (steppingAuth) Authorize(context.Context, user.Info, apiauth.Access) (bool, string, error) {
	return true, "", nil
}

// TestACallsDeadlineRunsFromItsArrival: the review of the caller's token counts against the
// call's deadline on its lane, as every later wait does. A review that took 7 s leaves the
// lane's run 23 s of a 30 s deadline, timed from the call's arrival; one that took the whole
// deadline is answered deadline_exceeded before anything runs.
func TestACallsDeadlineRunsFromItsArrival(t *testing.T) {
	l := testLane("quick", "embed", []int{128})
	l.Deadline = 30 * time.Second
	for _, tc := range []struct {
		review time.Duration
		code   int
	}{{7 * time.Second, http.StatusOK}, {31 * time.Second, http.StatusGatewayTimeout}} {
		clk := clocktesting.NewFakeClock(epoch)
		runner := &fakeRunner{}
		s := New(Config{Node: "mac-1", Catalog: laneCatalog{l}, Runner: runner, Clock: clk, Auth: steppingAuth{clk: clk, step: tc.review}, Log: testr.New(t)})
		req := httptest.NewRequest(http.MethodPost, "/v1/embeddings", strings.NewReader(`{"model":"team/quick","input":"a text"}`))
		req.Header.Set("Authorization", "Bearer t")
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != tc.code {
			t.Fatalf("a review of %s: answered %d %s, want %d", tc.review, rec.Code, rec.Body, tc.code)
		}
		if tc.code != http.StatusOK {
			if !strings.Contains(rec.Body.String(), `"code":"deadline_exceeded"`) || len(runner.calls) != 0 {
				t.Fatalf("a review past the deadline: %s, %d runs; want deadline_exceeded and none", rec.Body, len(runner.calls))
			}
			continue
		}
		if len(runner.deadlines) != 1 || !runner.deadlines[0].Equal(epoch.Add(l.Deadline)) {
			t.Fatalf("the run's deadline %v, want %v: from the call's arrival, before its token's review", runner.deadlines, epoch.Add(l.Deadline))
		}
	}
}
