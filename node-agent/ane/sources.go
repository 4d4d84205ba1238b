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
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// Sources is where the framework's compiler reads a program's sources: a folder named by the
// model's content identifier inside the per-user temporary folder that Foundation's
// NSTemporaryDirectory() gives (maderix/ANE training/ane_runtime.h and bridge/ane_bridge.m,
// maderix/h3.c-ane h3_ane_bridge.m, jundot/omlx qwen35_ane.mm, which also points the model's
// URL there with -setModelURL:). That folder (/var/folders/.../T) is not Go's os.TempDir(),
// which is /tmp when TMPDIR is unset, as it is for a launchd job.
type Sources struct {
	// Root is NSTemporaryDirectory().
	Root string
}

// Dir is the folder of the model with identifier id.
func (s Sources) Dir(id string) string { return filepath.Join(s.Root, id) }

// Write writes model.mil and weights/weight.bin for the model with identifier id, the files
// the program's BLOBFILE paths (@model_path/weights/weight.bin) name.
func (s Sources) Write(id string, p mil.Program) (string, error) {
	if !validID(id) {
		return "", fmt.Errorf("model identifier %q is not a folder name", id)
	}
	dir := s.Dir(id)
	if err := os.MkdirAll(filepath.Join(dir, "weights"), 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "model.mil"), []byte(p.Text), 0o600); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "weights", "weight.bin"), p.Weights, 0o600); err != nil {
		return "", err
	}
	return dir, nil
}

// Remove deletes the model's folder.
func (s Sources) Remove(id string) error {
	if !validID(id) {
		return nil
	}
	return os.RemoveAll(s.Dir(id))
}

// Free is the free space of the file system the sources are written to.
func (s Sources) Free() (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.Root, &st); err != nil {
		return 0, fmt.Errorf("the compiler's temporary folder %s: %w", s.Root, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// Entry is one key and value of a dictionary the framework is given, in the order it is built.
type Entry struct {
	Key   string
	Value any // uint64, []byte or []Entry (a nested dictionary)
}

// WeightsArgument is -[_ANEInMemoryModelDescriptor modelWithMILText:weights:optionsPlist:]'s
// weights dictionary for p: the blob path mapped to {offset: 0, data: the blob}, keys in that
// order (the dictionary literal @{@"offset": @0, @"data": ...} of maderix/ANE
// training/ane_runtime.h, maderix/h3.c-ane h3_ane_bridge.m and jundot/omlx qwen35_ane.mm, built
// in source order), or no entry at all for a program without weights: an empty dictionary,
// never nil, or the descriptor is nil (maderix/ANE bridge/ane_bridge.m passes @{}).
func WeightsArgument(p mil.Program) []Entry {
	if len(p.Weights) < 8 || binary.LittleEndian.Uint32(p.Weights) == 0 {
		return nil
	}
	return []Entry{{Key: mil.BlobPath, Value: []Entry{{Key: "offset", Value: uint64(0)}, {Key: "data", Value: p.Weights}}}}
}
