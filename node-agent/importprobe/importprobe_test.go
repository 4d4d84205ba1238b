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

package importprobe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/convert"
	"github.com/ck-synapse/synapse-fleet/node-agent/lanelock"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// fakeHost starts fakeWorkers and records what it was asked; ratio is what their probes measure.
type fakeHost struct {
	mu        sync.Mutex
	lockPath  string
	ratio     float64
	specs     []supervisor.ModelSpec
	inherited bool
	lockHeld  bool // the lane lock was held while the worker started
	worker    *fakeWorker
}

func (h *fakeHost) InheritLock(f *os.File) { h.inherited = f != nil }

func (h *fakeHost) Spawn(_ context.Context, spec supervisor.ModelSpec, _ int64) (supervisor.Worker, []int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.specs = append(h.specs, spec)
	if l, err := lanelock.Acquire(h.lockPath); errors.Is(err, lanelock.ErrHeld) {
		h.lockHeld = true
	} else if err == nil {
		l.Release()
	}
	h.worker = &fakeWorker{ratio: h.ratio, exited: make(chan struct{})}
	return h.worker, nil, nil
}

type fakeWorker struct {
	ratio  float64
	calls  []string
	exited chan struct{}
	once   sync.Once
}

func (w *fakeWorker) Admit(_ context.Context, rung int) (supervisor.Admission, error) {
	w.calls = append(w.calls, "admit")
	return supervisor.Admission{}, nil
}
func (w *fakeWorker) Evict(context.Context, int) error {
	w.calls = append(w.calls, "evict")
	return nil
}
func (w *fakeWorker) Exchange(context.Context, int, []byte) ([]byte, error) {
	return nil, errors.New("no exchange in a probe")
}
func (w *fakeWorker) Inventory(context.Context) ([]int, error) { return nil, nil }
func (w *fakeWorker) Probe(_ context.Context, rung int) (time.Duration, time.Duration, error) {
	w.calls = append(w.calls, "probe")
	return time.Duration(w.ratio * float64(10*time.Millisecond)), 10 * time.Millisecond, nil
}
func (w *fakeWorker) Close() error            { w.once.Do(func() { close(w.exited) }); return nil }
func (w *fakeWorker) Kill() error             { return w.Close() }
func (w *fakeWorker) Exited() <-chan struct{} { return w.exited }

// aneArchive converts the tiny ModernBERT model at rungs 64 and 128 and packs it.
func aneArchive(t *testing.T) string {
	t.Helper()
	ck := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(ck, tinymodel.ModernBERT(), 2, 1, tinymodel.Tokenizer); err != nil {
		t.Fatal(err)
	}
	c, err := convert.OpenCheckpoint(ck, convert.DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := filepath.Join(t.TempDir(), "tiny")
	if _, err := convert.Convert(dir, c, convert.Options{Model: "tiny", Revision: "r1", Rungs: []int{64, 128},
		Platform: artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}, Policy: convert.DefaultPolicy}); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.tar.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := artifact.Pack(dir, f); err != nil {
		t.Fatal(err)
	}
	return path
}

func importer(t *testing.T, probe func(string, *artifact.Manifest) (*artifact.ProbeReport, error), why string) artifact.Importer {
	return artifact.Importer{Root: t.TempDir(), Machine: artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}, Backend: "ane",
		ConverterVersion: convert.ConverterVersion, Probe: probe, NoProbe: why}
}

// On a Mac with the ane backend the import starts a worker on the registered artifact under
// the lane lock, admits and probes its smallest rung, and reports the measurement; a rung that
// measures as running on the CPU fails the import, which then keeps nothing.
func TestOnAMacWithTheAneBackendTheImportProbesTheRegisteredArtifact(t *testing.T) {
	archive := aneArchive(t)
	for _, c := range []struct {
		ratio float64
		ok    bool
	}{{0.4, true}, {0.97, false}} {
		host := &fakeHost{lockPath: filepath.Join(t.TempDir(), "ane.lock"), ratio: c.ratio}
		probe, why := For(Config{Backend: "ane", Platform: "darwin/arm64", Host: host, LockPath: host.lockPath})
		if probe == nil {
			t.Fatalf("no probe on a Mac with the ane backend: %s", why)
		}
		im := importer(t, probe, why)
		res, err := im.Import(archive, "", false)
		dest, _ := artifact.Path(im.Root, "tiny", "r1", convert.DefaultPolicy.Name)
		if len(host.specs) != 1 || host.specs[0].ArtifactDir != dest || !slices.Equal(host.specs[0].Rungs, []int{64}) || !host.inherited || !host.lockHeld {
			t.Fatalf("the probe's worker: %+v (lock inherited %v, held %v)", host.specs, host.inherited, host.lockHeld)
		}
		if !slices.Equal(host.worker.calls[:2], []string{"admit", "probe"}) {
			t.Fatalf("the worker was asked %v", host.worker.calls)
		}
		select {
		case <-host.worker.Exited():
		default:
			t.Fatal("the probe's worker outlived the import")
		}
		if l, err := lanelock.Acquire(host.lockPath); err != nil {
			t.Fatalf("the lane lock was kept: %v", err)
		} else {
			l.Release()
		}
		if c.ok {
			if err != nil || res.Probe == nil || res.Probe.Rung != 64 || res.Probe.Ratio() != c.ratio || res.NotProbed != "" {
				t.Fatalf("ratio %v: %+v, %v", c.ratio, res, err)
			}
			continue
		}
		var cu *artifact.ComputeUnitMismatchError
		if !errors.As(err, &cu) || cu.Check != "probe" {
			t.Fatalf("ratio %v: %v, want ComputeUnitMismatchError", c.ratio, err)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Fatal("an artifact whose probe failed was kept")
		}
	}
}

// A live lane's lock is never bypassed: with an agent holding it the import does not probe
// (its probe of every load is the gate) and says so. Off a Mac, or on the sim backend, there is
// no probe and the import's result says why.
func TestElsewhereTheImportSaysItDidNotProbe(t *testing.T) {
	archive := aneArchive(t)
	host := &fakeHost{lockPath: filepath.Join(t.TempDir(), "ane.lock"), ratio: 0.4}
	held, err := lanelock.Acquire(host.lockPath)
	if err != nil {
		t.Fatal(err)
	}
	probe, why := For(Config{Backend: "ane", Platform: "darwin/arm64", Host: host, LockPath: host.lockPath})
	res, err := importer(t, probe, why).Import(archive, "", false)
	held.Release()
	if err != nil || res.Probe != nil || !strings.Contains(res.NotProbed, "lane lock is held") || len(host.specs) != 0 {
		t.Fatalf("with the lane lock held: %+v, %v (workers %v)", res, err, host.specs)
	}

	for name, c := range map[string]Config{
		"linux":           {Backend: "ane", Platform: "linux/amd64", Host: host, LockPath: host.lockPath},
		"the sim backend": {Backend: "sim", Platform: "darwin/arm64", Host: host, LockPath: host.lockPath},
		"this machine":    {Backend: "ane", Host: host, LockPath: host.lockPath},
	} {
		if name == "this machine" && runtime.GOOS == "darwin" && runtime.GOARCH == "arm64" {
			continue
		}
		probe, why := For(c)
		if probe != nil || why == "" {
			t.Fatalf("%s: a probe (%v) or no reason (%q)", name, probe != nil, why)
		}
		if c.Backend == "ane" {
			res, err := importer(t, probe, why).Import(archive, "", false)
			if err != nil || res.Probe != nil || res.NotProbed != why {
				t.Fatalf("%s: %+v, %v", name, res, err)
			}
		}
	}
}
