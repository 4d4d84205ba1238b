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

package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
)

// fakeModel is a model as place sees it: held or not, a load that fails once if told to.
type fakeModel struct {
	held             ane.Origin
	failHeldLoad     bool
	compiled, origin ane.Origin
	calls            []string
	keepErr          error
}

func (f *fakeModel) Cached() (bool, error) {
	f.calls = append(f.calls, "cached")
	return f.held != "", nil
}
func (f *fakeModel) Held() ane.Origin { return f.held }
func (f *fakeModel) Compile() error {
	f.calls = append(f.calls, "compile")
	f.compiled = ane.FromCompile
	return nil
}

func (f *fakeModel) Load() error {
	f.calls = append(f.calls, "load")
	if f.compiled == "" && f.failHeldLoad {
		return &ane.CallError{Call: "load", Domain: "com.apple.appleneuralengine", Code: 5, Detail: "stale",
			Underlying: &ane.CallError{Domain: "NSPOSIXErrorDomain", Code: 2, Detail: "No such file"}}
	}
	f.origin = f.held
	if f.compiled != "" {
		f.origin = f.compiled
	}
	return nil
}
func (f *fakeModel) Origin() ane.Origin { return f.origin }
func (f *fakeModel) KeepErr() error     { return f.keepErr }

// TestTheLadderFallsBackToCompileOnceAndSaysWhichHappened: a held program loads without a
// compile and says where it came from; a held program whose load fails is compiled once
// within the budget, with the failed load and its underlying error kept.
func TestTheLadderFallsBackToCompileOnceAndSaysWhichHappened(t *testing.T) {
	now := tick()
	for name, tc := range map[string]struct {
		m        *fakeModel
		calls    []string
		origin   ane.Origin
		compiles int
	}{
		"held by aned":        {&fakeModel{held: ane.FromAned}, []string{"cached", "load"}, ane.FromAned, 0},
		"held in a kept one":  {&fakeModel{held: ane.FromKept}, []string{"cached", "load"}, ane.FromKept, 0},
		"not held":            {&fakeModel{}, []string{"cached", "compile", "load"}, ane.FromCompile, 1},
		"held, load fails":    {&fakeModel{held: ane.FromKept, failHeldLoad: true}, []string{"cached", "load", "compile", "load"}, ane.FromCompile, 1},
		"kept copy not saved": {&fakeModel{keepErr: errors.New("disk full")}, []string{"cached", "compile", "load"}, ane.FromCompile, 1},
	} {
		b := &budget{limit: 5}
		var c Check
		if err := place(tc.m, &c, b, now); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !slices.Equal(tc.m.calls, tc.calls) || c.Origin != string(tc.origin) || b.used != tc.compiles {
			t.Errorf("%s: calls %v, origin %q, %d compiles; want %v, %q, %d", name, tc.m.calls, c.Origin, b.used, tc.calls, tc.origin, tc.compiles)
		}
		if tc.m.failHeldLoad {
			e := c.HeldLoadError
			if e == nil || e.Code != 5 || e.Underlying == nil || e.Underlying.Domain != "NSPOSIXErrorDomain" || c.Held != string(ane.FromKept) {
				t.Errorf("%s: the failed held load was not kept whole: %+v", name, e)
			}
		}
		if tc.m.keepErr != nil && c.KeepError != "disk full" {
			t.Errorf("%s: keep error %q", name, c.KeepError)
		}
	}
	// The fallback compile is refused past the budget, never made.
	m := &fakeModel{held: ane.FromAned, failHeldLoad: true}
	if err := place(m, &Check{}, &budget{limit: 0}, now); err == nil || slices.Contains(m.calls, "compile") {
		t.Fatalf("a fallback compile past the budget: %v, calls %v", err, m.calls)
	}
}

