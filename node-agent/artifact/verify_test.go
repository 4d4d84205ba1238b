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

package artifact

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

var (
	sum    = "sha256:" + strings.Repeat("ab", 32)
	policy = ConversionPolicy{Name: "ane-fp16-v1", Digest: "sha256:" + strings.Repeat("cd", 32)}
	mac    = Platform{ChipFamily: "M4", MacOSBuild: "25B78"}
	spec   = SimSpec{Model: "gte", Revision: "r1", CheckpointDigest: sum, ConversionPolicy: policy, ConverterVersion: "conv-1",
		Platform: mac, Rungs: []int{128, 256, 512}, Layers: 4, Dimensions: 16, Seed: "gte/r1"}
	want = Want{Model: "gte", Revision: "r1", CheckpointDigest: sum, ConversionPolicy: policy, Backend: "sim",
		Platform: mac, ConverterVersion: "conv-1", Rungs: []int{128, 256}}
	verifier = Verifier{Clock: clocktesting.NewFakePassiveClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))}
)

// build builds the sim artifact in a fresh directory and returns it.
func build(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "gte")
	if _, err := BuildSim(dir, spec); err != nil {
		t.Fatal(err)
	}
	return dir
}

// rewriteManifest changes the manifest through f, keeping it well-formed JSON.
func rewriteManifest(t *testing.T, dir string, f func(*Manifest)) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	m, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	f(m)
	data, _ = m.Marshal()
	if err := os.WriteFile(filepath.Join(dir, ManifestFile), data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func quarantined(t *testing.T, dir string) bool {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(filepath.Dir(dir), QuarantineDir))
	_, err := os.Stat(dir)
	return len(entries) == 1 && os.IsNotExist(err)
}

func TestAVerifiedArtifactLoadsAndItsStampSkipsTheChecksNextTime(t *testing.T) {
	dir := build(t)
	v, err := verifier.Verify(dir, want)
	if err != nil {
		t.Fatal(err)
	}
	if v.FromStamp || v.Manifest.Parity.Status != "passed" || v.Manifest.Dimensions != 16 {
		t.Fatalf("first verification %+v", v)
	}
	v, err = verifier.Verify(dir, want)
	if err != nil || !v.FromStamp {
		t.Fatalf("second verification: %+v, %v; want it from the stamp", v, err)
	}
}

func TestChangedArtifactFilesInvalidateTheVerificationStamp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string, w *Want)
	}{
		{"a file's modification time", func(t *testing.T, dir string, _ *Want) {
			later := time.Now().Add(time.Hour)
			if err := os.Chtimes(filepath.Join(dir, "params.json"), later, later); err != nil {
				t.Fatal(err)
			}
		}},
		{"a file's inode (replaced by an identical copy)", func(t *testing.T, dir string, _ *Want) {
			// The copy is made while the original exists, so it gets another inode.
			p := filepath.Join(dir, "goldens.json")
			data, _ := os.ReadFile(p)
			info, _ := os.Stat(p)
			if err := os.WriteFile(p+".new", data, 0o644); err != nil {
				t.Fatal(err)
			}
			_ = os.Chtimes(p+".new", info.ModTime(), info.ModTime())
			if err := os.Rename(p+".new", p); err != nil {
				t.Fatal(err)
			}
		}},
		{"the manifest", func(t *testing.T, dir string, _ *Want) {
			later := time.Now().Add(time.Hour)
			_ = os.Chtimes(filepath.Join(dir, ManifestFile), later, later)
		}},
		{"the macOS build", func(_ *testing.T, dir string, w *Want) {
			w.Platform.MacOSBuild = "25C56"
			rewriteManifest(t, dir, func(m *Manifest) { m.Platform.MacOSBuild = "25C56" })
		}},
		{"the converter version", func(_ *testing.T, _ string, w *Want) { w.ConverterVersion = "conv-2" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := build(t)
			w := want
			if _, err := verifier.Verify(dir, w); err != nil {
				t.Fatal(err)
			}
			tc.change(t, dir, &w)
			v, err := verifier.Verify(dir, w)
			if err != nil {
				t.Fatal(err)
			}
			if v.FromStamp {
				t.Fatal("the stamp was trusted after the change: the hashes were not re-checked")
			}
		})
	}
}

