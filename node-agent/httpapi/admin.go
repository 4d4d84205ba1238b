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
	"net/http"

	"github.com/go-logr/logr"
)

// Admin carries out the admin calls.
type Admin interface {
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
}

// NewAdmin is the admin API: POST /admin/pause and /admin/resume. It authenticates no one, so
// it is never served where the network reaches: the agent serves it on a Unix socket only its
// own user may open, as container runtimes serve theirs. Across the cluster a node is paused
// by its MacNode's spec.paused, which RBAC guards.
func NewAdmin(admin Admin, log logr.Logger) http.Handler {
	mux := http.NewServeMux()
	handle := func(call func(context.Context) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if err := call(r.Context()); err != nil {
				log.Error(err, "admin call failed", "path", r.URL.Path)
				writeError(w, &apiError{status: http.StatusInternalServerError, code: "admin_failed", message: scrub(err.Error())})
				return
			}
			writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
		}
	}
	mux.HandleFunc("POST /admin/pause", handle(admin.Pause))
	mux.HandleFunc("POST /admin/resume", handle(admin.Resume))
	return mux
}
