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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/utils/clock"
)

const (
	// importMarker, in an unpublished artifact, holds the pid of the import that owns it.
	importMarker  = ".import"
	stagingPrefix = ".staging-"
	backupInfix   = ".previous-"
	// StaleAfter is how old an unpublished directory of an exited import must be to be removed.
	StaleAfter = time.Hour
)

// Importer registers artifacts under Root for this machine: all or nothing.
type Importer struct {
	Root string
	// Machine, Backend and ConverterVersion are this machine's: an archive for another
	// platform profile or backend is never registered.
	Machine          Platform
	Backend          string
	ConverterVersion string
	Clock            clock.PassiveClock
	// Probe, if set, runs one runtime placement probe at the registered path before the
	// manifest is published; its error fails the import, and a report whose NotRun is set says
	// why it could not run here. When Probe is nil, NoProbe says why this machine has none.
	// Either way the import's result says what became of the probe.
	Probe   func(dir string, m *Manifest) (*ProbeReport, error)
	NoProbe string
	// Limit bounds the unpacked size (MaxArchiveBytes if zero).
	Limit int64

	// testStep, if set, is called after each step; errCrash from it stops the import where it
	// is, as a kill would, with nothing cleaned up.
	testStep func(step string) error
}

// ImportResult says what an import did.
type ImportResult struct {
	Dir      string
	Manifest *Manifest
	// AlreadyRegistered: a verified artifact was there already and nothing changed.
	AlreadyRegistered bool
	// Replaced: --force replaced a previous artifact.
	Replaced bool
	// Probe is the placement probe the import ran at the registered path; nil when it ran
	// none, and NotProbed then says why (the agent's probe of every load stays the gate).
	Probe     *ProbeReport
	NotProbed string
}

// ProbeRatioLimit: a rung whose device time is over this fraction of the CPU reference's is not
// running on the Neural Engine (the agent's load probe and the import's use it alike).
const ProbeRatioLimit = 0.8

// ProbeReport is one runtime placement probe: the fastest of 5 evaluations of a rung on the
// device and on the CPU reference, back to back.
type ProbeReport struct {
	Rung        int
	Device, CPU time.Duration
	// NotRun, if set, says why the probe could not run here (nothing was measured).
	NotRun string
}

// Ratio is the device time over the CPU reference's.
func (p *ProbeReport) Ratio() float64 { return float64(p.Device) / float64(p.CPU) }

var errCrash = errors.New("the import was killed")

func (im Importer) now() time.Time {
	if im.Clock != nil {
		return im.Clock.Now()
	}
	return time.Now()
}

func (im Importer) step(name string) error {
	if im.testStep != nil {
		return im.testStep(name)
	}
	return nil
}

