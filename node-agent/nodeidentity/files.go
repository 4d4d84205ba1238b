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

package nodeidentity

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// writeFileAtomic replaces path with data (mode 0600) by a rename, so a reader (client-go
// re-reads the token file every minute) sees the old file or the new one, never half of one. A
// failed attempt removes its temporary file.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	abandon := func(err error, closed bool) error {
		err = fmt.Errorf("writing %s: %w", path, err)
		if !closed {
			err = errors.Join(err, tmp.Close())
		}
		return errors.Join(err, os.Remove(tmp.Name()))
	}
	if err := tmp.Chmod(0o600); err != nil {
		return abandon(err, false)
	}
	if _, err := tmp.Write(data); err != nil {
		return abandon(err, false)
	}
	if err := tmp.Sync(); err != nil {
		return abandon(err, false)
	}
	if err := tmp.Close(); err != nil {
		return abandon(err, true)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return abandon(err, true)
	}
	return nil
}
