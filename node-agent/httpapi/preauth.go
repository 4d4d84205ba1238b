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
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// taskOf is the lane task an endpoint calls.
var taskOf = map[string]string{"embeddings": "embed", "rerank": "rerank"}

// mayCallSome answers nil if the caller may call at least one lane of this node at the call's
// endpoint, else its refusal. A call names its lane inside its body, so the lane's own
// authorization comes after the body is read; a large body is read only with one of the few
// bulk slots held, and a caller the API server authenticates but no lane here admits could
// otherwise hold them, sending 32 MiB slowly, while the callers the lanes are for wait. The
// decisions are the authorizer's, cached as every other (allowed 5 min, denied 30 s), so a
// caller's bulk calls cost a lookup per lane it may not call, at most once per lane.
func (s *Server) mayCallSome(c *call) error {
	u, _ := c.r.Context().Value(callerKey{}).(user.Info)
	if u == nil {
		return &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: "the call was not authenticated"}
	}
	// In the lanes' order, so that a caller's decisions are asked the same way every call; a
	// lane whose decision cannot be had now (the authorizer is busy or away) does not end the
	// search: another may admit the caller from the cache.
	lanes := s.cfg.Catalog.Lanes()
	slices.SortFunc(lanes, func(a, b Lane) int { return strings.Compare(a.Key, b.Key) })
	var refused, undecided error
	for _, l := range lanes {
		if l.Task != taskOf[c.endpoint] {
			continue
		}
		what := fmt.Sprintf("create cataloglanes/%s of lane %s/%s", c.endpoint, l.Namespace, l.Name)
		err := s.authorize(c.r.Context(), u, apiauth.Access{Namespace: l.Namespace, Lane: l.Name, Subresource: c.endpoint}, what)
		if err == nil {
			return nil
		}
		if ae, ok := err.(*apiError); ok && ae.status != http.StatusForbidden {
			undecided = cmp.Or(undecided, err)
			continue
		}
		refused = err
	}
	if undecided != nil {
		return undecided // no lane admits the caller, and some could not say: 503, retry
	}
	if refused == nil {
		return &apiError{status: http.StatusNotFound, code: string(refusal.UnknownLane), message: fmt.Sprintf("no lane placed on this node answers %s calls", c.endpoint)}
	}
	return &apiError{status: http.StatusForbidden, code: CodeForbidden, message: fmt.Sprintf(
		"%s may not create cataloglanes/%s of any lane on this node; a body of this size is read only for a caller some lane admits", u.GetName(), c.endpoint)}
}
