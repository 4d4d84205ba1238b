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

// Package audit is the machinery of the no-silent-fallback audit (docs/no-silent-fallback.md):
// it reads the audit's tables, runs every test they name with `go test -json` and judges each
// passed, or compiled for darwin where the table says the test runs only there, and lists every
// error the node agent discards and every panic it recovers, for the audit to classify.
package audit

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Row is one path of the audit's table.
type Row struct {
	Number int
	Path   string
	Pins   []Pin
}

// Pin is the tests of one package that pin a row.
type Pin struct {
	// Package is the package's directory, relative to the module ("node-agent/convert").
	Package string
	// Darwin: the tests run only on macOS on Apple silicon; elsewhere they are compiled for it.
	Darwin bool
	// Tests are Go test functions; Specs are ginkgo specs, by their It text.
	Tests, Specs []string
}

// Class is a kind of discarded error or recovered panic.
type Class string

// The classes a discard may be in. None can change where a request runs.
const (
	// Cleanup: releasing what a path that already failed or finished held (a close, a remove,
	// an unlock, a kill of a process already being replaced).
	Cleanup Class = "cleanup"
	// FailsClosed: what is dropped only ever causes the stricter path next (an unwritten stamp
	// means a full verification next time).
	FailsClosed Class = "fails closed"
	// Reported: the error reaches the caller or the status another way (the same condition is
	// observed and answered elsewhere), named in the reason.
	Reported Class = "reported elsewhere"
	// Output: information for a person (text to a terminal, a log or stderr, an HTTP body after
	// its status line, a field of a status nothing decides on); a failure changes no decision.
	Output Class = "output"
	// CannotFail: the call's error is impossible for its arguments, by its documentation or by
	// construction (a path WalkDir found under the root it walks, a struct of plain fields).
	CannotFail Class = "cannot fail"
	// RecoverToError: a recover that turns a library's panic into an error the caller refuses
	// the input with.
	RecoverToError Class = "recover to error"
)

var classes = []Class{Cleanup, FailsClosed, Reported, Output, CannotFail, RecoverToError}

// Allowed is one row of the audit's table of discards: where, what, its class and why.
type Allowed struct {
	Discard
	Class  Class
	Reason string
}

// Audit is the audit document's two tables.
type Audit struct {
	Rows    []Row
	Allowed []Allowed
}

var (
	pathRowRE    = regexp.MustCompile("^\\| (\\d+) \\| ")
	discardRowRE = regexp.MustCompile("^\\| `([^`]+)` `([^`]+)` \\| `([^`]+)` \\| ([a-z ]+) \\| (.+) \\|$")
	pinRE        = regexp.MustCompile("`([a-z0-9][a-z0-9/._-]*)`( \\(darwin\\))?: ((?:`Test[A-Za-z0-9_]+`|\"[^\"]+\")(?:, (?:`Test[A-Za-z0-9_]+`|\"[^\"]+\"))*)")
	itemRE       = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`|\"([^\"]+)\"")
)

// Parse reads the audit document: the table of paths (rows starting "| <n> |", the last cell
// naming the pinning tests as "`pkg`: `TestX`, \"spec text\"; `pkg` (darwin): `TestY`") and the
// table of discards ("| `file` `func` | `what` | class | reason |").
func Parse(doc string) (*Audit, error) {
	a := &Audit{}
	seen := map[int]bool{}
	for n, line := range strings.Split(doc, "\n") {
		if m := pathRowRE.FindStringSubmatch(line); m != nil {
			var r Row
			fmt.Sscan(m[1], &r.Number)
			cells := strings.Split(line, " | ")
			if len(cells) < 4 {
				return nil, fmt.Errorf("line %d: row %d has %d cells", n+1, r.Number, len(cells))
			}
			if seen[r.Number] {
				return nil, fmt.Errorf("line %d: row %d appears twice", n+1, r.Number)
			}
			seen[r.Number] = true
			r.Path = cells[1]
			for _, ref := range pinRE.FindAllStringSubmatch(cells[len(cells)-1], -1) {
				p := Pin{Package: ref[1], Darwin: ref[2] != ""}
				for _, item := range itemRE.FindAllStringSubmatch(ref[3], -1) {
					if item[1] != "" {
						p.Tests = append(p.Tests, item[1])
					} else {
						p.Specs = append(p.Specs, item[2])
					}
				}
				if p.Darwin && len(p.Specs) > 0 {
					return nil, fmt.Errorf("line %d: row %d: a darwin-only pin names ginkgo specs; name Go tests", n+1, r.Number)
				}
				r.Pins = append(r.Pins, p)
			}
			if len(r.Pins) == 0 {
				return nil, fmt.Errorf("line %d: row %d names no test that pins it", n+1, r.Number)
			}
			a.Rows = append(a.Rows, r)
			continue
		}
		if m := discardRowRE.FindStringSubmatch(line); m != nil {
			c := Class(m[4])
			if !slices.Contains(classes, c) {
				return nil, fmt.Errorf("line %d: class %q is none of %v", n+1, c, classes)
			}
			a.Allowed = append(a.Allowed, Allowed{Discard: Discard{File: m[1], Func: m[2], What: m[3]}, Class: c, Reason: strings.TrimSpace(m[5])})
		}
	}
	if len(a.Rows) == 0 {
		return nil, fmt.Errorf("the document has no table of paths")
	}
	return a, nil
}

// Packages groups the rows' pins by package and platform: each package's tests and specs,
// once each.
func (a *Audit) Packages() []Pin {
	by := map[string]*Pin{}
	var order []string
	for _, r := range a.Rows {
		for _, p := range r.Pins {
			key := fmt.Sprintf("%s %t", p.Package, p.Darwin)
			q := by[key]
			if q == nil {
				q = &Pin{Package: p.Package, Darwin: p.Darwin}
				by[key] = q
				order = append(order, key)
			}
			for _, t := range p.Tests {
				if !slices.Contains(q.Tests, t) {
					q.Tests = append(q.Tests, t)
				}
			}
			for _, s := range p.Specs {
				if !slices.Contains(q.Specs, s) {
					q.Specs = append(q.Specs, s)
				}
			}
		}
	}
	slices.Sort(order)
	out := make([]Pin, len(order))
	for i, k := range order {
		out[i] = *by[k]
	}
	return out
}

// Unclassified lists the discards that no row of the table allows, and the rows that allow
// nothing found (a discard that is gone must leave the table too).
func (a *Audit) Unclassified(found []Discard) (missing []Discard, stale []Allowed) {
	allowed := map[string]bool{}
	for _, al := range a.Allowed {
		allowed[al.Key()] = true
	}
	present := map[string]bool{}
	for _, d := range found {
		present[d.Key()] = true
		if !allowed[d.Key()] {
			missing = append(missing, d)
		}
	}
	for _, al := range a.Allowed {
		if !present[al.Key()] {
			stale = append(stale, al)
		}
	}
	return missing, stale
}
