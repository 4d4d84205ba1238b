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

// Command mutate is the residency core's mutation gate (`make mutate`): it plants one bug per
// rule, one at a time, and requires the simulator, or a named test, to catch each. A rule that
// no check catches is not tested, however many tests pass.
//
// Each mutant is compiled through `go test -overlay`, so the work tree is never touched and an
// interrupted run leaves nothing behind.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

const simulator = "./node-agent/residency/simulation"

// named are the packages whose tests are the named checks of the core's rules.
var named = []string{"./node-agent/compilequeue", "./node-agent/residency", "./node-agent/supervisor"}

var (
	seedLine = regexp.MustCompile(`seed (\d+), step \d+, at [^:]+: (.*)`)
	failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
)

func main() {
	seeds := flag.Int("seeds", 300, "seeds the simulator runs against each mutant")
	all := flag.Bool("all", false, "run the named tests against every mutant, not only those the simulator misses")
	only := flag.String("only", "", "run only the mutant of this name")
	flag.Parse()
	if err := run(*seeds, *all, *only); err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		os.Exit(1)
	}
}

func run(seeds int, all bool, only string) error {
	tmp, err := os.MkdirTemp("", "mutate")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	ran, survived := 0, 0
	began := time.Now()
	for i, m := range mutants {
		if only != "" && m.Name != only {
			continue
		}
		ran++
		overlay, err := plant(tmp, i, m)
		if err != nil {
			return err
		}
		var caught []string
		out, failed := goTest(overlay, simulator, "-run", "^TestSimulation$", "-args", "-seeds", fmt.Sprint(seeds))
		if failed {
			if mm := seedLine.FindStringSubmatch(out); mm != nil {
				caught = append(caught, fmt.Sprintf("simulator (seed %s: %s)", mm[1], firstLine(mm[2])))
			} else {
				return fmt.Errorf("mutant %s: the simulator failed without naming a seed:\n%s", m.Name, out)
			}
		}
		if len(caught) == 0 || all {
			out, failed := goTest(overlay, named...)
			if failed {
				tests := failLine.FindAllStringSubmatch(out, -1)
				if len(tests) == 0 {
					return fmt.Errorf("mutant %s: the named tests failed without naming a test:\n%s", m.Name, out)
				}
				for _, t := range tests {
					if !strings.Contains(t[1], "/") {
						caught = append(caught, t[1])
					}
				}
			}
		}
		status := "caught"
		if len(caught) == 0 {
			status, survived = "SURVIVED", survived+1
		}
		fmt.Printf("%-34s %-8s %s\n    rule: %s\n", m.Name, status, strings.Join(caught, ", "), m.Rule)
	}
	fmt.Printf("%d mutants in %s, %d survived\n", ran, time.Since(began).Round(time.Second), survived)
	if survived > 0 {
		return fmt.Errorf("%d mutants survived: their rules are not checked", survived)
	}
	return nil
}

// plant writes mutant m's file and an overlay that puts it in place of the original.
func plant(tmp string, i int, m mutant) (string, error) {
	src, err := os.ReadFile(m.File)
	if err != nil {
		return "", fmt.Errorf("mutant %s: %w", m.Name, err)
	}
	if n := strings.Count(string(src), m.Old); n != 1 {
		return "", fmt.Errorf("mutant %s: its code occurs %d times in %s, want once: update the mutant with the code it breaks", m.Name, n, m.File)
	}
	abs, err := filepath.Abs(m.File)
	if err != nil {
		return "", err
	}
	mutated := filepath.Join(tmp, fmt.Sprintf("%02d-%s", i, filepath.Base(m.File)))
	if err := os.WriteFile(mutated, []byte(strings.Replace(string(src), m.Old, m.New, 1)), 0o600); err != nil {
		return "", err
	}
	overlay := filepath.Join(tmp, fmt.Sprintf("%02d-overlay.json", i))
	b, err := json.Marshal(map[string]map[string]string{"Replace": {abs: mutated}})
	if err != nil {
		return "", err
	}
	return overlay, os.WriteFile(overlay, b, 0o600)
}

// goTest runs go test with the overlay and reports its output and whether it failed. A mutant
// that does not build is a broken gate, not a caught bug.
func goTest(overlay string, args ...string) (string, bool) {
	cmd := exec.Command("go", append([]string{"test", "-overlay", overlay, "-count=1"}, args...)...)
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "[build failed]") || strings.Contains(string(out), "[setup failed]") {
		fmt.Fprintf(os.Stderr, "mutate: a mutant does not build:\n%s", out)
		os.Exit(2)
	}
	return string(out), err != nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 140 {
		s = s[:140] + "…"
	}
	return s
}
