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
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/serving"
)

// ranOn says where a call ran: in the response body, and in headers.
type ranOn struct {
	Lane              string  `json:"lane"`
	Node              string  `json:"node"`
	Device            string  `json:"device"`
	Buckets           []int   `json:"buckets"`
	WorkerGenerations []int64 `json:"worker_generations"`
	RoutingReason     string  `json:"routing_reason"`
	// VectorSpace is the vector space of the lane's identity: vectors of different spaces must
	// never be compared.
	VectorSpace string `json:"vector_space"`
}

// call is one request on its way through the API.
type call struct {
	s        *Server
	w        http.ResponseWriter
	r        *http.Request
	endpoint string
	start    time.Time
	lane     string // namespace/name, once resolved
	reason   string // why it runs there
	tokens   int
	bucket   string // the largest bucket the call ran on
	// working: the call holds a work slot; bulk: one of the bulk calls' share (its body is
	// large), held from before its body is read until it runs or ends.
	working, bulk bool
}

func (s *Server) begin(w http.ResponseWriter, r *http.Request, endpoint string) *call {
	return &call{s: s, w: w, r: r, endpoint: endpoint, start: s.arrival(r.Context())}
}

// decode reads a JSON body, bounded in size, into v (see read). Unknown fields are allowed:
// clients send some.
func (c *call) decode(v any) error {
	body, err := c.read()
	if err != nil {
		return err
	}
	return unmarshalBody(body, v)
}

// decodeDeferring is decode, but for the value of the body's top-level key field, which is
// returned as it is, unread and unchecked (deferValue): the caller refuses it for its size if
// it is too large, then checks it (checkDeferred) before it reads it. Nothing of it is parsed
// before the lane's bounds are known. deferred is false when the body was decoded whole (the
// value, in v, is checked already).
func (c *call) decodeDeferring(v any, field string) (value []byte, deferred bool, err error) {
	body, err := c.read()
	if err != nil {
		return nil, false, err
	}
	if rest, value, ok := deferValue(body, field); ok {
		return value, true, unmarshalBody(rest, v)
	}
	return nil, false, unmarshalBody(body, v)
}

// read reads the body, bounded in size, then takes a work slot for the call (see WorkLimits):
// the body is read without one (a slow client holds no slot), the parsing, the tokenising and
// the routing that follow run with one, until the call runs on its lane. The body is read once
// into a buffer the call owns, sized by its Content-Length when it gives one: the inputs
// (rawJSON, or a deferred value) are read from that buffer later, never copied.
func (c *call) read() ([]byte, error) {
	// A large body is read only with one of the bulk calls' share held (see WorkLimits), and
	// only for a caller some lane of the node admits (mayCallSome).
	if c.s.work.bulkBody(c.r.ContentLength) && c.r.ContentLength <= MaxBodyBytes {
		if err := c.s.mayCallSome(c); err != nil {
			return nil, err
		}
		if err := c.s.work.enterBulk(c.r.Context()); err != nil {
			return nil, err
		}
		c.bulk = true
	}
	body, err := readBody(c.w, c.r)
	if err != nil {
		return nil, err
	}
	if err := c.s.work.enter(c.r.Context()); err != nil {
		return nil, err
	}
	c.working = true
	return body, nil
}

// checkDeferred checks a value decodeDeferring deferred, as decode would have checked it.
func checkDeferred(value []byte, param string) error {
	if !json.Valid(value) {
		return badRequest("invalid_json", param, "the body is not valid JSON: the value of "+param+" is not")
	}
	return nil
}

// unmarshalBody decodes a body into v, answering what is wrong with it.
func unmarshalBody(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) && strings.Contains(syntax.Error(), "after top-level value") {
			return badRequest("invalid_json", "", "the body holds more than one JSON value")
		}
		return badRequest("invalid_json", "", "the body is not valid JSON: "+err.Error())
	}
	return nil
}

