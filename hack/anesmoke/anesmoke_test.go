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
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/x448/float16"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// tick is a clock that advances a second per reading.
func tick() func() time.Time {
	t := time.Unix(0, 0)
	return func() time.Time { t = t.Add(time.Second); return t }
}

func TestTheLadderStopsAtTheFirstFailingStageWithTheFrameworksError(t *testing.T) {
	var ran []string
	pass := func(name string) stage {
		return stage{name, func(s *StageResult) error { ran = append(ran, name); s.Detail = "fine"; return nil }}
	}
	rep := &Report{Schema: ReportSchema}
	nserr := &ane.CallError{Call: "compile", Domain: "com.apple.appleneuralengine", Code: 3, Detail: "ANECCompile() FAILED"}
	runLadder(rep, []stage{pass("one"), {"two", func(s *StageResult) error { ran = append(ran, "two"); return fmt.Errorf("linear: %w", nserr) }}, pass("three")}, tick(), func() {})
	if rep.Passed || len(ran) != 2 || ran[1] != "two" {
		t.Fatalf("passed %t, ran %v: want a failed ladder that never ran stage three", rep.Passed, ran)
	}
	want := []Status{Passed, Failed, NotRun}
	for i, s := range rep.Stages {
		if s.Status != want[i] || s.Number != i+1 {
			t.Fatalf("stage %d: %+v", i+1, s)
		}
	}
	e := rep.Stages[1].Error
	if e == nil || e.Domain != "com.apple.appleneuralengine" || e.Code != 3 || e.Description != "ANECCompile() FAILED" || e.Call != "compile" {
		t.Fatalf("the failure lost the NSError: %+v", e)
	}
	if rep.Stages[0].Seconds != 1 {
		t.Fatalf("stage one took %v s on a clock ticking a second per reading", rep.Stages[0].Seconds)
	}
	var table bytes.Buffer
	printTable(&table, rep)
	for _, w := range []string{"1 one", "passed", "2 two", "compile failed: com.apple.appleneuralengine 3: ANECCompile() FAILED", "3 three", "not run", "FAILED"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("the table lacks %q:\n%s", w, table.String())
		}
	}
	// The JSON report reads back as it was written.
	path := filepath.Join(t.TempDir(), "report", "ane-smoke.json")
	if err := writeReport(path, rep); err != nil {
		t.Fatal(err)
	}
	back, err := readReport(path)
	if err != nil || back.Stages[1].Error.Code != 3 || back.Passed {
		t.Fatalf("read back %+v, %v", back, err)
	}
}

func TestTheCompileBudgetIsRefusedBeforeItIsExceeded(t *testing.T) {
	b := &budget{limit: 3}
	if err := b.take(2); err != nil {
		t.Fatal(err)
	}
	if err := b.take(2); err == nil || b.used != 2 {
		t.Fatalf("over the budget: %v, %d used", err, b.used)
	}
	if err := b.take(1); err != nil || b.used != 3 {
		t.Fatalf("the last compile: %v", err)
	}
}

