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

package ane

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// fakeFramework is one process's view of a model, as the public references describe the
// framework: compile reads the sources in the model's folder and writes the compiled files
// there (net.plist, which jafreck/ironmill crates/ironmill-ane-sys/src/model.rs reads from that
// folder); load needs them there; unload deletes the folder (maderix/h3.c-ane
// h3_ane_bridge.m). aned's answer by hash is per process here unless anedRemembers: the
// pessimistic reading, under which only the kept folder brings a program back.
type fakeFramework struct {
	dir   string
	proc  *fakeProcess
	calls *[]string
}

type fakeProcess struct {
	anedRemembers bool
	compiledHere  map[string]bool
	aned          map[string]bool // across processes, when anedRemembers
	failLoad      int
	// full: the device refuses loads for resources.
	full bool
}

func (f *fakeFramework) id() string { return filepath.Base(f.dir) }

func (f *fakeFramework) compiledModelExists() (bool, error) {
	return f.proc.compiledHere[f.id()] || f.proc.anedRemembers && f.proc.aned[f.id()], nil
}

func (f *fakeFramework) compile() error {
	*f.calls = append(*f.calls, "compile")
	if _, err := os.Stat(filepath.Join(f.dir, "model.mil")); err != nil {
		return errors.New("ANECCompile() FAILED: no sources")
	}
	if err := os.WriteFile(filepath.Join(f.dir, "net.plist"), []byte("compiled"), 0o600); err != nil {
		return err
	}
	f.proc.compiledHere[f.id()], f.proc.aned[f.id()] = true, true
	return nil
}

func (f *fakeFramework) load() error {
	*f.calls = append(*f.calls, "load")
	if f.proc.full {
		return &CallError{Call: "load", Code: 0x20004, ResourcesExhausted: true}
	}
	if f.proc.failLoad > 0 {
		f.proc.failLoad--
		return errors.New("the program does not load")
	}
	if _, err := os.Stat(filepath.Join(f.dir, "net.plist")); err != nil {
		return errors.New("no compiled program in the model's folder")
	}
	return nil
}

func (f *fakeFramework) unload() error {
	*f.calls = append(*f.calls, "unload")
	return os.RemoveAll(f.dir)
}

func newFakeProcess(remembers bool, aned map[string]bool) *fakeProcess {
	return &fakeProcess{anedRemembers: remembers, compiledHere: map[string]bool{}, aned: aned}
}

