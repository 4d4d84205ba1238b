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

package artifact_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/convert"
)

// aneArchive converts the tiny ModernBERT model, lets edit change the artifact (re-hashing
// what it touched, as a careful forger would), and packs it.
func aneArchive(t *testing.T, edit func(dir string, m *artifact.Manifest)) string {
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
	m, err := convert.Convert(dir, c, convert.Options{Model: "tiny", Revision: "r1", Rungs: []int{64, 128},
		Platform: artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}, Policy: convert.DefaultPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		edit(dir, m)
		for name := range m.Files {
			sum, err := artifact.FileSHA256(filepath.Join(dir, filepath.FromSlash(name)))
			if err != nil {
				t.Fatal(err)
			}
			m.Files[name] = sum
		}
		data, _ := m.Marshal()
		if err := os.WriteFile(filepath.Join(dir, artifact.ManifestFile), data, 0o644); err != nil {
			t.Fatal(err)
		}
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

func aneImporter(t *testing.T) artifact.Importer {
	return artifact.Importer{Root: t.TempDir(), Machine: artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}, Backend: "ane",
		ConverterVersion: convert.ConverterVersion, Clock: clocktesting.NewFakeClock(time.Now())}
}

func TestAnANEArtifactIsImportedOnlyIfItsProgramsAndGoldensRecompute(t *testing.T) {
	im := aneImporter(t)
	res, err := im.Import(aneArchive(t, nil), "", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(res.Dir, artifact.ManifestFile)); err != nil {
		t.Fatal("the artifact was not published")
	}

	// Goldens that the programs do not reproduce, with the manifest re-hashed to match.
	forged := aneArchive(t, func(dir string, m *artifact.Manifest) {
		var goldens []aneartifact.Golden
		data, _ := os.ReadFile(filepath.Join(dir, aneartifact.GoldensFile))
		_ = json.Unmarshal(data, &goldens)
		goldens[0].Output[0] += 0.5
		data, _ = json.Marshal(goldens)
		_ = os.WriteFile(filepath.Join(dir, aneartifact.GoldensFile), data, 0o644)
	})
	var pe *artifact.ParityError
	if _, err := aneImporter(t).Import(forged, "", false); !errors.As(err, &pe) {
		t.Fatalf("forged goldens: %v, want ArtifactParityError", err)
	}

	// A program text that is not what the weights emit.
	edited := aneArchive(t, func(dir string, m *artifact.Manifest) {
		path := filepath.Join(dir, filepath.FromSlash(aneartifact.ProgramPath(128, 1)))
		data, _ := os.ReadFile(path)
		_ = os.WriteFile(path, append(data, '\n'), 0o644)
	})
	var ie *artifact.IntegrityError
	if _, err := aneImporter(t).Import(edited, "", false); !errors.As(err, &ie) {
		t.Fatalf("an edited program: %v, want ArtifactIntegrityError", err)
	}
}
