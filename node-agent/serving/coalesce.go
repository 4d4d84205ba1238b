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

package serving

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// Calls on one shape share its worker's exchanges. A worker runs one exchange at a time (its
// stream is held for a whole request and reply), so the calls that come while one runs would
// wait for it anyway: they wait together, and the next exchange carries them all, within the
// lane's bounds on one exchange (MaxExchangeSequences, exchangeBytes). A call that finds its
// shape idle runs at once, alone: nothing waits to gather a batch. Each call still holds its
// own lease on the shape, one at a time, from before its part is sent until its reply is
// placed; a batch runs on its first call's lease, and its reply is read by the call that sent
// it however its other calls' callers fare, as a call's own reply is.

// shapeKey names a shape of a lane's worker generation: only parts on one stream share it.
type shapeKey struct {
	rung int
	gen  int64
}

// combiner is a shape's exchanges in turn: whether one runs, and the parts waiting for the next.
type combiner struct {
	running bool
	queue   []*part
}

// part is one call's group on its lease, waiting to be sent, sent, or answered.
type part struct {
	requestID string
	g         group
	lease     Lease
	res       *Result
	deadline  time.Time
	cancelled <-chan struct{}
	// err is the part's outcome, set before done is closed (or by the part's own lead).
	err error
	// lead hands a waiting part the next batch, which it heads and sends; done says that its
	// outcome is set. A waiting part gets exactly one of them.
	lead chan []*part
	done chan struct{}
	// alone: the part goes in an exchange of its own (a shared one refused its input).
	alone bool
}

// exchange runs p's group on its lease, alone or with the parts waiting on the same shape, and
// returns its outcome; its outputs are placed in p.res.
func (s *Server) exchange(base context.Context, l *laneState, p *part) error {
	k := shapeKey{rung: p.g.rung, gen: p.lease.Generation()}
	l.cmu.Lock()
	c := l.shapes[k]
	if c == nil {
		c = &combiner{}
		l.shapes[k] = c
	}
	if !c.running {
		c.running = true
		l.cmu.Unlock()
		s.lead(base, l, k, c, []*part{p})
		return p.err
	}
	p.lead, p.done = make(chan []*part, 1), make(chan struct{})
	c.queue = append(c.queue, p)
	l.cmu.Unlock()
	select {
	case <-p.done:
	case batch := <-p.lead:
		s.lead(base, l, k, c, batch)
	}
	return p.err
}

// lead sends batch, headed by the caller's own part, then hands the parts that waited meanwhile
// to the head of the next batch, and lets this batch's other parts go.
func (s *Server) lead(base context.Context, l *laneState, k shapeKey, c *combiner, batch []*part) {
	again, faulted := s.send(base, l, s.sendable(l, batch))
	if len(again) > 0 && again[0] == batch[0] {
		// The leader's own part was refused with others: it goes again at once, alone; the
		// others go again each in its own exchange, led by its own call, ahead of the queue.
		again = again[1:]
		_, faulted = s.send(base, l, s.sendable(l, batch[:1]))
	}
	var dropped []*part
	l.cmu.Lock()
	if faulted {
		// The worker generation faulted: its stream is broken, and it is recovered once the
		// faulting lease goes. What waits for it is answered without being sent.
		dropped, c.queue, again = append(again, c.queue...), nil, nil
	}
	for _, q := range again {
		q.alone = true
	}
	c.queue = append(again, c.queue...)
	next := take(l.Lane, c)
	if next == nil {
		c.running = false
		delete(l.shapes, k)
	}
	l.cmu.Unlock()
	if next != nil {
		next[0].lead <- next
	}
	// Every part of the batch but its leader and those queued again is answered now, and so is
	// every part dropped.
	for _, q := range dropped {
		q.err = refusal.New(refusal.EngineCrashed, l.Name, "worker generation %d failed in an earlier exchange of rung %d; this call's part was not sent", k.gen, k.rung)
	}
	for _, q := range batch[1:] {
		if !slices.Contains(again, q) && !slices.Contains(dropped, q) {
			close(q.done)
		}
	}
	for _, q := range dropped {
		close(q.done)
	}
}

// sendable is the parts of batch still to send: a part whose deadline passed, or whose caller
// went away, while it waited is answered so and not sent: no later bucket starts after either.
func (s *Server) sendable(l *laneState, batch []*part) []*part {
	send := make([]*part, 0, len(batch))
	for _, q := range batch {
		switch {
		case s.expired(q.deadline):
			q.err = refusal.New(refusal.DeadlineExceeded, l.Name, "the deadline passed before bucket %d started", q.g.rung)
		case isDone(q.cancelled):
			q.err = context.Canceled
		default:
			send = append(send, q)
		}
	}
	return send
}

