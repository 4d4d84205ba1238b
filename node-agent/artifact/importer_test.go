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
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// archive builds the sim artifact of s, packs it and returns the archive's path and SHA-256.
func archive(t *testing.T, s SimSpec) (string, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "src")
	if _, err := BuildSim(dir, s); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "a.tar.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sum, err := Pack(dir, f)
	if err != nil {
		t.Fatal(err)
	}
	return path, sum
}

func newImporter(t *testing.T) (Importer, *clocktesting.FakeClock) {
	clk := clocktesting.NewFakeClock(time.Now())
	return Importer{Root: t.TempDir(), Machine: mac, Backend: "sim", ConverterVersion: "conv-1", Clock: clk}, clk
}

func registered(t *testing.T, im Importer) string {
	dir, err := Path(im.Root, spec.Model, spec.Revision, spec.ConversionPolicy.Name)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// seedOf reads which seed the registered artifact was built from.
func seedOf(t *testing.T, dir string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "params.json"))
	if err != nil {
		return ""
	}
	i := strings.Index(string(data), `"seed":"`)
	rest := string(data)[i+8:]
	return rest[:strings.Index(rest, `"`)]
}

// leftovers lists what is under root besides registered artifact files.
func leftovers(t *testing.T, root string) []string {
	var out []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(root, p)
		if strings.Contains(rel, stagingPrefix) || strings.Contains(rel, backupInfix) || strings.HasSuffix(rel, PendingManifestFile) || strings.HasSuffix(rel, importMarker) {
			out = append(out, rel)
		}
		return nil
	})
	return out
}

// deadPID is the pid of a process that has exited.
func deadPID(t *testing.T) string {
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(cmd.Process.Pid)
}

// exited makes every import marker under root name an exited process, as after a kill.
func exited(t *testing.T, root string) {
	pid := deadPID(t)
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, importMarker) {
			_ = os.WriteFile(p, []byte(pid), 0o644)
		}
		return nil
	})
}

func TestImportPublishesAVerifiedArtifactOnce(t *testing.T) {
	im, _ := newImporter(t)
	path, sum := archive(t, spec)
	res, err := im.Import(path, sum, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.Dir != registered(t, im) || res.AlreadyRegistered || res.Replaced {
		t.Fatalf("result %+v", res)
	}
	if _, err := verifier.Verify(res.Dir, want); err != nil {
		t.Fatalf("the imported artifact does not verify: %v", err)
	}
	if l := leftovers(t, im.Root); len(l) != 0 {
		t.Fatalf("left behind: %v", l)
	}
	res, err = im.Import(path, sum, false)
	if err != nil || !res.AlreadyRegistered {
		t.Fatalf("a second import: %+v, %v", res, err)
	}
}

func TestAnArchiveIsRefusedWhenItsSHADiffersFromTheIndex(t *testing.T) {
	im, _ := newImporter(t)
	path, _ := archive(t, spec)
	_, err := im.Import(path, "sha256:"+strings.Repeat("0", 64), false)
	var ie *IntegrityError
	if !errors.As(err, &ie) || ie.Check != "archive" {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(registered(t, im)); !os.IsNotExist(err) {
		t.Fatal("something was registered")
	}
	if l := leftovers(t, im.Root); len(l) != 0 {
		t.Fatalf("left behind: %v", l)
	}
}

func TestArchivesThatReachOutsideTheTreeOrAreTooLargeAreRefused(t *testing.T) {
	entry := func(name string, typ byte, body string, link string) []byte {
		var buf bytes.Buffer
		gz := gzip.NewWriter(&buf)
		tw := tar.NewWriter(gz)
		_ = tw.WriteHeader(&tar.Header{Name: name, Typeflag: typ, Size: int64(len(body)), Mode: 0o644, Linkname: link})
		_, _ = tw.Write([]byte(body))
		tw.Close()
		gz.Close()
		return buf.Bytes()
	}
	outside := filepath.Join(t.TempDir(), "escaped")
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"a parent path", entry("../../escaped", tar.TypeReg, "x", ""), "leaves the artifact"},
		{"a parent path inside", entry("a/../../escaped", tar.TypeReg, "x", ""), "leaves the artifact"},
		{"an absolute path", entry(outside, tar.TypeReg, "x", ""), "absolute path"},
		{"a symbolic link", entry("params.json", tar.TypeSymlink, "", outside), "symbolic link"},
		{"a hard link", entry("params.json", tar.TypeLink, "", "/etc/passwd"), "hard link"},
		{"a device", entry("dev", tar.TypeChar, "", ""), "device"},
		{"too large", entry("big.bin", tar.TypeReg, strings.Repeat("x", 2048), ""), "more than 1024 bytes"},
		{"not gzip", []byte("plain text"), "not gzip"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			im, _ := newImporter(t)
			im.Limit = 1024
			path := filepath.Join(t.TempDir(), "evil.tar.gz")
			_ = os.WriteFile(path, tc.data, 0o644)
			_, err := im.Import(path, "", false)
			var ie *IntegrityError
			if !errors.As(err, &ie) || ie.Check != "archive" || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an archive refusal saying %q", err, tc.want)
			}
			if _, err := os.Stat(outside); !os.IsNotExist(err) {
				t.Fatal("the archive wrote outside the artifact")
			}
			if l := leftovers(t, im.Root); len(l) != 0 {
				t.Fatalf("left behind: %v", l)
			}
		})
	}
}

