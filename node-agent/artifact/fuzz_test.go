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
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzParse: the manifest parser never panics, and what it accepts survives a round trip.
func FuzzParse(f *testing.F) {
	dir := filepath.Join(f.TempDir(), "a")
	if _, err := BuildSim(dir, spec); err != nil {
		f.Fatal(err)
	}
	good, _ := os.ReadFile(filepath.Join(dir, ManifestFile))
	f.Add(good)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"schemaVersion": 1, "files": {"../x": "sha256:00"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Parse(data)
		if err != nil {
			return
		}
		again, err := m.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Parse(again)
		if err != nil || !reflect.DeepEqual(m, m2) {
			t.Fatalf("an accepted manifest does not survive a round trip: %v", err)
		}
	})
}

// FuzzUnpack: the archive unpacker never panics and never writes outside its directory,
// whatever the archive says.
func FuzzUnpack(f *testing.F) {
	src := filepath.Join(f.TempDir(), "a")
	if _, err := BuildSim(src, spec); err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := Pack(src, &buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		parent := t.TempDir()
		dir := filepath.Join(parent, "in")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		_ = unpack(bytes.NewReader(data), dir, 1<<20)
		entries, _ := os.ReadDir(parent)
		if len(entries) != 1 {
			t.Fatalf("the unpacker wrote beside its directory: %v", entries)
		}
	})
}
