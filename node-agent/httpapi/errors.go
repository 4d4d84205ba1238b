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
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// apiError is an answer that is not a result: its status, machine-readable code and message,
// in the OpenAI error envelope that clients already parse.
type apiError struct {
	status     int
	code       string
	message    string
	param      string
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

// errorBody is {"error": {...}}, as the OpenAI API answers.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Message string `json:"message"`
	// Type is the OpenAI error type: invalid_request_error for 4xx, server_error otherwise.
	Type         string  `json:"type"`
	Code         string  `json:"code"`
	Param        *string `json:"param"`
	RetryAfterMs *int64  `json:"retry_after_ms,omitempty"`
}

func badRequest(code, param, message string) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, param: param, message: message}
}

// statusOf maps a refusal code to its HTTP status.
func statusOf(code refusal.Code) int {
	switch code {
	case refusal.UnsupportedShape:
		return http.StatusUnprocessableEntity
	case refusal.UnknownLane:
		return http.StatusNotFound
	case refusal.InvalidRequest:
		return http.StatusBadRequest
	case refusal.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case refusal.Overloaded:
		return http.StatusTooManyRequests
	default:
		// shape_compiling, engine_crashed, ane_resources_exhausted, lane_retired,
		// worker_refused, node_paused, backend_unavailable, compute_unit_mismatch: the lane
		// cannot answer now; retrying (later, or elsewhere by the caller's choice) may succeed.
		return http.StatusServiceUnavailable
	}
}

// fromError turns any error of a call into its answer. The answer goes to whoever called, so it
// carries the refusal's code and words but never a file path or what a worker wrote on stderr
// (a load failure's or a worker fault's message may hold both): those are cut from it here, and
// the whole error goes to the agent's log. An error that is not a refusal says only that it
// happened.
func fromError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var r *refusal.Error
	if errors.As(err, &r) {
		return &apiError{status: statusOf(r.Code), code: string(r.Code), message: scrub(r.Error()), retryAfter: r.RetryAfter}
	}
	return &apiError{status: http.StatusInternalServerError, code: "internal_error", message: "the agent failed to answer the call; its log has the detail"}
}

// stderrMarker starts the stderr lines workerhost appends to a worker's fault.
const stderrMarker = "; it said:"

// absPath is an absolute file path inside a message: a slash after a space, a quote, a colon,
// an equals sign or a parenthesis, up to the next space, quote, comma, semicolon or parenthesis.
var absPath = regexp.MustCompile(`(^|[\s"'(=:])/[^\s"',;)]+`)

// scrub removes file paths and worker stderr from a message meant for a caller.
func scrub(msg string) string {
	if i := strings.Index(msg, stderrMarker); i >= 0 {
		msg = msg[:i] + " (the worker's output is in the agent's log)"
	}
	if !mayHoldPath(msg) {
		return msg // the common case, answered without the expression: a refusal flood pays for every one
	}
	return absPath.ReplaceAllString(msg, "${1}<path>")
}

// mayHoldPath reports whether msg has a slash where absPath could match one: at its start, or
// after one of the characters absPath accepts before a path.
func mayHoldPath(msg string) bool {
	for i := strings.IndexByte(msg, '/'); i >= 0; {
		if i == 0 || strings.IndexByte(" \t\n\r\f\v\"'(=:", msg[i-1]) >= 0 {
			return true
		}
		next := strings.IndexByte(msg[i+1:], '/')
		if next < 0 {
			return false
		}
		i += 1 + next
	}
	return false
}

// defaultRetryAfter is what a 503 or 429 that knows no better tells a client to wait: the
// refusals it answers (engine_crashed, lane_retired, node_paused, backend_unavailable,
// auth_unavailable, ...) end when something else happens, not at a time the agent can
// predict, and a second is the shortest wait Retry-After can say.
const defaultRetryAfter = time.Second

func writeError(w http.ResponseWriter, e *apiError) {
	d := errorDetail{Message: e.message, Type: "server_error", Code: e.code}
	if e.status < 500 {
		d.Type = "invalid_request_error"
	}
	if e.param != "" {
		d.Param = &e.param
	}
	if e.status == http.StatusServiceUnavailable || e.status == http.StatusTooManyRequests {
		// Every 503 and 429 says when to come back: the time the refusal knows
		// (shape_compiling's predicted compile, overloaded's), else defaultRetryAfter.
		retry := e.retryAfter
		if retry <= 0 {
			retry = defaultRetryAfter
		}
		ms := retry.Milliseconds()
		d.RetryAfterMs = &ms
		// Retry-After is whole seconds, rounded up so a client never comes back early.
		w.Header().Set("Retry-After", strconv.FormatInt(int64((retry+time.Second-1)/time.Second), 10))
	}
	w.Header().Set("X-Synapse-Error-Code", e.code)
	writeJSON(w, e.status, errorBody{Error: d})
}