func TestAnArchiveForAnotherPlatformProfileIsNeverRegistered(t *testing.T) {
	im, _ := newImporter(t)
	im.Machine.MacOSBuild = "25C56"
	path, sum := archive(t, spec)
	_, err := im.Import(path, sum, false)
	var me *MismatchError
	if !errors.As(err, &me) || me.Check != "platform" {
		t.Fatalf("got %v", err)
	}
	if _, err := os.Stat(registered(t, im)); !os.IsNotExist(err) {
		t.Fatal("an artifact for another platform was registered")
	}
}

func TestAFailedGateKeepsThePreviousArtifact(t *testing.T) {
	im, _ := newImporter(t)
	old, oldSum := archive(t, spec)
	if _, err := im.Import(old, oldSum, false); err != nil {
		t.Fatal(err)
	}
	next := spec
	next.Seed = "next"
	path, sum := archive(t, next)
	im.Probe = func(string, *Manifest) (*ProbeReport, error) {
		return nil, &ComputeUnitMismatchError{Check: "probe", Message: "ratio 0.97"}
	}
	_, err := im.Import(path, sum, true)
	var cu *ComputeUnitMismatchError
	if !errors.As(err, &cu) {
		t.Fatalf("got %v", err)
	}
	if got := seedOf(t, registered(t, im)); got != spec.Seed {
		t.Fatalf("the registered artifact has seed %q, want the previous one's", got)
	}
	if _, err := verifier.Verify(registered(t, im), want); err != nil {
		t.Fatalf("the previous artifact does not verify: %v", err)
	}
	if l := leftovers(t, im.Root); len(l) != 0 {
		t.Fatalf("left behind: %v", l)
	}
}

