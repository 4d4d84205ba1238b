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

package simane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

const signer = "synapse-ane-worker"

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func layer(i, rung int) Layer {
	return Layer{Model: "gte-modernbert-base", Index: i, Rung: rung, WeightsDigest: "sha256:w"}
}

// load runs m.Load in the background and returns its result channel.
func load(m *Machine, signingID string, l Layer) <-chan error {
	out := make(chan error, 1)
	go func() {
		_, err := m.Load(context.Background(), signingID, l)
		out <- err
	}()
	return out
}

// finish steps the fake clock until done answers, and returns how much fake time passed.
func finish(t *testing.T, clk *clocktesting.FakeClock, done <-chan error) (time.Duration, error) {
	t.Helper()
	start := clk.Now()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-done:
			return clk.Now().Sub(start), err
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the load never finished")
		}
		if clk.HasWaiters() {
			clk.Step(time.Millisecond)
		}
	}
}

func TestACachedProgramIsLoadedWithoutWritingOrCompiling(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	m := New(Config{Clock: clk})
	took, err := finish(t, clk, load(m, signer, layer(0, 512)))
	if err != nil {
		t.Fatal(err)
	}
	compiles, written, _ := m.Stats()
	if compiles != 1 || written == 0 || took < LayerCompileTime(512) {
		t.Fatalf("first load: %d compiles, %d bytes written, %v; want one compile", compiles, written, took)
	}
	m.Unload()

	took, err = finish(t, clk, load(m, signer, layer(0, 512)))
	if err != nil {
		t.Fatal(err)
	}
	c2, w2, _ := m.Stats()
	if c2 != compiles || w2 != written {
		t.Fatalf("the cached load compiled (%d) or wrote (%d bytes)", c2-compiles, w2-written)
	}
	if took > LayerLoadTime(512)+time.Millisecond {
		t.Fatalf("the cached load took %v, want about %v", took, LayerLoadTime(512))
	}
}

func TestALayerAnedHoldsIsNotRefusedOnAFullDisk(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	m := New(Config{Clock: clk})
	if _, err := finish(t, clk, load(m, signer, layer(0, 128))); err != nil {
		t.Fatal(err)
	}
	m.SetTempSpace(1) // the disk is full
	if _, err := finish(t, clk, load(m, signer, layer(0, 128))); err != nil {
		t.Fatalf("a cached layer was refused on a full disk: %v", err)
	}
	if _, err := finish(t, clk, load(m, signer, layer(1, 128))); !errors.Is(err, ErrTempSpaceLow) {
		t.Fatalf("a layer that must compile answered %v, want temp space low", err)
	}
}

func TestTheSameLayerAtTheSameRungAlwaysHasTheSameIdentifier(t *testing.T) {
	if layer(3, 256).ContentID() != layer(3, 256).ContentID() {
		t.Fatal("identifiers differ for the same layer")
	}
	for _, other := range []Layer{layer(3, 512), layer(4, 256), {Model: "gte-modernbert-base", Index: 3, Rung: 256, WeightsDigest: "sha256:x"}} {
		if other.ContentID() == layer(3, 256).ContentID() {
			t.Fatalf("%+v shares an identifier with layer 3 at 256", other)
		}
	}
}

func TestAnotherSigningIdentifierHasItsOwnEmptyCache(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	m := New(Config{Clock: clk})
	finish(t, clk, load(m, signer, layer(0, 128)))
	if m.Cached("a.out", layer(0, 128)) || !m.Cached(signer, layer(0, 128)) {
		t.Fatal("the cache is not partitioned by signing identifier")
	}
	finish(t, clk, load(m, "a.out", layer(0, 128)))
	if compiles, _, _ := m.Stats(); compiles != 2 {
		t.Fatalf("%d compiles, want the other signer to compile once more", compiles)
	}
}

func TestTheCompilerServesOneLayerAtATimeForTheWholeMachine(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	m := New(Config{Clock: clk})
	a := load(m, signer, layer(0, 1024))
	b := load(m, "other-worker", layer(0, 128))
	// Two compiles of one wide and one narrow layer take the sum of their times, not the max.
	took1, err1 := finish(t, clk, a)
	took2, err2 := finish(t, clk, b)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	total := took1 + took2
	if want := LayerCompileTime(1024) + LayerCompileTime(128); total < want {
		t.Fatalf("both compiles finished after %v, less than their serial sum %v: they overlapped", total, want)
	}
}

func TestAProgramLimitYieldsResourcesExhaustedWithoutCompiling(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	m := New(Config{Clock: clk, ProgramLimit: 1})
	finish(t, clk, load(m, signer, layer(0, 128)))
	m.Unload()
	finish(t, clk, load(m, signer, layer(1, 128))) // fills the one slot
	before, _, _ := m.Stats()
	if _, err := finish(t, clk, load(m, signer, layer(0, 128))); !errors.Is(err, ErrResourcesExhausted) {
		t.Fatalf("got %v, want resources exhausted", err)
	}
	if after, _, _ := m.Stats(); after != before {
		t.Fatal("a cached load refused for resources compiled")
	}
}

