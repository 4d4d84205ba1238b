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

package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
)

// listenAdmin opens the admin socket at path, readable and writable by the agent's user only
// (connecting to a Unix socket needs write permission on it), so that pausing a node over the
// admin API takes a login on the Mac as that user. A socket a previous run left behind is
// replaced; any other file at path is an error, never removed.
func listenAdmin(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("the admin socket's path %s holds a %s, not a socket: move it away", path, fi.Mode().Type())
		}
		if c, err := net.Dial("unix", path); err == nil {
			return nil, errors.Join(fmt.Errorf("another agent serves the admin socket %s", path), c.Close())
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing the stale admin socket: %w", err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on the admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		return nil, errors.Join(fmt.Errorf("restricting the admin socket to its owner: %w", err), ln.Close())
	}
	return ln, nil
}
