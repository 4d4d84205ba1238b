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

// Package serving runs composed embed and rerank calls on a lane: it refuses what cannot run
// before any inference, groups the sequences by the smallest worker-reported rung that fits,
// admits and leases one group's shape at a time, validates each reply, and restores the input
// order. A detached task owns the lease, the execution permit, the catalog guard and the
// in-flight count: a caller that goes away does not cut an exchange short (which would restart
// a healthy worker); the task drains the reply and then lets go. One absolute deadline bounds
// admission and exchanges, and no later bucket starts after it.
package serving

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// Lease is a held shape (the supervisor's *Lease).
type Lease interface {
	Exchange(ctx context.Context, payload []byte) ([]byte, error)
	Fault(err error)
	Release()
	Rung() int
	Generation() int64
}

// Acquirer leases shapes (the supervisor).
type Acquirer interface {
	Acquire(ctx context.Context, lane string, rung int, deadline time.Time) (Lease, error)
}

// Lane is what serving knows of a loaded lane.
type Lane struct {
	Name string
	// Task is "embed" or "rerank".
	Task string
	// Rungs are the worker-reported buckets, ascending; Ceiling the longest sequence accepted.
	Rungs      []int
	Ceiling    int
	Dimensions int
	// MaxInflight bounds the calls running at once (execution permits); 0 means 64.
	MaxInflight int
	// MaxQueued bounds the calls waiting for a permit; past it a call is refused overloaded at
	// once. 0 means DefaultMaxQueued; negative, none may wait.
	MaxQueued int
	// MaxExchangeSequences bounds the sequences of one worker exchange; 0 means
	// DefaultMaxExchangeSequences. A group larger than it, or whose request or reply would not
	// fit in a frame, is split into several exchanges of its rung, each under its own lease.
	MaxExchangeSequences int
}

// DefaultMaxQueued is a lane's bound on waiting calls when it sets none.
const DefaultMaxQueued = 256

// DefaultMaxExchangeSequences is a lane's bound on one exchange's sequences when it sets none.
const DefaultMaxExchangeSequences = 64

// exchangeBytes bounds the estimated size of one exchange's request and of its reply: half the
// frame limit, so that the framing and the fields not counted below never take a valid call
// past it (a frame over the limit is a protocol fault, which would restart a healthy worker).
const exchangeBytes = protocol.DefaultMaxFrame / 2

// OverloadRetryAfter is what an overloaded answer tells a client to wait.
const OverloadRetryAfter = time.Second

// Server runs calls on lanes.
type Server struct {
	acq Acquirer
	clk clock.Clock

	mu    sync.Mutex
	lanes map[string]*laneState
}

type laneState struct {
	Lane
	// stopped: the lane is being unloaded; new calls are refused lane_retired.
	stopped bool
	permits chan struct{}
	// waiting counts the calls waiting for a permit (under Server.mu).
	waiting int
	// guard counts the calls using the lane, so it is not unloaded under them.
	guard sync.WaitGroup
	// inflight counts tasks that still own something; for metrics and tests.
	inflight int
	// hold is a moving average of how long a call holds its permit (under Server.mu): a call
	// that would wait in the queue, and then run, past its deadline is refused at once.
	hold time.Duration
	// shapes are the lane's shapes with an exchange running, and the parts waiting for the
	// next (under cmu; coalesce.go).
	cmu    sync.Mutex
	shapes map[shapeKey]*combiner
}

// holdWeight is the weight of a new sample in laneState.hold: about the last 8 calls count.
const holdWeight = 8

// New returns a server leasing from acq.
func New(acq Acquirer, clk clock.Clock) *Server {
	return &Server{acq: acq, clk: clk, lanes: map[string]*laneState{}}
}

