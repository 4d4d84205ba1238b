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
	"go/ast"
	"go/parser"
	"go/token"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// Every answer that tells a caller to come back (503, 429) says when, in Retry-After and in
// retry_after_ms: each refusal code, read from the refusal package's source so that a code
// added later is checked too, and the agent's own codes of that kind.
func TestEvery503And429CarriesRetryAfter(t *testing.T) {
	cases := map[string]*apiError{
		CodeAuthUnavailable + " (authorization)": {status: http.StatusServiceUnavailable, code: CodeAuthUnavailable, message: "no review"},
		"overloaded at the work gate":            overloaded("every slot taken"),
	}
	codes := refusalCodes(t)
	if len(codes) < 13 {
		t.Fatalf("read %d refusal codes from the source, want every one: %v", len(codes), codes)
	}
	for _, code := range codes {
		cases[string(code)] = fromError(refusal.New(code, "team/lane", "refused"))
	}
	cases["shape_compiling, 2.5 s predicted"] = fromError(&refusal.Error{Code: refusal.ShapeCompiling, Lane: "team/lane", RetryAfter: 2500 * time.Millisecond})
	retrying := 0
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			writeError(rec, e)
			if rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusTooManyRequests {
				if rec.Header().Get("Retry-After") != "" {
					t.Fatalf("%d with Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
				}
				return
			}
			retrying++
			want := max(e.retryAfter, defaultRetryAfter)
			var body errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			secs, err := strconv.Atoi(rec.Header().Get("Retry-After"))
			if err != nil || time.Duration(secs)*time.Second < want || body.Error.RetryAfterMs == nil || *body.Error.RetryAfterMs != want.Milliseconds() {
				t.Fatalf("%d %s: Retry-After %q, retry_after_ms %v, want at least %s", rec.Code, e.code, rec.Header().Get("Retry-After"), body.Error.RetryAfterMs, want)
			}
		})
	}
	if retrying < 10 {
		t.Fatalf("only %d of the answers were 503 or 429", retrying)
	}
}

// refusalCodes are the refusal package's Code constants, read from its source.
func refusalCodes(t *testing.T) []refusal.Code {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../refusal/refusal.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var codes []refusal.Code
	for _, decl := range f.Decls {
		g, ok := decl.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Code" {
				continue
			}
			for _, v := range vs.Values {
				if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					codes = append(codes, refusal.Code(s))
				}
			}
		}
	}
	return codes
}

// The check that lets most messages skip the expression never lets a path through: whatever
// the message, scrub answers what the expression alone would.
func TestScrubRemovesEveryPathTheExpressionWould(t *testing.T) {
	for _, msg := range []string{
		"",
		"lane default/load: 4 calls are running and 32 waiting, the lane's bounds; retry later",
		"/var/lib/synapse/artifacts/x is missing",
		"open /var/lib/synapse/x: no such file",
		"artifact at \"/tmp/a b\" unreadable",
		"artifact='/opt/a'",
		"(/usr/local/bin/worker) exited",
		"path=/a/b and lane default/x",
		"a/b/c d/e",
		"tab\t/etc/passwd",
		"ends with a slash /",
		"lane default/load; it said: /secret/path leaked",
	} {
		cut := msg
		if j := strings.Index(msg, stderrMarker); j >= 0 {
			cut = msg[:j] + " (the worker's output is in the agent's log)"
		}
		want := absPath.ReplaceAllString(cut, "${1}<path>")
		if got := scrub(msg); got != want {
			t.Errorf("scrub(%q) = %q, want %q", msg, got, want)
		}
	}
}

// FuzzScrubMatchesTheExpression is the same check on any message.
func FuzzScrubMatchesTheExpression(f *testing.F) {
	f.Add("open /var/lib/x: denied")
	f.Add("lane a/b refused")
	f.Fuzz(func(t *testing.T, msg string) {
		if strings.Contains(msg, stderrMarker) {
			return
		}
		if got, want := scrub(msg), absPath.ReplaceAllString(msg, "${1}<path>"); got != want {
			t.Errorf("scrub(%q) = %q, want %q", msg, got, want)
		}
	})
}
