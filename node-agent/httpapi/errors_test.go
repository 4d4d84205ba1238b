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
	"strings"
	"testing"
)

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