// AddLane makes a lane servable.
func (s *Server) AddLane(l Lane) {
	if l.MaxInflight == 0 {
		l.MaxInflight = 64
	}
	if l.MaxQueued == 0 {
		l.MaxQueued = DefaultMaxQueued
	}
	if l.MaxExchangeSequences == 0 {
		l.MaxExchangeSequences = DefaultMaxExchangeSequences
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lanes[l.Name] = &laneState{Lane: l, permits: make(chan struct{}, l.MaxInflight), shapes: map[shapeKey]*combiner{}}
}

// StopLane refuses new calls on a lane (lane_retired) at once, without waiting for the running
// ones: the agent stops the lane here, then retires it in the supervisor, which answers the
// calls waiting for an admission lane_retired and drains those in an exchange.
func (s *Server) StopLane(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lanes[name]; l != nil {
		l.stopped = true
	}
}

// RemoveLane stops new calls on a lane and waits, until ctx ends, for the running ones to let
// go. A call that is still running when ctx ends keeps what it holds until it finishes.
func (s *Server) RemoveLane(ctx context.Context, name string) error {
	s.mu.Lock()
	l := s.lanes[name]
	delete(s.lanes, name)
	if l != nil {
		l.stopped = true
	}
	s.mu.Unlock()
	if l == nil {
		return nil
	}
	done := make(chan struct{})
	go func() { l.guard.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("removing lane %s: %d calls still running: %w", name, s.inflightOf(l), ctx.Err())
	}
}

func (s *Server) inflightOf(l *laneState) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return l.inflight
}

// Inflight reports how many tasks of lane still own resources.
func (s *Server) Inflight(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.lanes[name]; l != nil {
		return l.inflight
	}
	return 0
}

// Result is a finished call.
type Result struct {
	// Vectors (embed) or Scores (rerank), in input order.
	Vectors [][]float32
	Scores  []float32
	// Buckets are the rungs the call ran on, ascending; Generations the worker generations.
	Buckets     []int
	Generations []int64
}

// group is the sequences of one bucket and their input positions.
type group struct {
	rung    int
	index   []int
	payload *pb.Execute
}

// Run runs a composed call: each sequence is the token ids of one input (for rerank: query,
// separator, document). It refuses, before any inference, an empty call, an empty sequence and
// a sequence over the lane's ceiling.
func (s *Server) Run(ctx context.Context, lane, task string, sequences [][]uint32, deadline time.Time) (*Result, error) {
	s.mu.Lock()
	l := s.lanes[lane]
	stopped := l != nil && l.stopped
	if l != nil && !stopped {
		l.guard.Add(1)
	}
	s.mu.Unlock()
	if l == nil {
		return nil, refusal.New(refusal.UnknownLane, lane, "no such lane is served on this node")
	}
	if stopped {
		return nil, refusal.New(refusal.LaneRetired, lane, "the lane is being unloaded from this node")
	}
	groups, err := plan(l.Lane, task, sequences)
	if err != nil {
		l.guard.Done()
		return nil, err
	}

	// The execution permit bounds concurrent calls; waiting for one ends at the deadline.
	if s.expired(deadline) {
		l.guard.Done()
		return nil, refusal.New(refusal.DeadlineExceeded, lane, "the request's deadline passed before it could run")
	}
	if err := s.permit(ctx, l, deadline); err != nil {
		l.guard.Done()
		return nil, err
	}
	s.mu.Lock()
	l.inflight++
	s.mu.Unlock()

	done := make(chan taskResult, 1)
	go s.task(ctx, l, groups, len(sequences), deadline, done)
	// The caller waits at most until its deadline, even for a worker that never answers (which
	// only the worker's own call bound, far longer, ends).
	var expired <-chan time.Time
	if !deadline.IsZero() {
		timer := s.clk.NewTimer(deadline.Sub(s.clk.Now()))
		defer timer.Stop()
		expired = timer.C()
	}
	select {
	case r := <-done:
		return r.res, r.err
	case <-ctx.Done():
		// The task keeps its lease and permit until its reply has drained.
		return nil, s.ctxErr(ctx, lane, deadline)
	case <-expired:
		select {
		case r := <-done: // answered as the deadline came: the task judged it
			return r.res, r.err
		default:
		}
		// As for a caller gone: the task keeps its lease and permit until the reply drains,
		// and the reply is discarded.
		return nil, refusal.New(refusal.DeadlineExceeded, lane, "the deadline passed while the call ran; its reply, when it comes, is discarded")
	}
}