// Import registers the .tar.gz archive at path. If wantSHA is set (from a repository index)
// the archive's SHA-256 must match it. The archive is unpacked into a staging directory and
// verified there; it is moved to its registered path with its manifest withheld
// (manifest.pending.json); the parity gate and the probe run there; only then
// is manifest.json published with one rename. Any failure removes what the import added, and
// with force puts the previous artifact back.
func (im Importer) Import(path, wantSHA string, force bool) (res *ImportResult, err error) {
	if _, err := im.Prune(); err != nil {
		return nil, err
	}
	if wantSHA != "" {
		got, err := FileSHA256(path)
		if err != nil {
			return nil, err
		}
		if got != wantSHA {
			return nil, &IntegrityError{Dir: path, Check: "archive", Message: fmt.Sprintf("the archive's SHA-256 is %s, the index says %s", got, wantSHA)}
		}
	}
	if err := os.MkdirAll(im.Root, 0o755); err != nil {
		return nil, err
	}
	staging, err := os.MkdirTemp(im.Root, stagingPrefix)
	if err != nil {
		return nil, err
	}
	cleanup := []func(){func() { os.RemoveAll(staging) }}
	defer func() {
		if err != nil && !errors.Is(err, errCrash) {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	if err := os.WriteFile(filepath.Join(staging, importMarker), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	limit := im.Limit
	if limit == 0 {
		limit = MaxArchiveBytes
	}
	err = unpack(f, staging, limit)
	f.Close()
	if err != nil {
		return nil, &IntegrityError{Dir: path, Check: "archive", Message: err.Error()}
	}
	if err := im.step("unpacked"); err != nil {
		return nil, err
	}

	data, err := os.ReadFile(filepath.Join(staging, ManifestFile))
	if err != nil {
		return nil, &IntegrityError{Dir: path, Check: "manifest", Message: "the archive has no readable manifest.json"}
	}
	m, err := Parse(data)
	if err != nil {
		setDir(err, path)
		return nil, err
	}
	want := Want{Model: m.Model, Revision: m.Revision, CheckpointDigest: m.CheckpointDigest, ConversionPolicy: m.ConversionPolicy,
		Backend: im.Backend, Platform: im.Machine, ConverterVersion: im.ConverterVersion, Rungs: m.Rungs}
	// Verified on the staged copy: platform profile, backend, every file's hash, the plan.
	if _, err := verify(staging, want); err != nil {
		setDir(err, path)
		return nil, err
	}
	os.Remove(filepath.Join(staging, StampFile))
	dest, err := Path(im.Root, m.Model, m.Revision, m.ConversionPolicy.Name)
	if err != nil {
		return nil, err
	}

	res = &ImportResult{Dir: dest, Manifest: m}
	if _, statErr := os.Stat(dest); statErr == nil {
		if !force {
			if _, verr := (Verifier{Clock: im.Clock}).Verify(dest, want); verr != nil {
				return nil, fmt.Errorf("an artifact is registered at %s and does not verify (%v); import with --force to replace it", dest, verr)
			}
			os.RemoveAll(staging)
			res.AlreadyRegistered, res.NotProbed = true, "the artifact was already registered and verified; nothing was imported"
			return res, nil
		}
		backup := dest + backupInfix + im.now().UTC().Format("20060102T150405.000000000Z")
		// The backup's owner is recorded beside it: only once this import has exited may a
		// prune put the backup back.
		if err := os.WriteFile(backup+importMarker, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return nil, err
		}
		if err := os.Rename(dest, backup); err != nil {
			os.Remove(backup + importMarker)
			return nil, err
		}
		res.Replaced = true
		cleanup = append(cleanup, func() { os.RemoveAll(dest); os.Rename(backup, dest); os.Remove(backup + importMarker) })
		defer func() {
			if err == nil {
				os.RemoveAll(backup)
				os.Remove(backup + importMarker)
			}
		}()
	}
	if err := os.Rename(filepath.Join(staging, ManifestFile), filepath.Join(staging, PendingManifestFile)); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
		return nil, err
	}
	if err := os.Rename(staging, dest); err != nil {
		return nil, err
	}
	cleanup = append(cleanup, func() { os.RemoveAll(dest) })
	if err := im.step("moved"); err != nil {
		return nil, err
	}

	// The gates, at the registered path, with the manifest withheld.
	if err := gate(dest, m); err != nil {
		setDir(err, dest)
		return nil, err
	}
	switch {
	case im.Probe == nil:
		res.NotProbed = im.NoProbe
		if res.NotProbed == "" {
			res.NotProbed = "no probe was configured"
		}
	default:
		rep, err := im.Probe(dest, m)
		if err != nil {
			return nil, err
		}
		if rep == nil || rep.NotRun != "" {
			res.NotProbed = "the probe did not run"
			if rep != nil {
				res.NotProbed = rep.NotRun
			}
		} else {
			res.Probe = rep
		}
	}
	if err := im.step("gated"); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(dest, importMarker)); err != nil {
		return nil, err
	}
	if err := os.Rename(filepath.Join(dest, PendingManifestFile), filepath.Join(dest, ManifestFile)); err != nil {
		return nil, err
	}
	if err := im.step("published"); err != nil {
		return nil, err
	}
	return res, nil
}

// gate runs the parity gate on an artifact whose manifest is m.
func gate(dir string, m *Manifest) error {
	if m.Parity.Status != "passed" {
		return &ParityError{Message: "the manifest's parity gate did not pass"}
	}
	if m.Backend == "sim" {
		params, err := os.ReadFile(filepath.Join(dir, "params.json"))
		if err != nil {
			return &IntegrityError{Check: "parity", Message: err.Error()}
		}
		goldens, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(m.Parity.Goldens)))
		if err != nil {
			return &IntegrityError{Check: "parity", Message: err.Error()}
		}
		maxErr, err := simParity(params, goldens)
		if err != nil || maxErr > m.Parity.MaxAbsError {
			return &ParityError{Message: fmt.Sprintf("recomputed outputs differ from the goldens by %g (%v)", maxErr, err)}
		}
	}
	if m.Backend == "ane" {
		return aneParity(dir, m)
	}
	return nil
}

// Prune removes what killed imports left: staging directories and unpublished artifacts whose
// import has exited and which are older than StaleAfter, putting back the artifact a forced
// import had moved aside. It returns the directories it removed.
func (im Importer) Prune() ([]string, error) {
	var removed []string
	entries, err := os.ReadDir(im.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), stagingPrefix) {
			dir := filepath.Join(im.Root, e.Name())
			if im.stale(dir) {
				os.RemoveAll(dir)
				removed = append(removed, dir)
			}
		}
	}
	err = filepath.WalkDir(im.Root, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() || p == im.Root {
			return err
		}
		name := d.Name()
		if strings.HasPrefix(name, ".") {
			return filepath.SkipDir // staging, quarantine
		}
		if _, err := os.Stat(filepath.Join(p, PendingManifestFile)); err == nil {
			if _, err := os.Stat(filepath.Join(p, ManifestFile)); errors.Is(err, os.ErrNotExist) && im.stale(p) {
				os.RemoveAll(p)
				removed = append(removed, p)
			}
			return filepath.SkipDir
		}
		if i := strings.Index(name, backupInfix); i > 0 {
			// A forced import's backup: once its import has exited, it goes back unless the
			// new artifact was published.
			dest := filepath.Join(filepath.Dir(p), name[:i])
			if !alive(p + importMarker) {
				if _, err := os.Stat(filepath.Join(dest, ManifestFile)); err == nil {
					os.RemoveAll(p)
				} else {
					os.RemoveAll(dest)
					os.Rename(p, dest)
				}
				os.Remove(p + importMarker)
			}
			return filepath.SkipDir
		}
		return nil
	})
	return removed, err
}

// alive reports whether the import whose pid is in marker still runs.
func alive(marker string) bool {
	data, err := os.ReadFile(marker)
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	return err == nil && pid > 0 && syscall.Kill(pid, 0) == nil
}

// stale: the directory's import has exited (its pid is gone) and it is older than StaleAfter.
func (im Importer) stale(dir string) bool {
	if alive(filepath.Join(dir, importMarker)) {
		return false
	}
	info, err := os.Stat(dir)
	if err != nil {
		return false
	}
	return im.now().Sub(info.ModTime()) >= StaleAfter
}

// Pack writes the artifact in dir as a .tar.gz archive to w and returns its SHA-256 (what a
// repository index records).
func Pack(dir string, w io.Writer) (string, error) {
	h := sha256.New()
	if err := packTo(dir, io.MultiWriter(w, h)); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}
