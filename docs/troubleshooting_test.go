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

package docs

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/ck-synapse/synapse-fleet/internal/reasons"
)

// dynamicReasons are the places a reason is built at run time, which the finder cannot follow
// to a constant, with every value each can take. A new such place fails the test until it is
// listed here and its values are on the page.
var dynamicReasons = map[string][]string{
	// ANEAvailable's reason names the worker backend, an enum of the API (ane, sim).
	`node-agent/agent/status.go writeNodeStatus "Backend" + capitalise(string(a.cfg.Worker.Backend))`: {"BackendAne", "BackendSim"},
}

// sectionKinds maps the page's level-two headings to the kind of value their tables document.
var sectionKinds = map[string]reasons.Kind{
	"Condition reasons": reasons.ConditionReason,
	"Event reasons":     reasons.EventReason,
	"Fault codes":       reasons.FaultCode,
	"Refusal codes":     reasons.RefusalCode,
}

var backticked = regexp.MustCompile("`([^`]+)`")

// documented reads the page's tables: for each kind, the names in the first cell of its rows.
func documented(t *testing.T, page string) map[reasons.Kind]map[string]bool {
	t.Helper()
	out := map[reasons.Kind]map[string]bool{}
	var kind reasons.Kind
	for line := range strings.SplitSeq(page, "\n") {
		if h, ok := strings.CutPrefix(line, "## "); ok {
			kind = sectionKinds[strings.TrimSpace(h)]
			continue
		}
		if kind == "" || !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range backticked.FindAllStringSubmatch(first, -1) {
			if out[kind] == nil {
				out[kind] = map[string]bool{}
			}
			out[kind][m[1]] = true
		}
	}
	return out
}

// TestTroubleshootingExplainsEveryReasonAndCode finds every condition reason, event reason,
// fault code and refusal code the controller and the agents can emit (their linux and
// darwin/arm64 builds), and requires a row for each on docs/troubleshooting.md, in the section
// of its kind; a row naming one the code no longer emits fails too.
func TestTroubleshootingExplainsEveryReasonAndCode(t *testing.T) {
	data, err := os.ReadFile("troubleshooting.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := documented(t, string(data))
	found, err := reasons.Find("..", [][]string{nil, {"GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=0"}},
		".", "./controllers/...", "./node-agent/...", "./api/...")
	if err != nil {
		t.Fatal(err)
	}
	emitted := map[reasons.Kind]map[string][]string{}
	emit := func(k reasons.Kind, v, at string) {
		if v == "" {
			return // "no reason yet": never written into a condition
		}
		if emitted[k] == nil {
			emitted[k] = map[string][]string{}
		}
		emitted[k][v] = append(emitted[k][v], at)
	}
	for _, v := range found.Values {
		emit(v.Kind, v.Value, v.At)
	}
	for _, d := range found.Dynamic {
		values, ok := dynamicReasons[d.Key()]
		if !ok {
			t.Errorf("a %s is built at run time at %q: list the values it can take in dynamicReasons and on the page", d.Kind, d.Key())
			continue
		}
		for _, v := range values {
			emit(d.Kind, v, d.File)
		}
	}
	if len(emitted[reasons.ConditionReason]) < 50 || len(emitted[reasons.RefusalCode]) < 20 {
		t.Fatalf("found %d condition reasons and %d refusal codes: the code was not read", len(emitted[reasons.ConditionReason]), len(emitted[reasons.RefusalCode]))
	}
	for kind, values := range emitted {
		names := make([]string, 0, len(values))
		for v := range values {
			names = append(names, v)
		}
		slices.Sort(names)
		for _, v := range names {
			if !doc[kind][v] {
				t.Errorf("%s %q (emitted at %s) has no row on docs/troubleshooting.md", kind, v, strings.Join(values[v], ", "))
			}
		}
	}
	for kind, names := range doc {
		for v := range names {
			if _, ok := emitted[kind][v]; !ok {
				t.Errorf("docs/troubleshooting.md documents %s %q, which nothing emits: remove its row", kind, v)
			}
		}
	}
}