func TestTheEnvironmentStageSaysWhatStopsOrHurtsTheNeuralEnginePath(t *testing.T) {
	yes, no := true, false
	good := Environment{MacOSVersion: "15.2", MacOSBuild: "24C101", Chip: "Apple M4", VirtualMachine: &no, Device: ane.DeviceInfo{HasANE: &yes},
		TempDir: "/var/folders/xy/abc/T/", TMPDIR: "/var/folders/xy/abc/T/", GoTempDir: "/var/folders/xy/abc/T/", ModelURLSet: true,
		SigningIdentifier: "synapse-ane-smoke", WorkerPath: "/usr/local/bin/synapse-ane-worker", WorkerSigningIdentifier: WorkerIdentifier,
		LaunchdManager: "Aqua", UID: 501}
	if summary, warnings, err := checkEnvironment(good, nil); err != nil || len(warnings) != 0 || !strings.Contains(summary, "24C101") {
		t.Fatalf("a good Mac: %q, %v, %v", summary, warnings, err)
	}
	for name, tc := range map[string]struct {
		edit func(e *Environment) error
		want string
	}{
		"a virtual machine":       {func(e *Environment) error { e.VirtualMachine = &yes; return nil }, "virtual machine"},
		"the framework says a VM": {func(e *Environment) error { e.Device.VirtualMachine = &yes; return nil }, "virtual machine"},
		"no Neural Engine":        {func(e *Environment) error { e.Device.HasANE = &no; return nil }, "no Neural Engine"},
		"macOS 14":                {func(e *Environment) error { e.MacOSVersion = "14.6"; return nil }, "macOS 15"},
		"no temporary folder":     {func(e *Environment) error { e.TempDir = ""; return nil }, "temporary folder"},
		"a selector gone": {func(e *Environment) error {
			return &ane.MissingError{Class: "_ANEInMemoryModel", Selector: "modelAttributes", Instance: true}
		}, "modelAttributes"},
	} {
		e := good
		openErr := tc.edit(&e)
		if _, _, err := checkEnvironment(e, openErr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %s", name, err, tc.want)
		}
	}
	for name, tc := range map[string]struct {
		edit func(e *Environment)
		want string
	}{
		"TMPDIR unset (launchd)":  {func(e *Environment) { e.TMPDIR, e.GoTempDir = "", "/tmp" }, "/tmp"},
		"TMPDIR elsewhere":        {func(e *Environment) { e.TMPDIR = "/tmp/mine" }, "/tmp/mine"},
		"an unsigned binary":      {func(e *Environment) { e.SigningIdentifier = "a.out" }, "a.out"},
		"a worker signed another": {func(e *Environment) { e.WorkerSigningIdentifier = "synapse_ane_worker-55f2" }, "sign-worker.sh"},
		"no worker":               {func(e *Environment) { e.WorkerPath = "" }, "--worker"},
		"root":                    {func(e *Environment) { e.UID = 0 }, "UserName"},
		"no setModelURL":          {func(e *Environment) { e.ModelURLSet = false }, "setModelURL"},
	} {
		e := good
		tc.edit(&e)
		_, warnings, err := checkEnvironment(e, nil)
		if err != nil || len(warnings) != 1 || !strings.Contains(warnings[0], tc.want) {
			t.Errorf("%s: %v, %v; want one warning about %s", name, warnings, err, tc.want)
		}
	}
}

func TestTheSigningIdentifierAndLaunchdDomainAreRead(t *testing.T) {
	out := "Executable=/usr/local/bin/synapse-ane-worker\nIdentifier=synapse-ane-worker\nFormat=Mach-O thin (arm64)\nSignature=adhoc\n"
	if got := signingIdentifier(out); got != "synapse-ane-worker" {
		t.Fatalf("identifier %q", got)
	}
	if got := signingIdentifier("code object is not signed at all\n"); got != "" {
		t.Fatalf("an unsigned binary: %q", got)
	}
	for manager, want := range map[string]string{"Aqua\n": "gui/501", "System": "system", "Background": "user/501", "": ""} {
		if got := launchdDomain(manager, 501); !strings.HasPrefix(got, want) {
			t.Errorf("%q: %q, want %s...", manager, got, want)
		}
	}
}

