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
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/utils/clock"
)

const (
	// PendingManifestFile is the manifest of an import that has not published yet.
	PendingManifestFile = "manifest.pending.json"
	// StampFile records a passed verification (see stampKey).
	StampFile = ".verified"
	// QuarantineDir, beside the artifacts, holds the ones found corrupt.
	QuarantineDir = ".quarantine"
)

// Want is what the loader expects an artifact to be, and the machine it is on.
type Want struct {
	Model, Revision, CheckpointDigest string
	ConversionPolicy                  ConversionPolicy
	Backend                           string
	// Platform is this machine's profile; ConverterVersion the converter this agent has.
	Platform         Platform
	ConverterVersion string
	// Rungs must each be in the artifact: a missing one is that rung's MissingError, never a
	// larger rung instead.
	Rungs []int
}

// Verified is an artifact that passed.
type Verified struct {
	Dir      string
	Manifest *Manifest
	// FromStamp: the stamp matched, and the files' hashes were not re-checked.
	FromStamp bool
}

// Verifier verifies artifacts and quarantines corrupt ones.
type Verifier struct {
	Clock clock.PassiveClock
}

// Verify checks the artifact in dir against want and the machine, in this order: a published
// manifest (else MissingError), the manifest's own claims (IntegrityError, PrecisionError,
// ComputeUnitMismatchError), that it is the artifact wanted (MismatchError), the rungs
// (MissingError), the parity gate (ParityError); then, unless the stamp matches, every file's
// SHA-256. An IntegrityError quarantines the artifact.
func (v Verifier) Verify(dir string, want Want) (*Verified, error) {
	out, err := verify(dir, want)
	var ie *IntegrityError
	if errors.As(err, &ie) {
		ie.Dir = dir
		if to, qerr := v.quarantine(dir); qerr != nil {
			ie.Message += fmt.Sprintf("; quarantining it failed: %v", qerr)
		} else {
			ie.Message += "; quarantined to " + to
		}
	}
	setDir(err, dir)
	return out, err
}

func setDir(err error, dir string) {
	var (
		cu *ComputeUnitMismatchError
		pe *PrecisionError
		me *MismatchError
		mi *MissingError
		pa *ParityError
	)
	switch {
	case errors.As(err, &cu):
		cu.Dir = dir
	case errors.As(err, &pe):
		pe.Dir = dir
	case errors.As(err, &me):
		me.Dir = dir
	case errors.As(err, &mi):
		mi.Dir = dir
	case errors.As(err, &pa):
		pa.Dir = dir
	}
}

func verify(dir string, want Want) (*Verified, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, perr := os.Stat(filepath.Join(dir, PendingManifestFile)); perr == nil {
			return nil, &MissingError{Message: "its import has not published the manifest yet"}
		}
		if _, derr := os.Stat(dir); derr != nil {
			return nil, &MissingError{Message: "no artifact is installed there"}
		}
		return nil, integrity("manifest", "the directory has no manifest.json")
	case err != nil:
		return nil, integrity("manifest", "the manifest cannot be read: %v", err)
	}
	m, err := Parse(data)
	if err != nil {
		return nil, err
	}
	if err := matches(m, want); err != nil {
		return nil, err
	}
	for _, r := range want.Rungs {
		if !slices.Contains(m.Rungs, r) {
			return nil, &MissingError{Message: fmt.Sprintf("rung %d is not in this artifact (it holds %v); a larger rung is never used instead", r, m.Rungs)}
		}
	}
	if m.Parity.Status != "passed" {
		return nil, &ParityError{Message: fmt.Sprintf("the parity gate did not pass (max abs error %g against %s)", m.Parity.MaxAbsError, m.Parity.Goldens)}
	}

	key, err := stampKey(dir, want)
	if err != nil {
		return nil, err
	}
	// A stamp that cannot be read, or says anything else, means full verification.
	if stamp, err := os.ReadFile(filepath.Join(dir, StampFile)); err == nil && string(stamp) == key {
		return &Verified{Dir: dir, Manifest: m, FromStamp: true}, nil
	}
	if err := checkFiles(dir, m); err != nil {
		return nil, err
	}
	// A stamp that cannot be written only means that the next load verifies in full again.
	_ = writeAtomic(filepath.Join(dir, StampFile), []byte(key))
	return &Verified{Dir: dir, Manifest: m}, nil
}

