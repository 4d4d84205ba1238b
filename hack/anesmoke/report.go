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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// ReportSchema is the report's version.
const ReportSchema = 2

// Report is what a ladder run found, written as JSON to attach to a bug.
type Report struct {
	Schema      int           `json:"schema"`
	Started     time.Time     `json:"started"`
	Environment Environment   `json:"environment"`
	Stages      []StageResult `json:"stages"`
	// Passed: every stage passed.
	Passed bool `json:"passed"`
	// Compiles is how many programs this process compiled (the per-process limit is about
	// 119; the ladder stays under its budget).
	Compiles int `json:"compiles"`
	// Finished: the ladder ran to its end (passed or not). A report without it was cut short:
	// Crash says how.
	Finished bool   `json:"finished"`
	Crash    *Crash `json:"crash,omitempty"`
	// LogCommand is what to run on the Mac to read what aned and the compiler service logged
	// during the run: the reasons an NSError leaves out.
	LogCommand string `json:"logCommand,omitempty"`
}

// Crash is how a ladder process ended without finishing its report.
type Crash struct {
	// Signal is the signal that killed it (SIGABRT for an Objective-C exception, SIGSEGV or
	// SIGBUS for a bad call), empty if it exited; ExitCode its exit status otherwise.
	Signal   string `json:"signal,omitempty"`
	ExitCode int    `json:"exitCode"`
	// LastStep is the last framework call it announced: the call it died in.
	LastStep string `json:"lastStep,omitempty"`
	// Stage is the stage that was running.
	Stage string `json:"stage,omitempty"`
}

// Environment is stage 1's findings.
type Environment struct {
	OS           string `json:"os"`
	Arch         string `json:"arch"`
	MacOSVersion string `json:"macOSVersion,omitempty"`
	MacOSBuild   string `json:"macOSBuild,omitempty"`
	Chip         string `json:"chip,omitempty"`
	// VirtualMachine is the kernel's answer (kern.hv_vmm_present); Device has the framework's.
	VirtualMachine *bool          `json:"virtualMachine,omitempty"`
	Device         ane.DeviceInfo `json:"device"`
	// TempDir is NSTemporaryDirectory(), where the compiler reads sources; TMPDIR and
	// GoTempDir (os.TempDir) are what a program that asked the environment would use.
	TempDir     string `json:"nsTemporaryDirectory,omitempty"`
	TMPDIR      string `json:"TMPDIR"`
	GoTempDir   string `json:"goTempDir"`
	ModelURLSet bool   `json:"modelURLSet"`
	// SigningIdentifier is this binary's code-signing identifier, the aned cache partition its
	// programs go to; WorkerSigningIdentifier the worker binary's.
	SigningIdentifier       string `json:"signingIdentifier,omitempty"`
	WorkerPath              string `json:"workerPath,omitempty"`
	WorkerSigningIdentifier string `json:"workerSigningIdentifier,omitempty"`
	// LaunchdManager is launchctl managername (Aqua, Background, System, ...); LaunchdDomain
	// what that means for the agent's plists.
	LaunchdManager string `json:"launchdManager,omitempty"`
	LaunchdDomain  string `json:"launchdDomain,omitempty"`
	UID            int    `json:"uid"`
	// Warnings are findings that do not stop the ladder.
	Warnings []string `json:"warnings,omitempty"`
}

// Status is a stage's or a check's outcome.
type Status string

const (
	Passed  Status = "passed"
	Failed  Status = "failed"
	NotRun  Status = "not run"
	Running Status = "running"
)

// StageResult is one stage of the ladder.
type StageResult struct {
	Number   int     `json:"number"`
	Name     string  `json:"name"`
	Status   Status  `json:"status"`
	Seconds  float64 `json:"seconds"`
	Compiles int     `json:"compiles"`
	Detail   string  `json:"detail,omitempty"`
	// Error is the failure, with the framework's NSError when there was one.
	Error  *StageError `json:"error,omitempty"`
	Checks []Check     `json:"checks,omitempty"`
	// Attributes is the raw modelAttributes of stage 3's program.
	Attributes map[string]any `json:"attributes,omitempty"`
	// Capacity is what the capacity stage found.
	Capacity *Capacity `json:"capacity,omitempty"`
}