// TestEveryProgramOfTheLadderIsValidAndWithinTheBudget builds every program the ladder
// compiles: each passes the validator (Program runs it), the two-input program and the
// attention forms take the key mask, the names are distinct, the CPU reference of every
// small program evaluates to finite values, and a run stays within the default budget.
func TestEveryProgramOfTheLadderIsValidAndWithinTheBudget(t *testing.T) {
	seen := map[string]bool{}
	perStage := map[int]int{}
	for _, spec := range specs() {
		if seen[spec.name] {
			t.Fatalf("%q twice", spec.name)
		}
		seen[spec.name] = true
		perStage[spec.stage]++
		p, err := spec.build()
		if err != nil {
			t.Fatalf("%s: %v", spec.name, err)
		}
		if err := mil.Validate(p.prog); err != nil {
			t.Fatalf("%s: %v", spec.name, err)
		}
		for _, in := range p.prog.Inputs {
			if len(p.inputs[in.Name]) != in.Values() {
				t.Fatalf("%s: input %s has %d values for %d", spec.name, in.Name, len(p.inputs[in.Name]), in.Values())
			}
		}
		if spec.stage == 3 && (len(p.prog.Inputs) != 2 || strings.Contains(p.prog.Text, "matmul") || strings.Contains(p.prog.Text, "softmax")) {
			t.Fatalf("stage 3's program takes %d inputs and must be a plain add of them, before any attention:\n%s", len(p.prog.Inputs), p.prog.Text)
		}
		if spec.stage == 3 {
			out, err := p.reference()
			if err != nil || out[0] != fp16(p.inputs["x"][0]) || out[formSeq-1] != fp16(fp16(p.inputs["x"][formSeq-1])+mil.MaskNegative) {
				t.Fatalf("stage 3's reference is not x plus the mask: %v", err)
			}
		}
		if spec.stage == 5 {
			if strings.Contains(spec.name, "tiled") && strings.Count(p.prog.Text, "slice_by_size(begin = attn_qbegin_tile") != tiledSeq/512 {
				t.Fatalf("%s is not tiled in %d tiles", spec.name, tiledSeq/512)
			}
			continue // full-size: the family tests check these layers' reference
		}
		out, err := p.reference()
		if err != nil {
			t.Fatalf("%s: %v", spec.name, err)
		}
		if d, ok := compare(out, out); !ok || d != 0 {
			t.Fatalf("%s: the reference gives non-finite values", spec.name)
		}
	}
	if perStage[2] != 1 || perStage[3] != 1 || perStage[4] != len(forms) || perStage[5] != 5 {
		t.Fatalf("programs per stage: %v", perStage)
	}
	if n := len(specs()); n > 60 {
		t.Fatalf("%d programs: over the default compile budget of 60", n)
	}
}

func fp16(v float32) float32 { return float16.Fromfloat32(v).Float32() }

func TestComparingFlagsNaNAndDifferencesBeyondFP16Steps(t *testing.T) {
	// A device that gives NaN fails the check and still leaves a report JSON can hold.
	c := Check{Name: "nan"}
	if c.record([]float32{float32(math.NaN())}, []float32{1}) || !c.NonFinite {
		t.Fatalf("NaN recorded as %+v", c)
	}
	if err := writeReport(filepath.Join(t.TempDir(), "r.json"), &Report{Schema: ReportSchema, Stages: []StageResult{{Checks: []Check{c}}}}); err != nil {
		t.Fatalf("a report with a NaN check: %v", err)
	}
	want := []float32{1, -2, 40}
	if d, ok := compare([]float32{1.01, -2, 40.5}, want); !ok || math.Abs(d-0.5) > 1e-6 {
		t.Fatalf("within the bound: %v %t", d, ok)
	}
	if _, ok := compare([]float32{1, -2, 42}, want); ok {
		t.Fatal("a difference of 2 on values of 40 passed")
	}
	if _, ok := compare([]float32{float32(math.NaN()), -2, 40}, want); ok {
		t.Fatal("NaN passed")
	}
}

func TestOffAMacTheLadderRefusesClearly(t *testing.T) {
	if runtime.GOOS == "darwin" && runtime.GOARCH == "arm64" {
		t.Skip("this is a Mac")
	}
	passed, err := run(options{report: filepath.Join(t.TempDir(), "r.json")})
	if passed || !errors.Is(err, ane.ErrUnsupported) || !strings.Contains(err.Error(), "make ane-smoke on a Mac") {
		t.Fatalf("off a Mac: %t, %v", passed, err)
	}
}

