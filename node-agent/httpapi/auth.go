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
	"fmt"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// Auth authenticates every call but the probes and authorizes what it asks: each lane it may
// run on (verb create on cataloglanes/embeddings or cataloglanes/rerank of that lane) and
// /metrics (get, a path that is no resource). apiauth.Delegating asks the API server;
// apiauth.Anonymous lets everyone in and is only ever chosen explicitly (--auth=none).
type Auth interface {
	AuthenticateRequest(r *http.Request) (u user.Info, ok bool, why string, err error)
	Authorize(ctx context.Context, u user.Info, a apiauth.Access) (allowed bool, reason string, err error)
}

// Codes of the answers to calls that are not let in.
const (
	// CodeUnauthorized (401): no bearer token, or one the API server does not accept for the
	// fleet's audience.
	CodeUnauthorized = "unauthorized"
	// CodeForbidden (403): the caller may not call the lane (or read the metrics).
	CodeForbidden = "forbidden"
	// CodeAuthUnavailable (503, with Retry-After): the API server could not be asked, or the
	// agent would not ask it now (too many reviews in flight, or too many made-up tokens
	// lately); retry.
	CodeAuthUnavailable = "auth_unavailable"
)

// public are the paths every caller may get, as the API server lets anyone read its health
// (system:public-info-viewer): a probe has no token.
var public = map[string]bool{"/healthz": true, "/readyz": true}

type callerKey struct{}

// arrivalKey holds when a call arrived (ServeHTTP): its deadline runs from then, the review of
// its token included.
type arrivalKey struct{}

// arrival is when the call on ctx arrived; now for a call ServeHTTP did not see arrive.
func (s *Server) arrival(ctx context.Context) time.Time {
	if t, ok := ctx.Value(arrivalKey{}).(time.Time); ok {
		return t
	}
	return s.cfg.Clock.Now()
}

// admit authenticates r, and authorizes it when it asks for /metrics; a call to a lane is
// authorized once its lanes are known (authorizeLanes). It answers and returns false for a
// call it does not let in. The caller and the call's arrival go into r's context.
func (s *Server) admit(w http.ResponseWriter, r **http.Request, arrived time.Time) bool {
	req := *r
	if public[req.URL.Path] {
		return true
	}
	if s.cfg.Auth == nil {
		writeError(w, &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: "this agent has no authentication configured and lets no call in"})
		return false
	}
	u, ok, why, err := s.cfg.Auth.AuthenticateRequest(req)
	switch {
	case errors.Is(err, apiauth.ErrBusy) || errors.Is(err, apiauth.ErrTooManyRefused):
		// No review was made, at once: a flood of made-up tokens is answered here, and logs
		// no line each.
		s.cfg.Log.V(1).Info("no review of a caller's token now", "path", req.URL.Path, "reason", err.Error())
		writeError(w, &apiError{status: http.StatusServiceUnavailable, code: CodeAuthUnavailable, message: "the caller's token could not be reviewed now; retry"})
		return false
	case err != nil:
		s.cfg.Log.Error(err, "authenticating a call", "path", req.URL.Path)
		writeError(w, &apiError{status: http.StatusServiceUnavailable, code: CodeAuthUnavailable, message: "the caller's token could not be reviewed now; retry"})
		return false
	case !ok:
		s.cfg.Log.V(1).Info("refused an unauthenticated call", "path", req.URL.Path, "reason", why)
		w.Header().Set("WWW-Authenticate", `Bearer realm="synapse-fleet"`)
		writeError(w, &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: s.tokenHint()})
		return false
	}
	*r = req.WithContext(context.WithValue(context.WithValue(req.Context(), callerKey{}, u), arrivalKey{}, arrived))
	if req.URL.Path == "/metrics" {
		if err := s.authorize(req.Context(), u, apiauth.Access{Path: "/metrics"}, "get "+req.URL.Path); err != nil {
			writeError(w, fromError(err))
			return false
		}
	}
	return true
}

