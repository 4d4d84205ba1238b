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
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
)

type recordingAdmin struct{ paused bool }

func (a *recordingAdmin) Pause(context.Context) error  { a.paused = true; return nil }
func (a *recordingAdmin) Resume(context.Context) error { a.paused = false; return nil }

// overSocket is an HTTP client whose every connection goes to the Unix socket at path.
func overSocket(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", path)
	}}}
}

// The admin socket is the agent's user's alone, replaces what a killed agent left, and never
// removes anything else.
func TestTheAdminSocketIsTheAgentUsersAloneAndReplacesAStaleOne(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.sock")
	// What a killed agent leaves: a socket file nobody serves.
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := stale.Close(); err != nil {
		t.Fatal(err)
	}
	ln, err := listenAdmin(path)
	if err != nil {
		t.Fatalf("a stale socket was not replaced: %v", err)
	}
	defer ln.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("the admin socket's mode is %v, not 0600", fi.Mode().Perm())
	}
	admin := &recordingAdmin{}
	srv := &http.Server{Handler: httpapi.NewAdmin(admin, logr.Discard())}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	resp, err := overSocket(path).Post("http://agent/admin/pause", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !admin.paused {
		t.Fatalf("pause over the socket: %d, paused %v", resp.StatusCode, admin.paused)
	}

	// A second agent on the same state directory does not take the socket over.
	if _, err := listenAdmin(path); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("a served socket was taken over: %v", err)
	}
	// A file that is no socket is left alone.
	other := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(other, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := listenAdmin(other); err == nil {
		t.Fatal("a regular file at the socket's path was replaced")
	}
	if data, err := os.ReadFile(other); err != nil || string(data) != "keep me" {
		t.Fatalf("the file was touched: %q %v", data, err)
	}
}