func TestCorruptFilesAreRefusedAndQuarantined(t *testing.T) {
	for _, tc := range []struct {
		name, check string
		corrupt     func(t *testing.T, dir string)
	}{
		{"a changed byte", "files", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "params.json")
			data, _ := os.ReadFile(p)
			data[len(data)-2] ^= 1
			later := time.Now().Add(time.Hour) // a write changes the time; the stamp is not trusted
			_ = os.WriteFile(p, data, 0o644)
			_ = os.Chtimes(p, later, later)
		}},
		{"a missing file", "files", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "goldens.json")) }},
		{"an unlisted file", "files", func(t *testing.T, dir string) {
			_ = os.WriteFile(filepath.Join(dir, "extra.bin"), []byte("x"), 0o644)
		}},
		{"a link in place of a file", "files", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "params.json")
			data, _ := os.ReadFile(p)
			outside := filepath.Join(t.TempDir(), "params.json")
			_ = os.WriteFile(outside, data, 0o644)
			os.Remove(p)
			if err := os.Symlink(outside, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"an unreadable manifest", "manifest", func(t *testing.T, dir string) {
			_ = os.WriteFile(filepath.Join(dir, ManifestFile), []byte("{not json"), 0o644)
		}},
		{"no manifest", "manifest", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, ManifestFile)) }},
		{"an unknown manifest field", "manifest", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ManifestFile)
			data, _ := os.ReadFile(p)
			_ = os.WriteFile(p, []byte(strings.Replace(string(data), "{", `{"computeUnitsOverride": "ALL",`, 1)), 0o644)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := build(t)
			if _, err := verifier.Verify(dir, want); err != nil {
				t.Fatal(err)
			}
			tc.corrupt(t, dir)
			_, err := verifier.Verify(dir, want)
			var ie *IntegrityError
			if !errors.As(err, &ie) || ie.Check != tc.check || !strings.HasPrefix(err.Error(), "ArtifactIntegrityError") {
				t.Fatalf("got %v, want an ArtifactIntegrityError of check %s", err, tc.check)
			}
			if !quarantined(t, dir) || !strings.Contains(err.Error(), "quarantined to") {
				t.Fatalf("the corrupt artifact stayed in place: %v", err)
			}
		})
	}
}

func TestClaimsWithNoCodePathAreRefusedByName(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Manifest)
		is     func(error) bool
	}{
		{"compute units ALL", func(m *Manifest) { m.ComputeUnits = "ALL" }, func(err error) bool {
			var e *ComputeUnitMismatchError
			return errors.As(err, &e) && e.Check == "computeUnits"
		}},
		{"compute units CPU_ONLY", func(m *Manifest) { m.ComputeUnits = "CPU_ONLY" }, func(err error) bool {
			var e *ComputeUnitMismatchError
			return errors.As(err, &e)
		}},
		{"a sim artifact claiming the Neural Engine's placement", func(m *Manifest) { m.Placement = PlacementWholeProgram }, func(err error) bool {
			var e *ComputeUnitMismatchError
			return errors.As(err, &e) && e.Check == "placement"
		}},
		{"a placement no backend has", func(m *Manifest) { m.Placement = "100% ANE, 0 transitions" }, func(err error) bool {
			var e *ComputeUnitMismatchError
			return errors.As(err, &e) && e.Check == "placement"
		}},
		{"fp32", func(m *Manifest) { m.Precision = "fp32" }, func(err error) bool {
			var e *PrecisionError
			return errors.As(err, &e) && e.Precision == "fp32"
		}},
		{"a failed parity gate", func(m *Manifest) { m.Parity.Status = "failed" }, func(err error) bool {
			var e *ParityError
			return errors.As(err, &e)
		}},
		{"another model", func(m *Manifest) { m.Model = "qwen3" }, func(err error) bool {
			var e *MismatchError
			return errors.As(err, &e) && e.Check == "model"
		}},
		{"another chip family", func(m *Manifest) { m.Platform.ChipFamily = "M1" }, func(err error) bool {
			var e *MismatchError
			return errors.As(err, &e) && e.Check == "platform"
		}},
		{"no 256 rung", func(m *Manifest) { m.Rungs = []int{128, 512} }, func(err error) bool {
			var e *MissingError
			return errors.As(err, &e) && strings.Contains(e.Message, "rung 256") && strings.Contains(e.Message, "never used instead")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := build(t)
			rewriteManifest(t, dir, tc.change)
			_, err := verifier.Verify(dir, want)
			if !tc.is(err) {
				t.Fatalf("got %v", err)
			}
			if quarantined(t, dir) {
				t.Fatal("a sound artifact that is not the one wanted was quarantined")
			}
		})
	}
}

func TestAnUnpublishedImportIsMissingNotCorrupt(t *testing.T) {
	dir := build(t)
	if err := os.Rename(filepath.Join(dir, ManifestFile), filepath.Join(dir, PendingManifestFile)); err != nil {
		t.Fatal(err)
	}
	_, err := verifier.Verify(dir, want)
	var e *MissingError
	if !errors.As(err, &e) || quarantined(t, dir) {
		t.Fatalf("got %v (quarantined %v), want ArtifactMissingError and the import left alone", err, quarantined(t, dir))
	}
	_, err = verifier.Verify(filepath.Join(t.TempDir(), "nothing"), want)
	if !errors.As(err, &e) {
		t.Fatalf("no directory: %v", err)
	}
}

func TestABuildIsAllOrNothing(t *testing.T) {
	root := t.TempDir()
	bad := spec
	bad.Model = "" // the manifest does not verify: nothing may be left behind
	if _, err := BuildSim(filepath.Join(root, "bad"), bad); err == nil {
		t.Fatal("a build with no model succeeded")
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Fatalf("a failed build left %v", entries)
	}
	dir := build(t)
	if _, err := BuildSim(dir, spec); err == nil {
		t.Fatal("a build over an existing artifact succeeded")
	}
}