func (s *Server) tokenHint() string {
	msg := "a bearer token is required (Authorization: Bearer <token>) that the cluster's API server accepts"
	if a, ok := s.cfg.Auth.(interface{ Audience() string }); ok {
		msg += " for the audience " + a.Audience()
	}
	return msg
}

// authorize answers nil if u may do a, else the call's refusal; what says what was asked.
func (s *Server) authorize(ctx context.Context, u user.Info, a apiauth.Access, what string) error {
	allowed, reason, err := s.cfg.Auth.Authorize(ctx, u, a)
	switch {
	case err != nil:
		s.cfg.Log.Error(err, "authorizing a call", "user", u.GetName(), "access", what)
		return &apiError{status: http.StatusServiceUnavailable, code: CodeAuthUnavailable, message: "the caller's access could not be reviewed now; retry"}
	case !allowed:
		msg := fmt.Sprintf("%s may not %s", u.GetName(), what)
		if reason != "" {
			msg += ": " + reason
		}
		return &apiError{status: http.StatusForbidden, code: CodeForbidden, message: msg}
	}
	return nil
}

// authorizeWithin is authorize, its wait for a review bounded by the call's deadline on lane
// l: the lane is known once the body is read, and the deadline runs from the call's arrival
// (the caller's token, reviewed before any lane is known, waits at most apiauth's
// ReviewTimeout). A deadline that passes during the review is the call's, answered
// deadline_exceeded, not the authorizer's unavailability.
func (s *Server) authorizeWithin(c *call, u user.Info, l Lane, a apiauth.Access, what string) error {
	d := c.deadline(l)
	if d.IsZero() {
		return s.authorize(c.r.Context(), u, a, what)
	}
	ctx, cancel := context.WithTimeout(c.r.Context(), d.Sub(s.cfg.Clock.Now()))
	defer cancel()
	err := s.authorize(ctx, u, a, what)
	if ae, ok := err.(*apiError); ok && ae.status == http.StatusServiceUnavailable && ctx.Err() == context.DeadlineExceeded && c.r.Context().Err() == nil {
		return refusal.New(refusal.DeadlineExceeded, l.Key, "the deadline passed while the caller's access to the lane was reviewed")
	}
	return err
}

// authorizeLanes keeps the lanes the caller may call on c's endpoint. A lane the request named
// that the caller may not call refuses the call; so does a model none of whose lanes it may
// call. Lanes the caller may not call are never routed to.
func (s *Server) authorizeLanes(c *call, model string, lanes []Lane, byName bool) ([]Lane, error) {
	u, _ := c.r.Context().Value(callerKey{}).(user.Info)
	if u == nil {
		return nil, &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: "the call was not authenticated"}
	}
	allowed := lanes[:0:0]
	var refused error
	for _, l := range lanes {
		what := fmt.Sprintf("create cataloglanes/%s of lane %s/%s", c.endpoint, l.Namespace, l.Name)
		err := s.authorizeWithin(c, u, l, apiauth.Access{Namespace: l.Namespace, Lane: l.Name, Subresource: c.endpoint}, what)
		if refusal.CodeOf(err) == refusal.DeadlineExceeded {
			return nil, err
		}
		if ae, ok := err.(*apiError); ok && ae.status != http.StatusForbidden {
			return nil, err // no decision: say so rather than route around it
		}
		if err != nil {
			refused = err
			continue
		}
		allowed = append(allowed, l)
	}
	switch {
	case len(allowed) > 0:
		return allowed, nil
	case byName || len(lanes) == 1:
		return nil, refused
	}
	return nil, &apiError{status: http.StatusForbidden, code: CodeForbidden, message: fmt.Sprintf(
		"%s may not create cataloglanes/%s of any lane of model %s on this node", u.GetName(), c.endpoint, model)}
}