// rest gives back the call's work slot, if it holds one.
func (c *call) rest() {
	if c.working {
		c.working = false
		c.s.work.leave()
	}
}

// release gives back everything the call holds of the work gate: once it runs on its lane, or
// ends.
func (c *call) release() {
	c.rest()
	if c.bulk {
		c.bulk = false
		c.s.work.leaveBulk()
	}
}

// readBody reads the request's body, refusing one over MaxBodyBytes with 413.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	tooBig := &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large", message: fmt.Sprintf("the body is over %d bytes", MaxBodyBytes)}
	if r.ContentLength > MaxBodyBytes {
		return nil, tooBig
	}
	size := 512
	if r.ContentLength > 0 {
		size = int(r.ContentLength) + 1 // one more, to see the end without growing
	}
	buf, body := make([]byte, 0, size), http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	for {
		if len(buf) == cap(buf) {
			// No Content-Length: grow by doubling, never past the bound and one byte more (to see
			// a body over it). Append's own growth made a 32 MiB body's last buffer 40 MiB beside
			// the 32 it copied from; a chunked 33 MiB body every few seconds kept the agent's
			// memory near its limit under make load.
			if cap(buf) > MaxBodyBytes {
				return nil, tooBig
			}
			size := 2 * cap(buf)
			if size >= MaxBodyBytes {
				size = MaxBodyBytes + 1
			}
			grown := make([]byte, len(buf), size)
			buf = grown[:copy(grown, buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case err == io.EOF:
			return buf, nil
		case err != nil:
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				return nil, tooBig
			}
			return nil, badRequest("invalid_json", "", "the body could not be read: "+err.Error())
		}
	}
}

// candidates resolves the request's model to the lanes that may serve it.
func (s *Server) candidates(c *call, model, task string) ([]Lane, bool, error) {
	if model == "" {
		return nil, false, badRequest("invalid_request", "model", "model is required: the lane, as <namespace>/<lane> or a lane name unique on this node, or a model the node serves")
	}
	lanes, byName, err := s.cfg.Catalog.Lookup(model)
	if err != nil {
		return nil, false, err
	}
	// Authorizing may ask the API server (a decision not cached yet): the call waits for it
	// without its work slot, which another call's parsing can use meanwhile, and takes one
	// again to tokenise.
	working := c.working
	c.rest()
	if lanes, err = s.authorizeLanes(c, model, lanes, byName); err != nil {
		return nil, false, err
	}
	if working {
		if err := s.work.enter(c.r.Context()); err != nil {
			return nil, false, err
		}
		c.working = true
	}
	if byName {
		c.lane = lanes[0].Namespace + "/" + lanes[0].Name
		if lanes[0].Task != task {
			return nil, false, badRequest(string(refusal.InvalidRequest), "model", fmt.Sprintf("lane %s serves %s, not %s", c.lane, lanes[0].Task, task))
		}
	}
	return lanes, byName, nil
}

// route decides the call's lane, and its tokens by that lane's tokenizer, before anything
// runs, and records why.
func (s *Server) route(c *call, model, task string, lanes []Lane, byName bool, read func(*reader) ([][]uint32, error)) (Lane, [][]uint32, error) {
	chosen, reason, err := plan(model, task, lanes, byName, func(l Lane) ([][]uint32, error) {
		// Tokenising counts against the lane's deadline, and ends with it (what is left of it
		// by the API's clock).
		var (
			ctx    context.Context
			cancel context.CancelFunc
		)
		if d := c.deadline(l); !d.IsZero() {
			ctx, cancel = context.WithTimeout(c.r.Context(), d.Sub(s.cfg.Clock.Now()))
		} else {
			ctx, cancel = context.WithCancel(c.r.Context())
		}
		defer cancel()
		return read(newReader(ctx, l))
	})
	if err != nil {
		return Lane{}, nil, err
	}
	lane := chosen.lane
	c.lane, c.reason = lane.Namespace+"/"+lane.Name, reason
	s.metrics.routing.WithLabelValues(reason).Inc()
	return lane, chosen.sequences, nil
}