// TestTheDaemonPlistRunsTheAgentAsTheLaunchAgentDoesWithAUserName: the two ways to install
// the agent run the same command; the LaunchDaemon names the user it runs as (so the worker
// gets that user's temporary folder and aned cache), and neither plist, nor the ladder's
// daemon job, sets TMPDIR or any other environment.
func TestTheDaemonPlistRunsTheAgentAsTheLaunchAgentDoesWithAUserName(t *testing.T) {
	read := func(path string) string {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	agent, daemon := read("../../config/agent/macos/dev.synapse-fleet.agent.plist"), read("../../config/agent/macos/dev.synapse-fleet.agent.daemon.plist")
	smoke := read("dev.synapse-fleet.ane-smoke.plist")
	args := regexp.MustCompile(`(?s)<key>ProgramArguments</key>\s*<array>(.*?)</array>`)
	a, d := args.FindStringSubmatch(agent), args.FindStringSubmatch(daemon)
	if a == nil || d == nil || a[1] != d[1] {
		t.Fatalf("the LaunchAgent and the LaunchDaemon run different commands:\n%v\n%v", a, d)
	}
	userName := regexp.MustCompile(`<key>UserName</key>\s*<string>[^<]+</string>`)
	if !userName.MatchString(daemon) || !userName.MatchString(smoke) || userName.MatchString(agent) {
		t.Fatal("the LaunchDaemon and the ladder's daemon job must name their UserName; the LaunchAgent runs as its session's user")
	}
	for name, p := range map[string]string{"agent": agent, "daemon": daemon, "smoke": smoke} {
		if strings.Contains(p, "<key>EnvironmentVariables</key>") {
			t.Errorf("the %s plist sets an environment; the compiler needs the user's own temporary folder", name)
		}
	}
}

// TestWithACheckpointStageFiveRunsItsFirstLayerOnRealText: the checkpoint's first layer at 128
// and 512 replaces the random-weight layers, valid, on the embedding of the tokenizer's
// encoding of the parity sample, with a finite reference.
func TestWithACheckpointStageFiveRunsItsFirstLayerOnRealText(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "tiny-qwen3")
	if err := tinymodel.Write(ck, tinymodel.Qwen3(), 3, 1, tinymodel.Tokenizer); err != nil {
		t.Fatal(err)
	}
	var five []programSpec
	for _, s := range specsFor(ck) {
		if s.stage == 5 {
			five = append(five, s)
		}
	}
	if len(five) != 3 || !strings.Contains(five[1].name, "tiny-qwen3 layer 0 at 128") || !strings.Contains(five[0].name, "tiled") {
		t.Fatalf("stage 5: %+v", five)
	}
	for _, s := range five[1:] {
		p, err := s.build()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		out, err := p.reference()
		if err != nil {
			t.Fatal(err)
		}
		if d, ok := compare(out, out); !ok || d != 0 {
			t.Fatalf("%s: the reference is not finite", s.name)
		}
		if first := p.inputs["x"][0]; first == 0 {
			t.Fatalf("%s: the input is not an embedding", s.name)
		}
	}
	for _, s := range specsFor(filepath.Join(t.TempDir(), "missing")) {
		if strings.Contains(s.name, "missing layer 0") {
			if _, err := s.build(); err == nil {
				t.Fatal("a missing checkpoint built")
			}
		}
	}
}

// TestTheDaemonWrapperStopsWaitingWhenTheJobExits runs daemon.sh against a launchd whose job
// runs briefly and exits with status 134 (SIGABRT) without a report: the wrapper stops
// waiting as soon as the job is no longer running (not after its hour's bound) and says how
// the job ended.
func TestTheDaemonWrapperStopsWaitingWhenTheJobExits(t *testing.T) {
	bin, state := t.TempDir(), t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("sudo", `exec "$@"`+"\n")
	write("chown", "exit 0\n")
	write("launchctl", `[ "$1" = print ] || exit 0
n=$(cat "$STATE/prints" 2>/dev/null || echo 0); n=$((n + 1)); echo "$n" > "$STATE/prints"
if [ "$n" -le 2 ]; then echo "	state = running"; else echo "	state = not running"; echo "	last exit code = 134"; fi
`)
	write("smoke", "exit 0\n")
	cmd := exec.Command("/bin/sh", "daemon.sh", filepath.Join(bin, "smoke"), filepath.Join(state, "report.json"))
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "STATE="+state,
		"ANE_SMOKE_WORK="+filepath.Join(state, "work"), "ANE_SMOKE_DAEMONS="+state)
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "the daemon job ended (last exit code: 134) without a report") {
		t.Fatalf("daemon.sh: %v\n%s", err, out)
	}
	prints, _ := os.ReadFile(filepath.Join(state, "prints"))
	if n := strings.TrimSpace(string(prints)); n != "4" {
		t.Fatalf("launchctl print was asked %s times: the wrapper should stop at the first answer that the job is not running", n)
	}
}
