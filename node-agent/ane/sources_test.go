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
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

func TestSourcesAreWrittenToTheFrameworksFolderNotTMPDIR(t *testing.T) {
	tmpdir, foundation := t.TempDir(), t.TempDir()
	t.Setenv("TMPDIR", tmpdir)
	p, err := mil.Linear{In: 4, Out: 4, Seq: 64, Weights: make([]float32, 16)}.Program()
	if err != nil {
		t.Fatal(err)
	}
	s := Sources{Root: foundation}
	dir, err := s.Write("0a1b_2c3d_4e5f", p)
	if err != nil {
		t.Fatal(err)
	}
	if dir != filepath.Join(foundation, "0a1b_2c3d_4e5f") {
		t.Fatalf("sources at %s", dir)
	}
	mil, _ := os.ReadFile(filepath.Join(dir, "model.mil"))
	weights, _ := os.ReadFile(filepath.Join(dir, "weights", "weight.bin"))
	if string(mil) != p.Text || !bytes.Equal(weights, p.Weights) {
		t.Fatal("the sources written are not the program's")
	}
	if entries, _ := os.ReadDir(tmpdir); len(entries) != 0 {
		t.Fatalf("%d entries under TMPDIR", len(entries))
	}
	// Free space is measured where the sources go.
	if free, err := s.Free(); err != nil || free <= 0 {
		t.Fatalf("free space: %d, %v", free, err)
	}
	if _, err := (Sources{Root: filepath.Join(foundation, "missing")}).Free(); err == nil {
		t.Fatal("the free space of a missing folder")
	}
	if err := s.Remove("0a1b_2c3d_4e5f"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the sources are still there: %v", err)
	}
	if _, err := s.Write("../escape", p); err == nil {
		t.Fatal("an identifier that is a path was written")
	}
}

func TestTheWeightsDictionaryIsBuiltInTheReferencesOrder(t *testing.T) {
	p, err := mil.Linear{In: 4, Out: 4, Seq: 64, Weights: make([]float32, 16)}.Program()
	if err != nil {
		t.Fatal(err)
	}
	entries := WeightsArgument(p)
	if len(entries) != 1 || entries[0].Key != mil.BlobPath {
		t.Fatalf("weights %+v", entries)
	}
	inner, ok := entries[0].Value.([]Entry)
	if !ok || len(inner) != 2 || inner[0].Key != "offset" || inner[0].Value != uint64(0) || inner[1].Key != "data" {
		t.Fatalf("the blob's entry is %+v, want offset 0 then data", inner)
	}
	if data, _ := inner[1].Value.([]byte); !bytes.Equal(data, p.Weights) {
		t.Fatal("the data is not the blob")
	}
	// A program without weights gets an empty dictionary.
	g, x := mil.NewGraph(4, 64)
	empty, err := g.Program(g.Add("y", x, x))
	if err != nil {
		t.Fatal(err)
	}
	if got := WeightsArgument(empty); len(got) != 0 {
		t.Fatalf("no weights: %+v", got)
	}
}
