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

// Package refusal holds the typed answers a request gets instead of a result. Each has a
// machine-readable code that the HTTP API maps to a status, so a client can tell a shape that
// is compiling (retry later) from one that will never fit (fix the request).
package refusal

import (
	"errors"
	"fmt"
	"time"
)

// Code is a machine-readable refusal code.
type Code string

const (
	// ShapeCompiling: the shape is predicted ready only after the request's deadline or
	// admission bound; retry after RetryAfter, when the compile has finished.
	ShapeCompiling Code = "shape_compiling"
	// UnsupportedShape: the input is empty or longer than the lane's ceiling.
	UnsupportedShape Code = "unsupported_shape"
	// ResourcesExhausted: the Neural Engine cannot hold the shape.
	ResourcesExhausted Code = "ane_resources_exhausted"
	// EngineCrashed: the worker or the scheduler failed; the request may be retried.
	EngineCrashed Code = "engine_crashed"
	// DeadlineExceeded: the request's absolute deadline passed.
	DeadlineExceeded Code = "deadline_exceeded"
	// LaneRetired: the lane is being unloaded from this node.
	LaneRetired Code = "lane_retired"
	// UnknownLane: no such lane is loaded on this node.
	UnknownLane Code = "unknown_lane"
	// InvalidRequest: the request is malformed or asks the lane for something it does not do.
	InvalidRequest Code = "invalid_request"
	// WorkerRefused: the worker answered the request with an error of its own.
	WorkerRefused Code = "worker_refused"
	// NodePaused: the node is paused and has unloaded every lane; resume it or call another.
	NodePaused Code = "node_paused"
	// BackendUnavailable: the lane's worker is dead and its replacement failed to start; every
	// request fails with it until one serves, and none is sent to another worker or node.
	BackendUnavailable Code = "backend_unavailable"
	// ComputeUnitMismatch: the shape's runtime placement probe found it is not running on the
	// device the lane names; it serves nothing until the lane is loaded again.
	ComputeUnitMismatch Code = "compute_unit_mismatch"
	// Overloaded: the lane's bounds on running and waiting calls are reached; retry after
	// RetryAfter.
	Overloaded Code = "overloaded"
)

// Error is a refusal.
type Error struct {
	Code Code
	// Lane is the lane the request was for.
	Lane string
	// RetryAfter is set for ShapeCompiling: the predicted delay until the shape is ready.
	RetryAfter time.Duration
	// Message says what happened in words.
	Message string
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("%s: lane %s", e.Code, e.Lane)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.Code == ShapeCompiling {
		msg += fmt.Sprintf(" (retry after %dms)", e.RetryAfter.Milliseconds())
	}
	return msg
}

// Is makes errors.Is(err, &Error{Code: c}) match any refusal with code c.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Lane == "" || t.Lane == e.Lane)
}

// New returns a refusal.
func New(code Code, lane, format string, args ...any) *Error {
	return &Error{Code: code, Lane: lane, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the refusal code of err, or "" if err is not a refusal.
func CodeOf(err error) Code {
	var r *Error
	if errors.As(err, &r) {
		return r.Code
	}
	return ""
}