// take removes from c's queue the parts of the next exchange: those first in line that fit
// its bounds together (the first always does: its group was split to fit), and only the first
// if it, or the next, goes alone.
func take(l Lane, c *combiner) []*part {
	if len(c.queue) == 0 {
		return nil
	}
	n, seqs, reqBytes, replyBytes := 0, 0, 0, 0
	for _, q := range c.queue {
		req, reply := groupBytes(l, q.g)
		if n > 0 && (q.alone || c.queue[0].alone || seqs+len(q.g.index) > l.MaxExchangeSequences ||
			reqBytes+req > exchangeBytes || replyBytes+reply > exchangeBytes) {
			break
		}
		n, seqs, reqBytes, replyBytes = n+1, seqs+len(q.g.index), reqBytes+req, replyBytes+reply
	}
	next := slices.Clone(c.queue[:n])
	c.queue = slices.Delete(c.queue, 0, n)
	return next
}

// send runs one exchange for parts on the first one's lease and places each part's outputs. A
// fault, or a malformed reply, fails every part, and the worker is recovered once, after the
// lease goes (faulted). A worker's refusal fails every part too, but one: a shared exchange
// whose input the worker refused, which it does before it runs any sequence, is not laid on
// every call in it, since one call's input may be what it refused: those parts are returned to
// be sent again, each alone (again), and get their own answers. Nothing that may have run is
// sent again: any other refusal (the device's) may come after some sequences ran.
func (s *Server) send(base context.Context, l *laneState, parts []*part) (again []*part, faulted bool) {
	if len(parts) == 0 {
		return nil, false
	}
	payload := parts[0].g.payload
	if len(parts) > 1 {
		payload = &pb.Execute{Task: payload.Task}
		for _, q := range parts {
			payload.Sequences = append(payload.Sequences, q.g.payload.Sequences...)
		}
	}
	raw, _ := proto.Marshal(payload)
	ctx := base
	if len(parts) > 1 {
		// The timeline names every request the exchange carries, not its leader's alone.
		riders := make([]string, 0, len(parts)-1)
		for _, q := range parts[1:] {
			riders = append(riders, q.requestID)
		}
		ctx = residency.WithRiders(ctx, riders)
	}
	// The exchange is never cut short by a caller: the reply drains before any lease goes.
	reply, err := parts[0].lease.Exchange(ctx, raw)
	var refused *residency.WorkerError
	switch {
	case errors.As(err, &refused):
		if len(parts) > 1 && protocol.InputRefusal(refused.Code) {
			return parts, false
		}
		err = workerRefusal(l.Name, refused)
	case err != nil:
		faulted = true
	default:
		if err = place(l, parts, reply); err != nil {
			parts[0].lease.Fault(err)
			err, faulted = refusal.New(refusal.EngineCrashed, l.Name, "%v", err), true
		}
	}
	for _, q := range parts {
		q.err = err
	}
	return nil, faulted
}

// workerRefusal is the answer to a worker's refusal of an exchange: the caller's input, or the
// lane that cannot run it now.
func workerRefusal(lane string, e *residency.WorkerError) error {
	switch e.Code {
	case protocol.CodeInvalidInput:
		return refusal.New(refusal.InvalidRequest, lane, "the worker refused the input: %s", e.Message)
	case protocol.CodeUnsupportedShape:
		return refusal.New(refusal.UnsupportedShape, lane, "the worker refused the input: %s", e.Message)
	case string(refusal.ResourcesExhausted):
		return refusal.New(refusal.ResourcesExhausted, lane, "%s", e.Message)
	}
	return refusal.New(refusal.WorkerRefused, lane, "the worker refused the exchange: %s: %s", e.Code, e.Message)
}

// place checks a reply against the parts it answers and places each part's outputs in its
// input order. A reply of the wrong size or with non-finite numbers is malformed: nothing of it
// is placed, and the worker is recovered.
func place(l *laneState, parts []*part, raw []byte) error {
	reply := &pb.Reply{}
	if err := proto.Unmarshal(raw, reply); err != nil {
		return fmt.Errorf("malformed reply: %v", err)
	}
	n := 0
	for _, q := range parts {
		n += len(q.g.index)
	}
	if l.Task == "embed" {
		if len(reply.Vectors) != n {
			return fmt.Errorf("malformed reply: %d vectors for %d sequences", len(reply.Vectors), n)
		}
		for _, v := range reply.Vectors {
			if len(v.Values) != l.Dimensions {
				return fmt.Errorf("malformed reply: a vector of %d dimensions, want %d", len(v.Values), l.Dimensions)
			}
			if slices.ContainsFunc(v.Values, func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }) {
				return fmt.Errorf("malformed reply: a vector holds a non-finite value")
			}
		}
		off := 0
		for _, q := range parts {
			for i, at := range q.g.index {
				q.res.Vectors[at] = reply.Vectors[off+i].Values
			}
			off += len(q.g.index)
		}
		return nil
	}
	if len(reply.Scores) != n {
		return fmt.Errorf("malformed reply: %d scores for %d sequences", len(reply.Scores), n)
	}
	if slices.ContainsFunc(reply.Scores, func(x float32) bool { return math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) }) {
		return fmt.Errorf("malformed reply: a non-finite score")
	}
	off := 0
	for _, q := range parts {
		for i, at := range q.g.index {
			q.res.Scores[at] = reply.Scores[off+i]
		}
		off += len(q.g.index)
	}
	return nil
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
