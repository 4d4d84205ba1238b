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

// Package docs holds the project's documents; its test keeps docs/no-silent-fallback.md true.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	rowRE  = regexp.MustCompile("^\\| \\d+ \\|")
	pkgRE  = regexp.MustCompile("`([a-z0-9/-]+)`: ((?:`Test[A-Za-z0-9_]+`|\"[^\"]+\")(?:, (?:`Test[A-Za-z0-9_]+`|\"[^\"]+\"))*)")
	itemRE = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`|\"([^\"]+)\"")
)

// TestEveryPinningTestOfTheAuditExists reads the audit's table and checks that each test it
// names is defined in the package it names: a Go test function, or a ginkgo spec's text.
func TestEveryPinningTestOfTheAuditExists(t *testing.T) {
	data, err := os.ReadFile("no-silent-fallback.md")
	if err != nil {
		t.Fatal(err)
	}
	rows, checked := 0, 0
	for _, line := range strings.Split(string(data), "\n") {
		if !rowRE.MatchString(line) {
			continue
		}
		rows++
		cells := strings.Split(line, " | ")
		pinned := cells[len(cells)-1]
		refs := pkgRE.FindAllStringSubmatch(pinned, -1)
		if len(refs) == 0 {
			t.Errorf("row %q names no test", cells[0])
		}
		for _, ref := range refs {
			src := packageSource(t, filepath.Join("..", ref[1]))
			for _, item := range itemRE.FindAllStringSubmatch(ref[2], -1) {
				checked++
				switch {
				case item[1] != "" && !strings.Contains(src, "func "+item[1]+"("):
					t.Errorf("%s has no test %s", ref[1], item[1])
				case item[2] != "" && !strings.Contains(src, `It("`+item[2]+`"`):
					t.Errorf("%s has no spec %q", ref[1], item[2])
				}
			}
		}
	}
	if rows < 20 || checked < rows {
		t.Fatalf("read %d rows and %d tests: the table was not parsed", rows, checked)
	}
}

// packageSource is every test file of a package, concatenated.
func packageSource(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files in %s", dir)
	}
	var b strings.Builder
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(data)
	}
	return b.String()
}
