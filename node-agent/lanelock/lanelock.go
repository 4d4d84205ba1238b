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

// Package lanelock is the machine-wide direct-ANE lane lock: an exclusive flock on a
// well-known path. The node agent takes it on its first direct-ANE load and passes the locked
// file to every worker it starts, so the lock stays held while any owned worker can still use
// the device, even if the agent itself dies first.
package lanelock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// ErrHeld means another process holds the lane lock: another agent owns the Neural Engine.
var ErrHeld = errors.New("the direct-ANE lane lock is held by another process")

// Lock is a held lane lock.
type Lock struct {
	f *os.File
}

// Acquire takes the lock at path without waiting: a live lane's lock is never bypassed.
func Acquire(path string) (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating the lane lock's folder: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the lane lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w (%s)", ErrHeld, path)
		}
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return &Lock{f: f}, nil
}

// File is the locked file, to pass to a worker process (exec.Cmd.ExtraFiles). The flock
// belongs to the open file description, which the child inherits, so the lock is released
// only when the agent and every worker have closed it.
func (l *Lock) File() *os.File { return l.f }

// Release drops the agent's hold on the lock. Workers that inherited it keep it held.
func (l *Lock) Release() error { return l.f.Close() }
