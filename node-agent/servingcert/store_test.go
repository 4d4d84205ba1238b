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

package servingcert

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/go-logr/logr/testr"
)

// TestFileStoreKeepsTheLastTwoCertificates: client-go's store writes a file per rotation and
// removes none; a Mac renewing daily would pile them up.
func TestFileStoreKeepsTheLastTwoCertificates(t *testing.T) {
	dir := t.TempDir()
	names := []string{pairPrefix + "-2026-11-29-10-00-00.pem", pairPrefix + "-2026-11-30-10-00-00.pem", pairPrefix + "-2026-12-01-09-00-00.pem",
		pairPrefix + "-2026-12-01-10-00-00.pem", "unrelated.pem"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(names[3], filepath.Join(dir, pairPrefix+"-current.pem")); err != nil {
		t.Fatal(err)
	}
	(&fileStore{dir: dir, log: testr.New(t)}).prune()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := []string{names[2], names[3], pairPrefix + "-current.pem", "unrelated.pem"}
	slices.Sort(want)
	if !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
}