func TestOnlyAnUnusableCachedCopyFallsBackToACompile(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	m := New(Config{Clock: clk})
	finish(t, clk, load(m, signer, layer(0, 128)))
	m.Unload()
	m.Inject(Faults{CorruptNextCachedLoad: true})
	if _, err := finish(t, clk, load(m, signer, layer(0, 128))); err != nil {
		t.Fatal(err)
	}
	if compiles, _, _ := m.Stats(); compiles != 2 {
		t.Fatalf("%d compiles, want the unusable copy compiled again", compiles)
	}
}

func TestInjectedCompileFaults(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	m := New(Config{Clock: clk})
	m.Inject(Faults{FailNextCompile: true})
	if _, err := finish(t, clk, load(m, signer, layer(0, 128))); !errors.Is(err, ErrCompileFailed) {
		t.Fatalf("got %v, want a compile failure", err)
	}
	m.Inject(Faults{HangNextCompile: true})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := m.Load(ctx, signer, layer(0, 128)); done <- err }()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a hung compile answered %v after its context ended", err)
	}
}

func TestTheOnDiskCacheSurvivesTheProcessAndIsSharedByTheMachine(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	dir := t.TempDir()
	first := New(Config{Clock: clk, Dir: dir})
	if _, err := finish(t, clk, load(first, signer, layer(0, 128))); err != nil {
		t.Fatal(err)
	}
	// A new process (a restarted worker) on the same machine finds the program cached.
	second := New(Config{Clock: clk, Dir: dir})
	if !second.Cached(signer, layer(0, 128)) || second.Cached("a.out", layer(0, 128)) {
		t.Fatal("the on-disk cache is not shared, or not partitioned by signing identifier")
	}
	if _, err := finish(t, clk, load(second, signer, layer(0, 128))); err != nil {
		t.Fatal(err)
	}
	if compiles, _, _ := second.Stats(); compiles != 0 {
		t.Fatalf("the restarted worker compiled %d layers its predecessor had compiled", compiles)
	}
}

func TestTheProgramLimitIsTheMachinesNotEachProcesses(t *testing.T) {
	dir := t.TempDir()
	clk := clocktesting.NewFakeClock(time.Now())
	// Two stand-ins sharing the machine's state, as two worker processes do: 3 programs in all.
	a := New(Config{Clock: clk, Scale: 1e-9, ProgramLimit: 3, Dir: dir})
	b := New(Config{Clock: clk, Scale: 1e-9, ProgramLimit: 3, Dir: dir})
	ctx := context.Background()
	layer := func(i int) Layer { return Layer{Model: "m", Index: i, Rung: 128, WeightsDigest: "w"} }
	for i := range 2 {
		if _, err := a.Load(ctx, "id", layer(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Load(ctx, "id", layer(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Load(ctx, "id", layer(3)); !errors.Is(err, ErrResourcesExhausted) {
		t.Fatalf("a fourth program on a machine of three: %v, want resources exhausted", err)
	}
	a.Unload()
	if _, err := b.Load(ctx, "id", layer(3)); err != nil {
		t.Fatalf("after another process released one: %v", err)
	}
}

func TestAMalformedResidencyRecordIsRefusedNotCountedAsEmpty(t *testing.T) {
	dir := t.TempDir()
	clk := clocktesting.NewFakeClock(time.Now())
	m := New(Config{Clock: clk, Scale: 1e-9, ProgramLimit: 3, Dir: dir})
	// A live process's record (this test's own pid, another stand-in's id) that does not parse.
	if err := os.MkdirAll(filepath.Join(dir, "resident"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resident", fmt.Sprintf("%d-999999", os.Getpid())), []byte("many"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := m.Load(context.Background(), "id", Layer{Model: "m", Index: 0, Rung: 128, WeightsDigest: "w"})
	if err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("a load beside an unreadable record: %v, want it refused as malformed", err)
	}
}

func TestAnUnloadWhoseRecordCannotBeWrittenStillFreesTheLocalSlot(t *testing.T) {
	dir := t.TempDir()
	clk := clocktesting.NewFakeClock(time.Now())
	m := New(Config{Clock: clk, Scale: 1e-9, ProgramLimit: 1, Dir: dir})
	ctx := context.Background()
	if _, err := m.Load(ctx, "id", Layer{Model: "m", Index: 0, Rung: 128, WeightsDigest: "w"}); err != nil {
		t.Fatal(err)
	}
	// The shared records become unreachable: the directory is replaced by a file.
	if err := os.RemoveAll(filepath.Join(dir, "resident")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resident"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	m.Unload()
	if m.resident != 0 {
		t.Fatalf("after an unload whose record failed, the process still counts %d programs", m.resident)
	}
}
