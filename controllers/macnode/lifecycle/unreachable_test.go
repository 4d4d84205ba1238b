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

package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"syscall"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestOnlyAnAPIServerOutOfReachHoldsTheJudgement: errors that say the API server could not be
// reached or could not serve hold every node's judgement for a grace period; answers about the
// request itself (a failed JSON patch test, a conflict, a refusal) do not.
func TestOnlyAnAPIServerOutOfReachHoldsTheJudgement(t *testing.T) {
	gr := schema.GroupResource{Group: "fleet.synapse.dev", Resource: "macnodes"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"none", nil, false},
		{"connection refused", &url.Error{Op: "Patch", URL: "https://127.0.0.1:6443", Err: syscall.ECONNREFUSED}, true},
		{"deadline", fmt.Errorf("writing: %w", context.DeadlineExceeded), true},
		{"503", apierrors.NewServiceUnavailable("away"), true},
		{"504", apierrors.NewTimeoutError("slow", 1), true},
		{"429", apierrors.NewTooManyRequests("busy", 1), true},
		{"500", apierrors.NewInternalError(errors.New("etcd")), true},
		{"422, wrapped", fmt.Errorf("removing the finalizer: %w", apierrors.NewInvalid(gr.WithVersion("v1alpha1").GroupVersion().WithKind("LanePlacement").GroupKind(), "p", nil)), false},
		{"409", apierrors.NewConflict(gr, "mac-1", errors.New("changed")), false},
		{"404", apierrors.NewNotFound(gr, "mac-1"), false},
		{"403", apierrors.NewForbidden(gr, "mac-1", errors.New("no")), false},
	} {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("%s: unreachable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