func testProgram(t *testing.T) mil.Program {
	t.Helper()
	p, err := mil.Linear{In: 4, Out: 4, Seq: 64, Weights: make([]float32, 16)}.Program()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newLifecycle(src Sources, p mil.Program, proc *fakeProcess, calls *[]string) *lifecycle {
	const id = "0a1b_2c3d_4e5f"
	return &lifecycle{src: src, id: id, prog: p, fw: &fakeFramework{dir: src.Dir(id), proc: proc, calls: calls}}
}

// TestACompiledProgramLoadsInANewProcessWithoutACompile: compile, load, unload (which deletes
// the model's folder), then a new process: the cache check finds the program, it loads
// without a compile and says where it came from, whether or not aned's answer by hash
// survives the process.
func TestACompiledProgramLoadsInANewProcessWithoutACompile(t *testing.T) {
	for _, remembers := range []bool{false, true} {
		src := Sources{Root: t.TempDir()}
		p := testProgram(t)
		aned := map[string]bool{}
		var calls []string
		first := newLifecycle(src, p, newFakeProcess(remembers, aned), &calls)
		if held, err := first.cached(); err != nil || held {
			t.Fatalf("a fresh machine holds the program: %t, %v", held, err)
		}
		if err := first.compileNow(); err != nil {
			t.Fatal(err)
		}
		if err := first.loadNow(); err != nil || first.origin != FromCompile || first.keepErr != nil {
			t.Fatalf("load after compile: %v, origin %q, keep %v", err, first.origin, first.keepErr)
		}
		if err := first.unloadNow(); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(src.Dir(first.id)); !os.IsNotExist(err) {
			t.Fatalf("the model's folder outlived the unload: %v", err)
		}
		calls = nil
		second := newLifecycle(src, p, newFakeProcess(remembers, aned), &calls)
		held, err := second.cached()
		if err != nil || !held {
			t.Fatalf("aned remembers %t: the new process does not find the program: %t, %v", remembers, held, err)
		}
		if err := second.loadNow(); err != nil {
			t.Fatalf("aned remembers %t: the held program does not load: %v", remembers, err)
		}
		want := map[bool]Origin{false: FromKept, true: FromAned}[remembers]
		if second.origin != want || !slices.Equal(calls, []string{"load"}) {
			t.Fatalf("aned remembers %t: origin %q, calls %v; want %q and one load, no compile", remembers, second.origin, calls, want)
		}
		if _, err := os.Stat(filepath.Join(src.Dir(second.id), "model.mil")); !os.IsNotExist(err) {
			t.Fatal("the sources were written for a program that did not compile")
		}
	}
}

// TestAKeptFolderThatDoesNotLoadIsForgottenAndCompiledOnce: the caller compiles once after
// the held program's load fails; the stale kept folder is not restored again.
func TestAKeptFolderThatDoesNotLoadIsForgottenAndCompiledOnce(t *testing.T) {
	src := Sources{Root: t.TempDir()}
	p := testProgram(t)
	aned := map[string]bool{}
	var calls []string
	first := newLifecycle(src, p, newFakeProcess(false, aned), &calls)
	_, _ = first.cached()
	if err := first.compileNow(); err != nil {
		t.Fatal(err)
	}
	if err := first.loadNow(); err != nil {
		t.Fatal(err)
	}
	_ = first.unloadNow()
	// A device too full to load keeps the kept folder: the program is not at fault.
	full := newFakeProcess(false, aned)
	full.full = true
	blocked := newLifecycle(src, p, full, &calls)
	if held, _ := blocked.cached(); !held || blocked.loadNow() == nil || !src.Kept(blocked.id) {
		t.Fatal("a load refused for resources forgot the kept folder")
	}
	proc := newFakeProcess(false, aned)
	proc.failLoad = 1
	second := newLifecycle(src, p, proc, &calls)
	if held, _ := second.cached(); !held {
		t.Fatal("the kept folder was not found")
	}
	if err := second.loadNow(); err == nil {
		t.Fatal("the failing load succeeded")
	}
	if src.Kept(second.id) {
		t.Fatal("a kept folder that did not load is still kept")
	}
	if _, err := os.Stat(src.Dir(second.id)); !os.IsNotExist(err) {
		t.Fatalf("the restored files of a program that did not load are left for the compiler: %v", err)
	}
	if err := second.compileNow(); err != nil {
		t.Fatal(err)
	}
	if err := second.loadNow(); err != nil || second.origin != FromCompile || !src.Kept(second.id) {
		t.Fatalf("compile once, then load: %v, origin %q, kept %t", err, second.origin, src.Kept(second.id))
	}
}

func TestAKeptCopyCutShortIsNeverRestored(t *testing.T) {
	src := Sources{Root: t.TempDir()}
	const id = "aa_bb_cc"
	// A folder of nothing but sources is not kept: an empty copy would be held and fail to
	// load in every new process.
	if _, err := src.Write(id, testProgram(t)); err != nil {
		t.Fatal(err)
	}
	if err := src.Keep(id); !errors.Is(err, ErrNothingToKeep) || src.Kept(id) {
		t.Fatalf("keeping only sources: %v, kept %t", err, src.Kept(id))
	}
	if err := os.MkdirAll(src.KeptDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src.KeptDir(id), "net.plist"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if ok, err := src.Restore(id); ok || err != nil {
		t.Fatalf("a copy without its marker was restored: %t, %v", ok, err)
	}
	for _, bad := range []string{"", "..", "../x", "a/b"} {
		if src.Kept(bad) || src.Keep(bad) == nil {
			t.Errorf("identifier %q was taken as a folder name", bad)
		}
	}
}

func TestEveryFrameworkCallIsTracedBeforeItIsMade(t *testing.T) {
	var steps []string
	Trace = func(s string) { steps = append(steps, s) }
	defer func() { Trace = nil }()
	var calls []string
	l := newLifecycle(Sources{Root: t.TempDir()}, testProgram(t), newFakeProcess(false, map[string]bool{}), &calls)
	l.fw = tracedFramework{l.fw, &steps}
	_, _ = l.cached()
	_ = l.compileNow()
	_ = l.loadNow()
	_ = l.unloadNow()
	want := []string{"compiledModelExists " + l.id, "called", "compile " + l.id, "called", "load " + l.id, "called", "unload " + l.id, "called"}
	if !slices.Equal(steps, want) {
		t.Fatalf("steps %v, want %v", steps, want)
	}
}

// tracedFramework records "called" as each call is made, to order it against the trace.
type tracedFramework struct {
	framework
	steps *[]string
}

func (f tracedFramework) compiledModelExists() (bool, error) {
	*f.steps = append(*f.steps, "called")
	return f.framework.compiledModelExists()
}
func (f tracedFramework) compile() error {
	*f.steps = append(*f.steps, "called")
	return f.framework.compile()
}
func (f tracedFramework) load() error {
	*f.steps = append(*f.steps, "called")
	return f.framework.load()
}
func (f tracedFramework) unload() error {
	*f.steps = append(*f.steps, "called")
	return f.framework.unload()
}

func TestCompileAndLoadTimeoutsGrowWithTheRungWithinTheAdmissionBound(t *testing.T) {
	small, large := TimeoutsFor(128), TimeoutsFor(8192)
	if small.Compile < 2*time.Minute || small.Load < time.Minute || small.Call != 30*time.Second {
		t.Fatalf("rung 128: %+v", small)
	}
	if large.Compile <= small.Compile || large.Load <= small.Load {
		t.Fatalf("rung 8192 gets %+v, no more than rung 128's %+v", large, small)
	}
	if large.Compile > 10*time.Minute || large.Load > 5*time.Minute {
		t.Fatalf("rung 8192 gets %+v: past the 600 s admission bound", large)
	}
	if TimeoutsFor(1024).Compile != 4*time.Minute {
		t.Fatalf("rung 1024: %+v", TimeoutsFor(1024))
	}
}
