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

package audit

import (
	"bufio"
	"bytes"
	"context"
	"debug/macho"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2/types"
)

// The results a named test can have. Only Passed (or Compiled, for a darwin-only test) lets the
// audit pass: a test that is missing from the run, skipped or failed does not pin anything.
const (
	Passed   = "passed"
	Compiled = "compiled for darwin"
	Failed   = "failed"
	Skipped  = "skipped"
	Missing  = "missing"
)

// Outcome is what became of one named test.
type Outcome struct {
	Package, Name string
	Darwin        bool
	Result        string
}

// OK reports whether the outcome pins its row.
func (o Outcome) OK() bool { return o.Result == Passed || o.Darwin && o.Result == Compiled }

// Runner runs the named tests of a module.
type Runner struct {
	// Dir is the module's root.
	Dir string
	// Timeout bounds each package's run (go test -timeout).
	Timeout time.Duration
	// Log, if set, receives the test runs' output as `go test -json` reports it.
	Log io.Writer
}

// Run runs every pin's tests, one package at a time: Go tests with `go test -json -run`,
// ginkgo specs with their focus and a JSON report, and a darwin-only package's tests by
// compiling its test binary for darwin/arm64 and finding each test in its symbol table. Every
// named test gets an outcome; a run that cannot start is an error.
func (r Runner) Run(ctx context.Context, pins []Pin) ([]Outcome, error) {
	var out []Outcome
	for _, p := range pins {
		var (
			got map[string]string
			err error
		)
		switch {
		case p.Darwin:
			got, err = r.darwin(ctx, p)
		default:
			got = map[string]string{}
			if len(p.Tests) > 0 {
				if got, err = r.goTests(ctx, p); err != nil {
					return nil, err
				}
			}
			if len(p.Specs) > 0 {
				var specs map[string]string
				if specs, err = r.specs(ctx, p); err == nil {
					for k, v := range specs {
						got[k] = v
					}
				}
			}
		}
		if err != nil {
			return nil, err
		}
		for _, name := range append(append([]string(nil), p.Tests...), p.Specs...) {
			res, ok := got[name]
			if !ok {
				res = Missing
			}
			out = append(out, Outcome{Package: p.Package, Name: name, Darwin: p.Darwin, Result: res})
		}
	}
	return out, nil
}

func (r Runner) timeout() string {
	if r.Timeout == 0 {
		return "30m"
	}
	return r.Timeout.String()
}

func (r Runner) command(ctx context.Context, env []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = r.Dir
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action, Package, Test, Output string
}

// goTests runs the pin's Go tests and reads each one's final action.
func (r Runner) goTests(ctx context.Context, p Pin) (map[string]string, error) {
	names := make([]string, len(p.Tests))
	for i, t := range p.Tests {
		names[i] = regexp.QuoteMeta(t)
	}
	cmd := r.command(ctx, nil, "test", "-json", "-count=1", "-timeout", r.timeout(), "-run", "^("+strings.Join(names, "|")+")$", "./"+p.Package)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, r.logOrDiscard()
	runErr := cmd.Run()
	got, err := judgeEvents(&stdout, r.Log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (go test: %v)", p.Package, err, runErr)
	}
	return got, nil
}

// judgeEvents reads a `go test -json` stream: each top-level test's last action.
func judgeEvents(stream io.Reader, log io.Writer) (map[string]string, error) {
	got := map[string]string{}
	sc := bufio.NewScanner(stream)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if err := json.Unmarshal(line, &e); err != nil {
			// go test writes build failures as plain text; they leave the tests missing.
			if log != nil {
				fmt.Fprintf(log, "%s\n", line)
			}
			continue
		}
		if log != nil && e.Output != "" {
			fmt.Fprint(log, e.Output)
		}
		if e.Test == "" || strings.Contains(e.Test, "/") {
			continue
		}
		switch e.Action {
		case "pass":
			got[e.Test] = Passed
		case "fail":
			got[e.Test] = Failed
		case "skip":
			got[e.Test] = Skipped
		}
	}
	return got, sc.Err()
}