// Check is one program a stage compiled, loaded and evaluated.
type Check struct {
	Name       string `json:"name"`
	Status     Status `json:"status"`
	Identifier string `json:"identifier,omitempty"`
	Cached     bool   `json:"cachedBefore"`
	// Held is what the cache check found (aned cache, kept folder); Origin how the program
	// got loaded (one of those, or compiled); HeldLoadError why a held program did not load
	// (it was then compiled once); KeepError why its compiled folder could not be kept.
	Held          string      `json:"held,omitempty"`
	Origin        string      `json:"origin,omitempty"`
	HeldLoadError *StageError `json:"heldLoadError,omitempty"`
	KeepError     string      `json:"keepError,omitempty"`
	CompileMS     float64     `json:"compileMs,omitempty"`
	LoadMS        float64     `json:"loadMs,omitempty"`
	DeviceMS      float64     `json:"deviceMs,omitempty"`
	CPUMS         float64     `json:"cpuMs,omitempty"`
	BLASMS        float64     `json:"accelerateMs,omitempty"`
	MaxDiff       float64     `json:"maxDiff"`
	// NonFinite: the device gave NaN or infinity (MaxDiff is then 0: JSON has no infinity).
	NonFinite bool        `json:"nonFinite,omitempty"`
	Detail    string      `json:"detail,omitempty"`
	Error     *StageError `json:"error,omitempty"`
}

// StageError is a failure as a report carries it.
type StageError struct {
	// Call, Domain, Code, Description, UserInfo and Underlying are the framework's NSError,
	// for a call it refused.
	Call        string         `json:"call,omitempty"`
	Domain      string         `json:"domain,omitempty"`
	Code        int            `json:"code,omitempty"`
	Description string         `json:"description,omitempty"`
	UserInfo    map[string]any `json:"userInfo,omitempty"`
	Underlying  *StageError    `json:"underlying,omitempty"`
	Message     string         `json:"message"`
}

// describe turns an error into a StageError, keeping the NSError of a refused call.
func describe(err error) *StageError {
	if err == nil {
		return nil
	}
	e := &StageError{Message: err.Error()}
	var ce *ane.CallError
	if errors.As(err, &ce) {
		e.Call, e.Domain, e.Code, e.Description, e.UserInfo = ce.Call, ce.Domain, ce.Code, ce.Detail, ce.UserInfo
		for u, at := ce.Underlying, &e.Underlying; u != nil; u, at = u.Underlying, &(*at).Underlying {
			*at = &StageError{Domain: u.Domain, Code: u.Code, Description: u.Detail, UserInfo: u.UserInfo, Message: u.Error()}
		}
	}
	var ve *mil.ValidationError
	if errors.As(err, &ve) {
		e.Call = "validate"
	}
	var be *ane.BindingError
	if errors.As(err, &be) {
		e.Call = "bind"
	}
	return e
}

// stage is one rung of the ladder.
type stage struct {
	name string
	run  func(r *StageResult) error
}

// runLadder runs the stages in order and stops at the first that fails; the rest are
// recorded as not run. now is the clock the stages are timed by; save writes the report, and
// is called before each stage (with the stage marked running) and after it, so a process that
// dies leaves every finished stage and the running one behind. A stage calls its own save
// after each check.
func runLadder(rep *Report, stages []stage, now func() time.Time, save func()) {
	rep.Passed = true
	rep.Stages = make([]StageResult, len(stages))
	for i, s := range stages {
		rep.Stages[i] = StageResult{Number: i + 1, Name: s.name, Status: NotRun}
	}
	for i, s := range stages {
		if !rep.Passed {
			break
		}
		res := &rep.Stages[i]
		res.Status = Running
		save()
		start := now()
		err := s.run(res)
		res.Seconds = now().Sub(start).Seconds()
		res.Status = Passed
		if err != nil {
			res.Status, res.Error, rep.Passed = Failed, describe(err), false
		}
		save()
	}
}

