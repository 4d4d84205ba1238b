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

package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/go-logr/logr"
)

type fakeAdmin struct {
	paused bool
	err    error
}

func (a *fakeAdmin) Pause(context.Context) error  { a.paused = true; return a.err }
func (a *fakeAdmin) Resume(context.Context) error { a.paused = false; return a.err }

func TestAdminPauseAndResume(t *testing.T) {
	admin := &fakeAdmin{}
	ts := httptest.NewServer(NewAdmin(admin, logr.Discard()))
	t.Cleanup(ts.Close)
	if resp, _ := post(t, ts.URL+"/admin/pause", `{}`); resp.StatusCode != 200 || !admin.paused {
		t.Fatalf("pause: %d, paused %v", resp.StatusCode, admin.paused)
	}
	if resp, _ := post(t, ts.URL+"/admin/resume", `{}`); resp.StatusCode != 200 || admin.paused {
		t.Fatalf("resume: %d, paused %v", resp.StatusCode, admin.paused)
	}
	admin.err = errors.New("the supervisor is gone")
	if resp, body := post(t, ts.URL+"/admin/pause", `{}`); resp.StatusCode != 500 || errorCodeOf(body) != "admin_failed" {
		t.Fatalf("a failed pause: %d %v", resp.StatusCode, body)
	}
}

// The data port serves no admin call, to anyone: pausing is the MacNode's spec.paused, or the
// agent's local admin socket.
func TestTheAPIServesNoAdminCalls(t *testing.T) {
	ts, _, _ := newTestServer(t)
	for _, path := range []string{"/admin/pause", "/admin/resume"} {
		resp, body := post(t, ts.URL+path, `{}`)
		if resp.StatusCode != http.StatusNotFound || errorCodeOf(body) != "not_found" {
			t.Fatalf("%s: %d %v", path, resp.StatusCode, body)
		}
	}
}