// specs runs the pin's ginkgo specs (focused on their texts) and reads their states from
// ginkgo's JSON report.
func (r Runner) specs(ctx context.Context, p Pin) (map[string]string, error) {
	report, err := os.CreateTemp("", "audit-ginkgo-*.json")
	if err != nil {
		return nil, err
	}
	report.Close()
	defer os.Remove(report.Name())
	focus := make([]string, len(p.Specs))
	for i, s := range p.Specs {
		focus[i] = regexp.QuoteMeta(s) + "$"
	}
	cmd := r.command(ctx, nil, "test", "-json", "-count=1", "-timeout", r.timeout(), "./"+p.Package, "-args",
		"-ginkgo.focus="+strings.Join(focus, "|"), "-ginkgo.json-report="+report.Name(), "-ginkgo.no-color")
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, r.logOrDiscard()
	_ = cmd.Run() // a failing suite is judged from its report below
	if _, err := judgeEvents(&stdout, r.Log); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(report.Name())
	if err != nil {
		return nil, err
	}
	return judgeSpecs(data, p.Specs)
}

// judgeSpecs reads a ginkgo JSON report: each named spec's state (every spec of that text must
// have passed).
func judgeSpecs(data []byte, names []string) (map[string]string, error) {
	got := map[string]string{}
	if len(bytes.TrimSpace(data)) == 0 {
		return got, nil // the suite never ran: every spec is missing
	}
	var reports []types.Report
	if err := json.Unmarshal(data, &reports); err != nil {
		return nil, fmt.Errorf("the ginkgo report: %w", err)
	}
	for _, rep := range reports {
		for _, s := range rep.SpecReports {
			if s.LeafNodeType != types.NodeTypeIt {
				continue
			}
			for _, name := range names {
				if s.LeafNodeText != name {
					continue
				}
				switch {
				case s.State == types.SpecStatePassed:
					if _, ok := got[name]; !ok {
						got[name] = Passed
					}
				case s.State.Is(types.SpecStateSkipped | types.SpecStatePending):
					got[name] = Skipped
				default:
					got[name] = Failed
				}
			}
		}
	}
	return got, nil
}

// darwin compiles the package's test binary for darwin/arm64 and finds each named test
// function in its symbol table.
func (r Runner) darwin(ctx context.Context, p Pin) (map[string]string, error) {
	dir, err := os.MkdirTemp("", "audit-darwin-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "pkg.test")
	cmd := r.command(ctx, []string{"GOOS=darwin", "GOARCH=arm64", "CGO_ENABLED=0"}, "test", "-c", "-o", bin, "./"+p.Package)
	cmd.Stdout, cmd.Stderr = r.logOrDiscard(), r.logOrDiscard()
	if err := cmd.Run(); err != nil {
		return map[string]string{}, nil // nothing compiled: every test is missing
	}
	list := r.command(ctx, nil, "list", "-f", "{{.ImportPath}}", "./"+p.Package)
	path, err := list.Output()
	if err != nil {
		return nil, fmt.Errorf("%s: go list: %w", p.Package, err)
	}
	return compiledTests(bin, strings.TrimSpace(string(path)), p.Tests)
}

// compiledTests reports which of the tests are functions of the Mach-O test binary at bin.
func compiledTests(bin, importPath string, tests []string) (map[string]string, error) {
	f, err := macho.Open(bin)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	got := map[string]string{}
	if f.Symtab == nil {
		return got, nil
	}
	for _, s := range f.Symtab.Syms {
		for _, t := range tests {
			if s.Name == importPath+"."+t || s.Name == importPath+"_test."+t {
				got[t] = Compiled
			}
		}
	}
	return got, nil
}

func (r Runner) logOrDiscard() io.Writer {
	if r.Log == nil {
		return io.Discard
	}
	return r.Log
}