// budget counts the compiles of this process and refuses past its limit: after about 119
// compiles in one process later ones are reported to fail silently (jafreck/ironmill
// docs/design/ane/ane-constraints.md "Compile budget ~119 per process").
type budget struct {
	used, limit int
}

func (b *budget) take(n int) error {
	if b.used+n > b.limit {
		return fmt.Errorf("%d more compiles would make %d of this run's budget of %d (the per-process limit is about 119)", n, b.used+n, b.limit)
	}
	b.used += n
	return nil
}

// printTable writes the report as a table a person reads.
func printTable(w io.Writer, rep *Report) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "stage\tresult\tseconds\tcompiles\tdetail")
	for _, s := range rep.Stages {
		detail := s.Detail
		if s.Error != nil {
			detail = s.Error.Message
			if s.Error.Domain != "" {
				detail = fmt.Sprintf("%s failed: %s %d: %s", s.Error.Call, s.Error.Domain, s.Error.Code, s.Error.Description)
			}
		}
		fmt.Fprintf(tw, "%d %s\t%s\t%.1f\t%d\t%s\n", s.Number, s.Name, s.Status, s.Seconds, s.Compiles, detail)
		for _, c := range s.Checks {
			d := c.Detail
			if c.Error != nil {
				d = c.Error.Message
			}
			if c.Origin != "" {
				d = "(" + c.Origin + ") " + d
			}
			if c.HeldLoadError != nil {
				d += fmt.Sprintf(" [held as %s but its load failed, so compiled once: %s]", c.Held, c.HeldLoadError.Message)
			}
			fmt.Fprintf(tw, "    %s\t%s\t\t\tdiff %.4f %s\n", c.Name, c.Status, c.MaxDiff, d)
		}
	}
	tw.Flush()
	for _, warn := range rep.Environment.Warnings {
		fmt.Fprintln(w, "warning:", warn)
	}
	if c := rep.Crash; c != nil {
		how := fmt.Sprintf("exited with status %d", c.ExitCode)
		if c.Signal != "" {
			how = "was killed by " + c.Signal
		}
		fmt.Fprintf(w, "the ladder process %s during stage %q; its last framework call was %q\n", how, orUnknown(c.Stage), orUnknown(c.LastStep))
	}
	if !rep.Passed && rep.LogCommand != "" {
		fmt.Fprintln(w, "what aned and the compiler service logged:", rep.LogCommand)
	}
	verdict := "passed"
	if !rep.Passed {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "ane-smoke %s in launchd domain %s (%d compiles)\n", verdict, orUnknown(rep.Environment.LaunchdDomain), rep.Compiles)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// writeReport writes the report as indented JSON, atomically.
func writeReport(path string, rep *Report) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".partial"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// readReport reads a report a ladder run wrote.
func readReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if rep.Schema != ReportSchema {
		return nil, fmt.Errorf("%s is a schema %d report; this is schema %d", path, rep.Schema, ReportSchema)
	}
	return &rep, nil
}

// signingIdentifier reads "Identifier=..." from codesign -dv's output.
func signingIdentifier(codesignOutput string) string {
	for _, line := range strings.Split(codesignOutput, "\n") {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "Identifier="); ok {
			return id
		}
	}
	return ""
}

// launchdDomain says what launchctl managername's answer means for the agent: Aqua is a
// login session (gui/<uid>, where a LaunchAgent runs), System the system domain (a
// LaunchDaemon; with UserName it runs as that user without a login), Background a user's
// background session (user/<uid>).
func launchdDomain(manager string, uid int) string {
	switch strings.TrimSpace(manager) {
	case "Aqua":
		return fmt.Sprintf("gui/%d (a login session: the LaunchAgent's domain)", uid)
	case "System":
		return "system (a LaunchDaemon: runs at boot without a login)"
	case "Background":
		return fmt.Sprintf("user/%d (a background session)", uid)
	case "LoginWindow":
		return "loginwindow (no user logged in)"
	case "":
		return ""
	}
	return strings.TrimSpace(manager)
}