// permit takes an execution permit: at once if one is free, else after waiting in the lane's
// bounded queue; a call that finds the queue full is refused overloaded at once, and a wait ends
// at the deadline or when the caller goes away.
func (s *Server) permit(ctx context.Context, l *laneState, deadline time.Time) error {
	select {
	case l.permits <- struct{}{}:
		return nil
	default:
	}
	s.mu.Lock()
	if l.waiting >= max(l.MaxQueued, 0) {
		s.mu.Unlock()
		r := refusal.New(refusal.Overloaded, l.Name, "%d calls are running and %d waiting, the lane's bounds; retry later", l.MaxInflight, max(l.MaxQueued, 0))
		r.RetryAfter = OverloadRetryAfter
		return r
	}
	// A call that would get its permit only after the calls ahead of it, and then run, past its
	// deadline is refused now rather than answered deadline_exceeded after the wait: the
	// client can retry (elsewhere) while it still has time.
	// The permits come free one after another, a hold apart among MaxInflight: the calls
	// ahead and this one wait about (waiting+1)/MaxInflight holds.
	if remaining := deadline.Sub(s.clk.Now()); !deadline.IsZero() && l.hold > 0 {
		wait := time.Duration(l.waiting+1) * l.hold / time.Duration(l.MaxInflight)
		if wait+l.hold > remaining {
			s.mu.Unlock()
			r := refusal.New(refusal.Overloaded, l.Name, "a call waits about %s for a permit and runs about %s, past the request's deadline; retry later",
				wait.Round(time.Millisecond), l.hold.Round(time.Millisecond))
			// Retry once the calls ahead have run, but never later than a deadline's length.
			r.RetryAfter = min(max(OverloadRetryAfter, wait), max(OverloadRetryAfter, remaining))
			return r
		}
	}
	l.waiting++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		l.waiting--
		s.mu.Unlock()
	}()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		timer := s.clk.NewTimer(deadline.Sub(s.clk.Now()))
		defer timer.Stop()
		expired = timer.C()
	}
	select {
	case l.permits <- struct{}{}:
		return nil
	case <-ctx.Done():
		return s.ctxErr(ctx, l.Name, deadline)
	case <-expired:
		return refusal.New(refusal.DeadlineExceeded, l.Name, "the request's deadline passed while it waited for an execution permit")
	}
}

func (s *Server) ctxErr(ctx context.Context, lane string, deadline time.Time) error {
	if !deadline.IsZero() && !s.clk.Now().Before(deadline) {
		return refusal.New(refusal.DeadlineExceeded, lane, "the request's deadline passed")
	}
	return ctx.Err()
}

type taskResult struct {
	res *Result
	err error
}

// task is the detached owner of a call's resources: one lease at a time, bucket by bucket.
func (s *Server) task(caller context.Context, l *laneState, groups []group, n int, deadline time.Time, done chan<- taskResult) {
	// The task keeps the caller's values (its request id) but not its cancellation; only the
	// admission waits end when the caller goes away.
	base, cancelled := context.WithoutCancel(caller), caller.Done()
	start := s.clk.Now()
	defer func() {
		held := s.clk.Since(start)
		<-l.permits
		s.mu.Lock()
		l.inflight--
		if l.hold == 0 {
			l.hold = held
		} else {
			l.hold += (held - l.hold) / holdWeight
		}
		s.mu.Unlock()
		l.guard.Done()
	}()
	res := &Result{}
	if l.Task == "embed" {
		res.Vectors = make([][]float32, n)
	} else {
		res.Scores = make([]float32, n)
	}
	// Admission waits end at the deadline or when the caller goes away.
	actx, cancel := context.WithCancel(base)
	defer cancel()
	stop := context.AfterFunc(caller, cancel)
	defer stop()
	for _, g := range groups {
		if s.expired(deadline) {
			done <- taskResult{err: refusal.New(refusal.DeadlineExceeded, l.Name, "the deadline passed before bucket %d started", g.rung)}
			return
		}
		select {
		case <-cancelled:
			done <- taskResult{err: context.Canceled}
			return
		default:
		}
		lease, err := s.acq.Acquire(actx, l.Name, g.rung, deadline)
		if err != nil {
			done <- taskResult{err: err}
			return
		}
		if s.expired(deadline) {
			// A cold admission that finished after the deadline: the shape stays resident for
			// the next request, but this one runs no inference.
			lease.Release()
			done <- taskResult{err: refusal.New(refusal.DeadlineExceeded, l.Name, "bucket %d was admitted after the deadline; nothing ran", g.rung)}
			return
		}
		// The exchange is never cut short by the caller: the reply drains before the lease goes.
		err = s.exchange(base, l, &part{requestID: residency.RequestID(base), g: g, lease: lease, res: res, deadline: deadline, cancelled: cancelled})
		gen := lease.Generation()
		lease.Release()
		if err != nil {
			done <- taskResult{err: err}
			return
		}
		if s.expired(deadline) {
			done <- taskResult{err: refusal.New(refusal.DeadlineExceeded, l.Name, "the reply of bucket %d came after the deadline and was discarded", g.rung)}
			return
		}
		res.Buckets = append(res.Buckets, g.rung)
		res.Generations = append(res.Generations, gen)
	}
	done <- taskResult{res: res}
}

