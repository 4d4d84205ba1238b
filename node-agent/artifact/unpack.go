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
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// MaxArchiveBytes bounds what an archive may unpack to; a larger one is refused, not cut.
const MaxArchiveBytes = 8 << 30

// unpack extracts a .tar.gz into dir (which must exist and be empty). It refuses absolute
// paths, paths that leave the tree, links of any kind, device files and anything over limit
// bytes in all: an archive is data, never instructions to write elsewhere.
func unpack(r io.Reader, dir string, limit int64) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("the archive is not gzip: %w", err)
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the archive is not a tar: %w", err)
		}
		name := h.Name
		clean := path.Clean(name)
		switch {
		case name == "" || path.IsAbs(name) || strings.HasPrefix(name, "/") || filepath.IsAbs(name):
			return fmt.Errorf("archive entry %q has an absolute path", name)
		case clean == ".." || strings.HasPrefix(clean, "../") || strings.Contains(name, "\\"):
			return fmt.Errorf("archive entry %q leaves the artifact", name)
		}
		target := filepath.Join(dir, filepath.FromSlash(clean))
		switch h.Typeflag {
		case tar.TypeDir:
			if clean == "." {
				continue
			}
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if h.Size < 0 || total+h.Size > limit {
				return fmt.Errorf("the archive unpacks to more than %d bytes", limit)
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
			if err != nil {
				return fmt.Errorf("archive entry %q: %w", name, err)
			}
			n, err := io.Copy(f, io.LimitReader(tr, h.Size+1))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if n != h.Size {
				return fmt.Errorf("archive entry %q holds %d bytes, its header says %d", name, n, h.Size)
			}
			total += n
		default:
			return fmt.Errorf("archive entry %q is a %s, not a file or directory: links and devices are refused", name, typeName(h.Typeflag))
		}
	}
}

func typeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symbolic link"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device"
	case tar.TypeFifo:
		return "named pipe"
	}
	return fmt.Sprintf("type %q entry", t)
}