// TestAKilledImportNeverLeavesAHalfArtifactAndIsCleanedUp kills a forced replace and a first
// install at each step: a load never sees a half-imported artifact, and once the import has
// exited and an hour has passed the next import (or prune) leaves things as they were, or, if
// it was killed after publishing, as it made them.
func TestAKilledImportNeverLeavesAHalfArtifactAndIsCleanedUp(t *testing.T) {
	for _, force := range []bool{true, false} {
		for _, step := range []string{"unpacked", "moved", "gated", "published"} {
			t.Run(step+map[bool]string{true: " replacing", false: " installing"}[force], func(t *testing.T) {
				im, clk := newImporter(t)
				if force {
					old, oldSum := archive(t, spec)
					if _, err := im.Import(old, oldSum, false); err != nil {
						t.Fatal(err)
					}
				}
				next := spec
				next.Seed = "next"
				path, sum := archive(t, next)
				im.testStep = func(s string) error {
					if s == step {
						return errCrash
					}
					return nil
				}
				if _, err := im.Import(path, sum, force); !errors.Is(err, errCrash) {
					t.Fatalf("got %v", err)
				}
				im.testStep = nil
				dest := registered(t, im)

				// Right after the kill a load sees the previous artifact, the new one, or
				// nothing: never an unverified one.
				v, err := verifier.Verify(dest, want)
				var mi *MissingError
				switch {
				case err == nil && (seedOf(t, dest) == spec.Seed && force || seedOf(t, dest) == "next" && step == "published"):
				case errors.As(err, &mi):
				default:
					t.Fatalf("after the kill a load got %+v, %v", v, err)
				}

				// While the import might still run, nothing is removed.
				if _, err := im.Prune(); err != nil {
					t.Fatal(err)
				}
				exited(t, im.Root)
				clk.Step(StaleAfter + time.Minute)
				if _, err := im.Prune(); err != nil {
					t.Fatal(err)
				}
				wantSeed := ""
				switch {
				case step == "published":
					wantSeed = "next"
				case force:
					wantSeed = spec.Seed
				}
				if got := seedOf(t, dest); got != wantSeed {
					t.Fatalf("after the prune the registered artifact has seed %q, want %q", got, wantSeed)
				}
				if wantSeed != "" {
					if _, err := verifier.Verify(dest, want); err != nil {
						t.Fatalf("after the prune: %v", err)
					}
				}
				if l := leftovers(t, im.Root); len(l) != 0 {
					t.Fatalf("left behind: %v", l)
				}
			})
		}
	}
}

func TestPruneLeavesARunningImportAlone(t *testing.T) {
	im, clk := newImporter(t)
	path, sum := archive(t, spec)
	im.testStep = func(s string) error {
		if s == "moved" {
			return errCrash
		}
		return nil
	}
	_, _ = im.Import(path, sum, false)
	clk.Step(2 * StaleAfter)
	removed, err := im.Prune()
	if err != nil || len(removed) != 0 || !slices.Contains(leftovers(t, im.Root), filepath.Join(spec.Model, spec.Revision, spec.ConversionPolicy.Name, PendingManifestFile)) {
		t.Fatalf("a running import's directory was pruned: %v, %v", removed, err)
	}
}

// The import's placement probe runs once, at the registered path, with the manifest still
// withheld, and its measurement is in the result; without a probe (or one that could not run
// here) the result says the import did not probe and why, so a caller never takes it for a
// probed artifact.
func TestTheImportProbesAtTheRegisteredPathOrSaysItDidNot(t *testing.T) {
	im, _ := newImporter(t)
	path, sum := archive(t, spec)
	var calls []string
	im.Probe = func(dir string, m *Manifest) (*ProbeReport, error) {
		calls = append(calls, dir)
		if _, err := os.Stat(filepath.Join(dir, ManifestFile)); !os.IsNotExist(err) {
			t.Error("the probe ran with the manifest published")
		}
		if _, err := os.Stat(filepath.Join(dir, PendingManifestFile)); err != nil {
			t.Errorf("the probe ran away from the registered artifact: %v", err)
		}
		return &ProbeReport{Rung: m.Rungs[0], Device: 2 * time.Millisecond, CPU: 5 * time.Millisecond}, nil
	}
	res, err := im.Import(path, sum, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(calls, []string{registered(t, im)}) || res.Probe == nil || res.Probe.Ratio() != 0.4 || res.NotProbed != "" {
		t.Fatalf("probes at %v; result %+v", calls, res)
	}

	for name, c := range map[string]struct {
		probe func(string, *Manifest) (*ProbeReport, error)
		why   string
	}{
		"no probe here": {nil, "not on macOS on Apple silicon"},
		"a probe that cannot run here": {func(string, *Manifest) (*ProbeReport, error) {
			return &ProbeReport{NotRun: "the lane lock is held"}, nil
		},
			"the lane lock is held"},
	} {
		t.Run(name, func(t *testing.T) {
			im, _ := newImporter(t)
			im.Probe, im.NoProbe = c.probe, "not on macOS on Apple silicon"
			res, err := im.Import(path, sum, false)
			if err != nil {
				t.Fatal(err)
			}
			if res.Probe != nil || res.NotProbed != c.why {
				t.Fatalf("result %+v; want no probe, because %q", res, c.why)
			}
		})
	}
}