// matches checks that the artifact is the one wanted.
func matches(m *Manifest, want Want) error {
	for _, c := range []struct{ check, got, want string }{
		{"model", m.Model, want.Model},
		{"revision", m.Revision, want.Revision},
		{"checkpoint", m.CheckpointDigest, want.CheckpointDigest},
		{"conversionPolicy", m.ConversionPolicy.Name, want.ConversionPolicy.Name},
		{"conversionPolicy", m.ConversionPolicy.Digest, want.ConversionPolicy.Digest},
		{"backend", m.Backend, want.Backend},
		{"platform", m.Platform.ChipFamily, want.Platform.ChipFamily},
		{"platform", m.Platform.MacOSBuild, want.Platform.MacOSBuild},
	} {
		if c.got != c.want {
			return &MismatchError{Check: c.check, Message: fmt.Sprintf("the artifact has %q, %q is wanted", c.got, c.want)}
		}
	}
	return nil
}

// stampKey is what a verification depends on: the name, size, modification time and inode of
// every file in the artifact (listed or not, the manifest included), the macOS build and the
// converter version.
func stampKey(dir string, want Want) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "macOS=%s converter=%s\n", want.Platform.MacOSBuild, want.ConverterVersion)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		rel = filepath.ToSlash(rel)
		if rel == "." || d.IsDir() || isBookkeeping(rel) {
			return nil
		}
		info, err := os.Lstat(path)
		if err != nil {
			return err
		}
		var ino uint64
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			ino = uint64(st.Ino)
		}
		fmt.Fprintf(&b, "%s mode=%v size=%d mtime=%d inode=%d\n", rel, info.Mode().Type(), info.Size(), info.ModTime().UnixNano(), ino)
		return nil
	})
	if err != nil {
		return "", integrity("files", "%v", err)
	}
	sum := sha256.Sum256([]byte(b.String()))
	return "stamp-v1 " + hex.EncodeToString(sum[:]), nil
}

// isBookkeeping: the stamp (and a torn write of it) is the verifier's own and the import
// marker the importer's; neither is part of the artifact.
func isBookkeeping(rel string) bool {
	return rel == StampFile || strings.HasPrefix(rel, "."+StampFile+".tmp-") || rel == importMarker
}

// checkFiles hashes every file the manifest lists and refuses any other file in the artifact.
func checkFiles(dir string, m *Manifest) error {
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		rel = filepath.ToSlash(rel)
		switch {
		case rel == ".":
			return nil
		case d.IsDir():
			return nil
		case rel == ManifestFile || isBookkeeping(rel):
			return nil
		case !d.Type().IsRegular():
			return integrity("files", "%s is not a regular file", rel)
		}
		if _, ok := m.Files[rel]; !ok {
			return integrity("files", "%s is in the artifact but not in its manifest", rel)
		}
		return nil
	})
	if err != nil {
		var ie *IntegrityError
		if errors.As(err, &ie) {
			return ie
		}
		return integrity("files", "%v", err)
	}
	names := make([]string, 0, len(m.Files))
	for name := range m.Files {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		got, err := FileSHA256(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return integrity("files", "file %s: %v", name, err)
		}
		if got != m.Files[name] {
			return integrity("files", "file %s has SHA-256 %s, the manifest says %s", name, got, m.Files[name])
		}
	}
	return nil
}

// FileSHA256 is the "sha256:<hex>" digest of a regular file (a link is refused), as manifests,
// identities and repository indexes write it.
func FileSHA256(path string) (string, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("not a regular file")
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// quarantine moves a corrupt artifact aside, under QuarantineDir beside it, so that nothing
// corrupt stays in place; it returns where it went.
func (v Verifier) quarantine(dir string) (string, error) {
	clean := filepath.Clean(dir)
	qdir := filepath.Join(filepath.Dir(clean), QuarantineDir)
	if err := os.MkdirAll(qdir, 0o755); err != nil {
		return "", err
	}
	now := time.Now()
	if v.Clock != nil {
		now = v.Clock.Now()
	}
	to := filepath.Join(qdir, fmt.Sprintf("%s-%s", filepath.Base(clean), now.UTC().Format("20060102T150405.000000000Z")))
	if err := os.Rename(clean, to); err != nil {
		return "", err
	}
	return to, nil
}

// writeAtomic writes a file through a temporary file and one rename.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), path)
}
