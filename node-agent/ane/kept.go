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
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// The kept folders: a copy of each compiled model's folder that outlives the model.
//
// The framework compiles a model in the folder named by its content identifier under
// NSTemporaryDirectory() and loads it from there: jafreck/ironmill
// crates/ironmill-ane-sys/src/model.rs (patch_weights) reads the compiled net.plist from that
// folder and loads a model whose folder holds it without compiling. Unloading deletes the
// folder (maderix/h3.c-ane h3_ane_bridge.m: "The model unload deletes its staging directory,
// so compiled artifacts are preserved in a content-addressed entry next to it and restored on
// reuse"), so aned's answer to -compiledModelExists alone may not bring a program back in a
// new process. As h3 does, the compiled files (all but model.mil and weights/, whose constants
// the compiled data embeds) are kept under KeptRoot by identifier, with a marker written last,
// and mirrored back into the model's folder before it loads.
const (
	keptFolder = "synapse-ane-cache"
	keptMarker = "compiled.ok"
)

// ErrNothingToKeep: after a compile and a load the model's folder held only its sources.
var ErrNothingToKeep = errors.New("the model's folder holds nothing but its sources after the compile")

// KeptRoot is the folder of every kept compiled folder.
func (s Sources) KeptRoot() string { return filepath.Join(s.Root, keptFolder) }

// KeptDir is the kept copy of the compiled folder of the model with identifier id.
func (s Sources) KeptDir(id string) string { return filepath.Join(s.KeptRoot(), id) }

// Kept reports whether a complete kept copy of the model's compiled folder exists.
func (s Sources) Kept(id string) bool {
	if !validID(id) {
		return false
	}
	_, err := os.Stat(filepath.Join(s.KeptDir(id), keptMarker))
	return err == nil
}

// Keep copies the compiled files of the model's folder (everything but its sources) to its
// kept folder, replacing any earlier copy; the marker is written last, so a copy cut short is
// never restored.
func (s Sources) Keep(id string) error {
	if !validID(id) {
		return fmt.Errorf("model identifier %q is not a folder name", id)
	}
	dir, kept := s.Dir(id), s.KeptDir(id)
	if err := os.RemoveAll(kept); err != nil {
		return err
	}
	files := 0
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		switch {
		case rel == "model.mil" || rel == "weights":
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		case d.IsDir():
			return os.MkdirAll(filepath.Join(kept, rel), 0o700)
		}
		files++
		return mirrorFile(path, filepath.Join(kept, rel))
	})
	if err == nil && files == 0 {
		// Nothing but the sources: the compiler left its output elsewhere (aned's own cache).
		// An empty copy would be restored as held and fail to load in every new process.
		err = ErrNothingToKeep
	}
	if err != nil {
		_ = os.RemoveAll(kept)
		return fmt.Errorf("keeping the compiled folder of %s: %w", id, err)
	}
	return os.WriteFile(filepath.Join(kept, keptMarker), nil, 0o600)
}

// Restore mirrors the model's kept folder into its folder, where the framework loads it
// from, and reports whether there was one to restore.
func (s Sources) Restore(id string) (bool, error) {
	if !s.Kept(id) {
		return false, nil
	}
	kept, dir := s.KeptDir(id), s.Dir(id)
	err := filepath.WalkDir(kept, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(kept, path)
		if err != nil {
			return err
		}
		switch {
		case rel == keptMarker:
			return nil
		case d.IsDir():
			return os.MkdirAll(filepath.Join(dir, rel), 0o700)
		}
		return mirrorFile(path, filepath.Join(dir, rel))
	})
	if err != nil {
		return false, fmt.Errorf("restoring the kept compiled folder of %s: %w", id, err)
	}
	return true, nil
}

// Forget removes the model's kept folder: one that did not load is not restored again.
func (s Sources) Forget(id string) error {
	if !validID(id) {
		return nil
	}
	return os.RemoveAll(s.KeptDir(id))
}

// mirrorFile hard-links from to to (the same volume, so it costs nothing), copying when a
// link is refused; to is replaced.
func mirrorFile(from, to string) error {
	if err := os.Remove(to); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if os.Link(from, to) == nil {
		return nil
	}
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func validID(id string) bool { return id != "" && filepath.Base(id) == id && id != "." && id != ".." }