func (s *Server) expired(deadline time.Time) bool {
	return !deadline.IsZero() && !s.clk.Now().Before(deadline)
}

// plan refuses what cannot run and groups the sequences by the smallest rung that fits.
func plan(l Lane, task string, sequences [][]uint32) ([]group, error) {
	if task != l.Task {
		return nil, refusal.New(refusal.InvalidRequest, l.Name, "the lane serves %s, not %s", l.Task, task)
	}
	if len(sequences) == 0 {
		return nil, refusal.New(refusal.UnsupportedShape, l.Name, "the call has no input")
	}
	byRung := map[int]*group{}
	for i, seq := range sequences {
		if len(seq) == 0 {
			return nil, refusal.New(refusal.UnsupportedShape, l.Name, "input %d is empty", i)
		}
		if len(seq) > l.Ceiling {
			return nil, refusal.New(refusal.UnsupportedShape, l.Name, "input %d has %d tokens, over the lane's ceiling of %d; it is not truncated", i, len(seq), l.Ceiling)
		}
		j := slices.IndexFunc(l.Rungs, func(r int) bool { return r >= len(seq) })
		if j < 0 {
			return nil, refusal.New(refusal.UnsupportedShape, l.Name, "input %d has %d tokens, longer than the largest rung %d", i, len(seq), l.Rungs[len(l.Rungs)-1])
		}
		r := l.Rungs[j]
		g := byRung[r]
		if g == nil {
			g = &group{rung: r, payload: &pb.Execute{Task: task}}
			byRung[r] = g
		}
		g.index = append(g.index, i)
		g.payload.Sequences = append(g.payload.Sequences, &pb.Sequence{TokenIds: seq})
	}
	out := make([]group, 0, len(byRung))
	for _, g := range byRung {
		out = append(out, split(l, *g)...)
	}
	slices.SortStableFunc(out, func(a, b group) int { return a.rung - b.rung })
	return out, nil
}

// split cuts a rung's group into exchanges of at most the lane's sequences each, whose request
// and reply are each estimated under exchangeBytes: a token id costs at most 5 bytes in the
// request, an embedding dims float32s and a score one in the reply, and each sequence or vector
// a few bytes of framing.
func split(l Lane, g group) []group {
	perReply := replyBytes(l)
	var out []group
	cur := group{rung: g.rung, payload: &pb.Execute{Task: g.payload.Task}}
	reqSum, replySum := 0, 0
	for k, seq := range g.payload.Sequences {
		req := requestBytes(seq)
		if len(cur.index) > 0 && (len(cur.index) >= l.MaxExchangeSequences || reqSum+req > exchangeBytes || replySum+perReply > exchangeBytes) {
			out = append(out, cur)
			cur = group{rung: g.rung, payload: &pb.Execute{Task: g.payload.Task}}
			reqSum, replySum = 0, 0
		}
		cur.index = append(cur.index, g.index[k])
		cur.payload.Sequences = append(cur.payload.Sequences, seq)
		reqSum, replySum = reqSum+req, replySum+perReply
	}
	return append(out, cur)
}

// requestBytes is a sequence's estimated size in an exchange's request, replyBytes its
// output's in the reply.
func requestBytes(seq *pb.Sequence) int { return 5*len(seq.TokenIds) + 8 }

func replyBytes(l Lane) int {
	if l.Task == "embed" {
		return 4*l.Dimensions + 8
	}
	return 8 // a score and its framing
}

// groupBytes is a group's estimated size in an exchange's request and in its reply.
func groupBytes(l Lane, g group) (req, reply int) {
	for _, seq := range g.payload.Sequences {
		req += requestBytes(seq)
	}
	return req, len(g.index) * replyBytes(l)
}