// run runs the sequences on the lane, within the lane's deadline from the request's arrival.
func (c *call) run(lane Lane, task string, sequences [][]uint32) (*serving.Result, error) {
	for _, seq := range sequences {
		c.tokens += len(seq)
	}
	// Waiting for the lane and the worker costs no CPU of the API's: the slot goes to another
	// call. Encoding the answer needs none: the lane's permits bound the calls that get one.
	c.release()
	deadline := c.deadline(lane)
	g := c.s.metrics.inflight.WithLabelValues(c.lane)
	g.Inc()
	defer g.Dec()
	return c.s.cfg.Runner.Run(c.r.Context(), lane.Key, task, sequences, deadline)
}

// deadline is the call's absolute deadline on lane, from its arrival (zero: none).
func (c *call) deadline(lane Lane) time.Time {
	if lane.Deadline <= 0 {
		return time.Time{}
	}
	return c.start.Add(lane.Deadline)
}

func (c *call) ranOn(lane Lane, res *serving.Result) ranOn {
	out := ranOn{Lane: c.lane, Node: c.s.cfg.Node, Device: lane.Device, Buckets: res.Buckets,
		WorkerGenerations: res.Generations, RoutingReason: c.reason, VectorSpace: lane.VectorSpace}
	if len(res.Buckets) > 0 {
		c.bucket = strconv.Itoa(res.Buckets[len(res.Buckets)-1])
	}
	h := c.w.Header()
	h.Set("X-Synapse-Lane", out.Lane)
	h.Set("X-Synapse-Node", out.Node)
	h.Set("X-Synapse-Device", out.Device)
	// The vector space the answer's vectors belong to: a client can tell a lane that moved to
	// another space, and never compares vectors across one.
	h.Set("X-Synapse-Vector-Space", lane.VectorSpace)
	h.Set("X-Synapse-Buckets", joinInts(res.Buckets))
	h.Set("X-Synapse-Worker-Generations", joinInts(res.Generations))
	h.Set("X-Synapse-Routing-Reason", c.reason)
	return out
}

func joinInts[T int | int64](v []T) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = strconv.FormatInt(int64(x), 10)
	}
	return strings.Join(s, ",")
}

func (c *call) ok(v any) {
	writeJSON(c.w, http.StatusOK, v)
	c.observe("ok")
}

// answer is ok with an answer that encodes itself.
func (c *call) answer(encode func([]byte) ([]byte, error)) {
	if err := writeAnswer(c.w, http.StatusOK, encode); err != nil {
		c.s.cfg.Log.Info("an answer could not be encoded", "endpoint", c.endpoint, "lane", c.lane, "error", err.Error())
		c.observe("internal_error")
		return
	}
	c.observe("ok")
}

func (c *call) fail(err error) {
	if c.r.Context().Err() != nil && refusal.CodeOf(err) == "" {
		// The client went away; nobody reads an answer.
		c.observe("client_closed")
		return
	}
	e := fromError(err)
	if e.status >= 500 {
		// The caller gets the code and scrubbed words; the log gets everything.
		c.s.cfg.Log.Info("call failed", "endpoint", c.endpoint, "lane", c.lane, "code", e.code, "error", err.Error())
	}
	if c.lane != "" {
		c.w.Header().Set("X-Synapse-Lane", c.lane)
		c.w.Header().Set("X-Synapse-Node", c.s.cfg.Node)
	}
	writeError(c.w, e)
	c.observe(e.code)
}

func (c *call) observe(code string) {
	c.release()
	lane := c.lane
	if lane == "" {
		lane = "none"
	}
	c.s.metrics.requests.WithLabelValues(lane, c.endpoint, code).Inc()
	if code == "ok" {
		c.s.metrics.latency.WithLabelValues(lane, c.endpoint, c.bucket).Observe(c.s.cfg.Clock.Since(c.start).Seconds())
	}
}
