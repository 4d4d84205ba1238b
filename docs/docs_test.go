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

// Package docs holds the project's documents. Its tests keep docs/no-silent-fallback.md true:
// its tables read, every discarded error and recovered panic in the node agent is classified
// there, and `make audit` (run by CI) runs every test the table names with `go test -json`.
package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ck-synapse/synapse-fleet/internal/audit"
)

func readAudit(t *testing.T) *audit.Audit {
	t.Helper()
	data, err := os.ReadFile("no-silent-fallback.md")
	if err != nil {
		t.Fatal(err)
	}
	a, err := audit.Parse(string(data))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestTheAuditTableNamesATestForEveryRow reads the table: every row is pinned, rows are
// numbered in order, and every package named holds tests. Whether each named test runs and
// passes is `make audit`'s to say: it runs them.
func TestTheAuditTableNamesATestForEveryRow(t *testing.T) {
	a := readAudit(t)
	for i, r := range a.Rows {
		if r.Number != i+1 {
			t.Errorf("row %d follows row %d", r.Number, i)
		}
	}
	if len(a.Rows) < 40 {
		t.Fatalf("read %d rows: the table was not parsed", len(a.Rows))
	}
	for _, p := range a.Packages() {
		files, err := filepath.Glob(filepath.Join("..", filepath.FromSlash(p.Package), "*_test.go"))
		if err != nil || len(files) == 0 {
			t.Errorf("%s holds no tests", p.Package)
		}
	}
}

// TestEveryDiscardedErrorAndRecoverIsClassified finds every error the node agent drops and
// every panic it recovers, in its linux and its darwin/arm64 builds, and checks each against
// the audit's table of discards: one that is not there, or a row whose discard is gone, fails.
func TestEveryDiscardedErrorAndRecoverIsClassified(t *testing.T) {
	a := readAudit(t)
	found, err := audit.FindDiscards("..", [][]string{nil, {"GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=0"}}, "./node-agent/...")
	if err != nil {
		t.Fatal(err)
	}
	if len(found) < 20 {
		t.Fatalf("found %d discards: the packages were not read", len(found))
	}
	missing, stale := a.Unclassified(found)
	var rows []string
	for _, d := range missing {
		rows = append(rows, fmt.Sprintf("| `%s` `%s` | `%s` | <class> | <why it cannot change where a request runs> |", d.File, d.Func, d.What))
	}
	if len(rows) > 0 {
		t.Errorf("%d discarded errors or recovers are not classified in no-silent-fallback.md; handle the error, or add a row:\n%s", len(rows), strings.Join(rows, "\n"))
	}
	for _, s := range stale {
		t.Errorf("no-silent-fallback.md classifies a discard that is gone: %s", s.Key())
	}
}