func TestTheSecondProcessIsJudgedByWhereEachProgramCameFrom(t *testing.T) {
	ids := map[string]string{"a": "1_2_3", "b": "4_5_6"}
	ok := []Check{{Name: "a", Identifier: "1_2_3", Status: Passed, Origin: string(ane.FromAned)}, {Name: "b", Identifier: "4_5_6", Status: Passed, Origin: string(ane.FromKept)}}
	if detail, err := judgeSecondProcess(ids, ok); err != nil || !strings.Contains(detail, "1 from aned's cache, 1 from kept folders") {
		t.Fatalf("%q, %v", detail, err)
	}
	for name, tc := range map[string]struct {
		edit func(c []Check) []Check
		want string
	}{
		"compiled, never held": {func(c []Check) []Check { c[1].Origin = string(ane.FromCompile); return c }, "neither aned nor a kept folder"},
		"held, failed to load": {func(c []Check) []Check {
			c[1].Origin, c[1].Held, c[1].HeldLoadError = string(ane.FromCompile), string(ane.FromAned), &StageError{Message: "stale"}
			return c
		}, "held as aned cache but its load failed (stale)"},
		"another identifier": {func(c []Check) []Check { c[0].Identifier = "9_9_9"; return c }, "same identifier"},
		"one missing":        {func(c []Check) []Check { return c[:1] }, "1 programs of 2"},
		"failed":             {func(c []Check) []Check { c[0].Status, c[0].Detail = Failed, "no"; return c }, "a: no"},
	} {
		if _, err := judgeSecondProcess(ids, tc.edit(slices.Clone(ok))); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// TestADeadLadderProcessLeavesAReportWithItsSignalAndLastStep: the child announces a step,
// saves its report with a stage running, and dies by a signal; the supervisor keeps the
// finished stage, fails the running one with the signal and the step, and writes it.
func TestADeadLadderProcessLeavesAReportWithItsSignalAndLastStep(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.json")
	partial := &Report{Schema: ReportSchema, Stages: []StageResult{{Number: 1, Name: "environment", Status: Passed}, {Number: 2, Name: "one linear layer", Status: Running}}}
	if err := writeReport(path, partial); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", `echo "step: compile 0a_1b_2c" >&2; echo "a line of its own" >&2; kill -ABRT $$`)
	var echo bytes.Buffer
	rep, err := supervise(cmd, path, &echo, time.Unix(0, 0), "log show ...")
	if err != nil {
		t.Fatal(err)
	}
	back, err := readReport(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*Report{rep, back} {
		c := r.Crash
		if c == nil || c.Signal != syscall.SIGABRT.String() || c.LastStep != "compile 0a_1b_2c" || c.Stage != "one linear layer" || r.Passed {
			t.Fatalf("crash %+v, passed %t", c, r.Passed)
		}
		if r.Stages[0].Status != Passed || r.Stages[1].Status != Failed || !strings.Contains(r.Stages[1].Error.Message, "compile 0a_1b_2c") {
			t.Fatalf("stages %+v", r.Stages)
		}
	}
	if !strings.Contains(echo.String(), "a line of its own") {
		t.Fatalf("the child's output was not passed on: %q", echo.String())
	}
	var table bytes.Buffer
	printTable(&table, rep)
	if !strings.Contains(table.String(), `was killed by `+syscall.SIGABRT.String()+` during stage "one linear layer"; its last framework call was "compile 0a_1b_2c"`) {
		t.Fatalf("the table does not say how the ladder died:\n%s", table.String())
	}

	// A child that dies before writing anything still leaves a report; one that finished is
	// left as it wrote it.
	os.Remove(path)
	rep, err = supervise(exec.Command("/bin/sh", "-c", `echo "step: descriptor " >&2; exit 3`), path, &echo, time.Unix(0, 0), "log show ...")
	if err != nil || rep.Crash == nil || rep.Crash.ExitCode != 3 || rep.Crash.Signal != "" || rep.LogCommand != "log show ..." {
		t.Fatalf("a child that wrote nothing: %+v, %v", rep, err)
	}
	if _, err := readReport(path); err != nil {
		t.Fatalf("no report on disk: %v", err)
	}
	if err := writeReport(path, &Report{Schema: ReportSchema, Finished: true, Passed: true}); err != nil {
		t.Fatal(err)
	}
	rep, err = supervise(exec.Command("/bin/sh", "-c", "exit 0"), path, &echo, time.Unix(0, 0), "")
	if err != nil || rep.Crash != nil || !rep.Passed {
		t.Fatalf("a finished child: %+v, %v", rep, err)
	}
}

// TestTheReportIsOnDiskBeforeEachStageAndAfterEachCheck: runLadder saves with the stage
// marked running before it runs, and a stage's own saves land in the report.
func TestTheReportIsOnDiskBeforeEachStageAndAfterEachCheck(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.json")
	rep := &Report{Schema: ReportSchema}
	var seen []string
	save := func() {
		if err := writeReport(path, rep); err != nil {
			t.Fatal(err)
		}
		back, _ := readReport(path)
		var s []string
		for _, st := range back.Stages {
			s = append(s, string(st.Status)+"/"+string(rune('0'+len(st.Checks))))
		}
		seen = append(seen, strings.Join(s, " "))
	}
	runLadder(rep, []stage{
		{"one", func(s *StageResult) error {
			s.Checks = append(s.Checks, Check{Name: "a"})
			save()
			return nil
		}},
		{"two", func(s *StageResult) error { return errors.New("no") }},
	}, tick(), save)
	want := []string{"running/0 not run/0", "running/1 not run/0", "passed/1 not run/0", "passed/1 running/0", "passed/1 failed/0"}
	if !slices.Equal(seen, want) {
		t.Fatalf("saved %q, want %q", seen, want)
	}
}

func TestTheLogCommandReadsAnedAndTheCompilerService(t *testing.T) {
	cmd := ane.LogCommand(time.Date(2026, 12, 4, 15, 0, 30, 0, time.UTC))
	for _, want := range []string{"log show", "--start '2026-12-04 14:59:30'", `process == "aned" OR process == "ANECompilerService"`} {
		if !strings.Contains(cmd, want) {
			t.Errorf("%q lacks %q", cmd, want)
		}
	}
}

// fakeLoadable is a model on a device that holds room programs.
type fakeLoadable struct {
	fakeModel
	dev    *fakeDevice
	loaded bool
}

type fakeDevice struct {
	room, resident, closed int
	code                   int
}

func (f *fakeLoadable) Load() error {
	if f.dev.resident >= f.dev.room {
		return &ane.CallError{Call: "load", Domain: "com.apple.appleneuralengine", Code: f.dev.code, ResourcesExhausted: f.dev.code == 0x20004}
	}
	f.dev.resident++
	f.loaded = true
	return f.fakeModel.Load()
}

func (f *fakeLoadable) Unload() error {
	if f.loaded {
		f.dev.resident--
	}
	return nil
}
func (f *fakeLoadable) Close() { f.dev.closed++ }

// TestTheCapacityStageLoadsUntilRefusedAndJudgesTheBudgetAndTheCode: programs are loaded until
// the device refuses one; the count, the code and whether the worker reads it as the device
// being full are recorded, everything is unloaded, and a device that holds fewer programs
// than the residency budget fails the stage with the number to set.
func TestTheCapacityStageLoadsUntilRefusedAndJudgesTheBudgetAndTheCode(t *testing.T) {
	for name, tc := range map[string]struct {
		room, code int
		want       string
		fails      bool
	}{
		"ironmill's 55":           {55, 0x20004, "held 55 programs and refused the next (com.apple.appleneuralengine 131076", true},
		"the budget, then full":   {120, 0x20004, "100 programs resident at once, none refused", false},
		"an unknown refusal code": {100, 7, "100 programs resident at once, none refused", false},
	} {
		dev := &fakeDevice{room: tc.room, code: tc.code}
		b := &budget{limit: 200}
		c, err := fill(func(int) (loadable, error) { return &fakeLoadable{dev: dev}, nil }, b, residencyBudget(), tick())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if dev.resident != 0 || dev.closed != c.Tried {
			t.Fatalf("%s: %d left resident, %d of %d closed", name, dev.resident, dev.closed, c.Tried)
		}
		detail, err := judgeCapacity(c)
		if (err != nil) != tc.fails || !strings.Contains(detail+fmt.Sprint(err), tc.want) {
			t.Errorf("%s: %q, %v; want %q (fails %t)", name, detail, err, tc.want, tc.fails)
		}
	}
	// A refusal at the budget's edge with a code the worker does not know fails by its code.
	c := Capacity{Loaded: 100, Budget: 100, Refusal: &StageError{Domain: "d", Code: 7}}
	if _, err := judgeCapacity(c); err == nil || !strings.Contains(err.Error(), "does not read as the device being full") {
		t.Fatalf("an unrecognised code: %v", err)
	}
}
