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

package compilequeue

import (
	"fmt"
	"slices"
	"time"
)

const (
	// StartHold is how long a queued compile waits after its arrival before it may start, so
	// that compiles requested together start cheapest first.
	StartHold = 50 * time.Millisecond

	// repriceSlack: an admission predicted as a load that runs past twice its prediction plus
	// this is repriced as a compile, because aned is evidently compiling it.
	repriceSlack = time.Second

	// MinRetryAfter is the least retry time a shape_compiling answer gives: an admission that
	// runs past its prediction is predicted ready "now", and a client told to retry at once
	// would only find it still compiling. The queue promises what the client is told, so a job
	// is never dropped before twice this after a refusal.
	MinRetryAfter = time.Second
)

// Ticket identifies one request waiting for a shape.
type Ticket uint64

// Request asks for a shape that is not resident.
type Request struct {
	Ticket Ticket
	// Owner is the worker generation that will admit the shape.
	Owner  string
	Shape  Shape
	Layers int
	// Cached is true when the worker reported the rung held by aned.
	Cached bool
	// Deadline is the request's absolute deadline; zero means none.
	Deadline time.Time
	// Bound is the request's admission bound (at most 600 s), counted from Since.
	Bound time.Duration
	// Since is when the request began to wait; zero means now. A request the supervisor routes
	// again (after a handoff window closed, say) keeps its first wait's bound.
	Since time.Time
}

// Answer is the queue's answer to a Request.
type Answer struct {
	// Accepted: the request waits for the shape, predicted ready at ReadyAt.
	Accepted bool
	ReadyAt  time.Time
	// RetryAfter is set when the request is refused as shape_compiling: the predicted delay
	// until the shape is ready, at least MinRetryAfter. The compile stays queued, so the retry
	// finds it ready; it is the job's promise, so the job is kept for twice this at least.
	RetryAfter time.Duration
}

// Refusal answers a waiting ticket that can no longer be served in time.
type Refusal struct {
	Ticket Ticket
	Job    *Job
	// DeadlineExceeded: the request's own deadline passed (answered with a deadline error);
	// otherwise its admission bound did and it is answered shape_compiling after RetryAfter.
	DeadlineExceeded bool
	RetryAfter       time.Duration
}

type waiter struct {
	deadline time.Time // zero: none
	boundAt  time.Time
}

// limit is the time by which the waiter needs its shape.
func (w waiter) limit() time.Time {
	if !w.deadline.IsZero() && w.deadline.Before(w.boundAt) {
		return w.deadline
	}
	return w.boundAt
}

// refuse answers a waiter that cannot be served in time: with a deadline error once its own
// deadline has passed, otherwise shape_compiling with the fresh predicted delay, which is the
// job's promise from now on: the seed drops a compile nobody waits for after twice the delay
// it *last* promised, so a refusal that told a client to come back moves the drop time too.
func refuse(now time.Time, j *Job, t Ticket, w waiter, ready time.Time) Refusal {
	r := Refusal{Ticket: t, Job: j, DeadlineExceeded: !w.deadline.IsZero() && !now.Before(w.deadline)}
	if !r.DeadlineExceeded {
		r.RetryAfter = j.promise(now, retryAfter(ready.Sub(now)))
	}
	return r
}

// retryAfter is the delay a shape_compiling answer gives for a shape predicted ready after
// delay.
func retryAfter(delay time.Duration) time.Duration { return max(delay, MinRetryAfter) }

// promise records delay, told to a request now, as the job's last promise and returns it. The
// job is kept for twice that, and never for less than an earlier promise kept it: a later,
// shorter prediction (an acceptance once the queue sped up) does not take back what an
// earlier answer told a client that was sent away to retry.
func (j *Job) promise(now time.Time, delay time.Duration) time.Duration {
	if at := now.Add(2 * delay); at.After(j.dropAt) {
		j.dropAt = at
	}
	return delay
}

// JobID names a job for its whole life: an admission's outcome names the job it finishes, so
// an outcome that arrives late never frees the gate or a reservation of another job.
type JobID uint64

// Job is one shape admission, queued or running. Requests for the same (owner, shape) join it.
type Job struct {
	ID         JobID
	Owner      string
	Shape      Shape
	Layers     int
	Arrival    time.Time
	Prediction Prediction

	// Retried is set on a job put back after the device refused it for resources; its
	// duration is never learned.
	Retried bool
	// Recycled is set on a job put back because its worker asked to be replaced before its
	// compile limit; a replacement that asks again refuses it.
	Recycled bool
	// Background is set on an admission no request asked for (prewarm). Requests may still join
	// it while it runs.
	Background bool

	// parked: the job waits at the head of the queue for an eviction it asked for to be
	// acknowledged (its admission was refused for resources); it is elected once unparked.
	parked bool
	// protecting: insert placed the job behind a queued job with a later start key, because
	// going first would have made one of that job's accepted requests miss its limit. It is
	// the one reason CheckOrder accepts for a job to wait behind a later key.
	protecting bool
	waiters    map[Ticket]waiter
	// dropAt is when the job is dropped if nobody waits for it: twice the delay of the last
	// promise made to a request, accepted or refused, after it was made, and never earlier
	// than an earlier promise said.
	dropAt time.Time
}

// StartKey orders queued jobs: arrival plus predicted cost.
func (j *Job) StartKey() time.Time { return j.Arrival.Add(j.Prediction.Cost) }

// Waiters returns the tickets waiting for the job.
func (j *Job) Waiters() []Ticket {
	out := make([]Ticket, 0, len(j.waiters))
	for t := range j.waiters {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// DropAt is when the job is dropped if nobody waits for it: twice the delay last promised after
// the promise was made, never earlier than an earlier promise said.
func (j *Job) DropAt() time.Time { return j.dropAt }

// Limit is when ticket t, waiting for j, must have its shape: its deadline or its admission
// bound, whichever is first. Zero if t does not wait for j.
func (j *Job) Limit(t Ticket) time.Time {
	w, ok := j.waiters[t]
	if !ok {
		return time.Time{}
	}
	return w.limit()
}

// HasWaiter reports whether ticket t waits for j.
func (j *Job) HasWaiter(t Ticket) bool {
	_, ok := j.waiters[t]
	return ok
}

// Queue is the machine-wide compile queue. It is not safe for concurrent use: one scheduler
// goroutine owns it.
type Queue struct {
	costs  *CostModel
	queued []*Job // in start order
	// running is the compile gate: the one admission that may be on the device. It is the only
	// record of the gate; Finish names the job it frees.
	running   *Job
	startedAt time.Time
	// failed: the running admission failed but still holds the gate (until its worker's exit
	// is confirmed, or heldUntil); new requests for its shape queue a new job instead of
	// joining it, and every prediction counts the gate busy until heldUntil: the exit may come
	// sooner, but nothing the core knows promises it.
	failed     bool
	heldUntil  time.Time
	recovering map[string]bool
	lastID     JobID
}

// New returns an empty queue predicting with costs.
func New(costs *CostModel) *Queue {
	return &Queue{costs: costs, recovering: map[string]bool{}}
}

// Costs returns the queue's cost model.
func (q *Queue) Costs() *CostModel { return q.costs }

// Running returns the running job, or nil.
func (q *Queue) Running() *Job { return q.running }

// Queued returns the queued jobs in start order.
func (q *Queue) Queued() []*Job { return slices.Clone(q.queued) }

// Len counts queued and running jobs.
func (q *Queue) Len() int {
	if q.running != nil {
		return len(q.queued) + 1
	}
	return len(q.queued)
}

// Find returns the queued or running job admitting shape for owner, or nil.
func (q *Queue) Find(owner string, shape Shape) *Job {
	if j := q.running; j != nil && !q.failed && j.Owner == owner && j.Shape == shape {
		return j
	}
	for _, j := range q.queued {
		if j.Owner == owner && j.Shape == shape {
			return j
		}
	}
	return nil
}

// Submit answers a request for a shape that is not resident. A request joins the job that
// already admits its shape for its owner, or queues a new one. It is accepted if the shape is
// predicted ready before its deadline and its admission bound, and refused with the predicted
// delay otherwise; either way the job stays, so a retry finds the shape ready.
func (q *Queue) Submit(now time.Time, r Request) Answer {
	j := q.Find(r.Owner, r.Shape)
	if j == nil {
		j = q.newJob(now, r.Owner, r.Shape, r.Layers, r.Cached)
		q.insert(now, j)
	}
	ready := q.ReadyAt(now, j)
	since := r.Since
	if since.IsZero() || since.After(now) {
		since = now
	}
	w := waiter{deadline: r.Deadline, boundAt: since.Add(r.Bound)}
	if ready.After(w.limit()) {
		return Answer{ReadyAt: ready, RetryAfter: j.promise(now, retryAfter(ready.Sub(now)))}
	}
	j.promise(now, ready.Sub(now))
	j.waiters[r.Ticket] = w
	return Answer{Accepted: true, ReadyAt: ready}
}

func (q *Queue) newJob(now time.Time, owner string, shape Shape, layers int, cached bool) *Job {
	q.lastID++
	return &Job{ID: q.lastID, Owner: owner, Shape: shape, Layers: layers, Arrival: now,
		Prediction: q.costs.Predict(shape, layers, cached), waiters: map[Ticket]waiter{}}
}

// insert places a new job by its start key, but never ahead of a queued job if that would make
// one of the queued job's accepted requests miss its limit.
func (q *Queue) insert(now time.Time, j *Job) {
	pos := len(q.queued)
	for i, other := range q.queued {
		if other.parked || other.Retried || other.Recycled {
			// A job put back at the head (a retry, a recycled admission) keeps its place there;
			// the keys behind it are in order, and a new job's place is among them.
			continue
		}
		if j.StartKey().Before(other.StartKey()) {
			pos = i
			break
		}
	}
	natural := pos
	for i := pos; i < len(q.queued); i++ {
		other := q.queued[i]
		// other's predicted ready time if j goes first: its current prediction plus j's cost.
		// Only a request that would still make it is protected: one that misses its limit
		// anyway is answered at its limit whatever the order.
		ready := q.ReadyAt(now, other)
		pushed := ready.Add(j.Prediction.Cost)
		for _, w := range other.waiters {
			if !ready.After(w.limit()) && pushed.After(w.limit()) {
				pos = i + 1
				break
			}
		}
	}
	j.protecting = pos > natural
	q.queued = slices.Insert(q.queued, pos, j)
}

// CheckOrder checks the queue's order against the seed's rule, for the invariant checks: queued
// jobs start in order of their start key, except a job put back at the head (retried after a
// resource refusal, or recycled with its worker), and a job that insert placed behind a later
// key to protect an accepted request's bound.
func (q *Queue) CheckOrder() error {
	putBack := func(j *Job) bool { return j.parked || j.Retried || j.Recycled }
	for k, j := range q.queued {
		if putBack(j) || j.protecting {
			continue
		}
		for _, ahead := range q.queued[:k] {
			if !putBack(ahead) && j.StartKey().Before(ahead.StartKey()) {
				return fmt.Errorf("%s/%d (start key %s) waits behind %s/%d (start key %s), and no accepted request's bound asks it to",
					j.Owner, j.Shape.Rung, j.StartKey().Format(time.RFC3339Nano), ahead.Owner, ahead.Shape.Rung, ahead.StartKey().Format(time.RFC3339Nano))
			}
		}
	}
	return nil
}

// StartedAt is when the running job took the gate.
func (q *Queue) StartedAt() time.Time { return q.startedAt }

// ReadyAt predicts when job j's shape is resident: after the running job and every job ahead
// of it that can be elected, then its own cost. Jobs of recovering workers are not elected and
// do not delay others.
func (q *Queue) ReadyAt(now time.Time, j *Job) time.Time {
	t := now
	if r := q.running; r != nil {
		end := q.startedAt.Add(r.Prediction.Cost)
		if q.failed {
			end = q.heldUntil
		}
		if end.After(t) {
			t = end
		}
		if r == j {
			return t
		}
	}
	for _, other := range q.queued {
		if q.recovering[other.Owner] && other != j {
			continue
		}
		if hold := other.Arrival.Add(StartHold); hold.After(t) {
			t = hold
		}
		t = t.Add(other.Prediction.Cost)
		if other == j {
			return t
		}
	}
	return t
}

// Elect returns the job to start now, or nil and when to look again (zero: not until
// something changes). Only the head of the queue is elected, once its StartHold has passed,
// and only while no job runs; a parked head waits for its eviction. Before the head starts, its
// waiters that it cannot serve in time are refused, so nothing is evicted or dispatched for a
// request that would give up.
func (q *Queue) Elect(now time.Time) (*Job, []Refusal, time.Time) {
	if q.running != nil {
		return nil, nil, time.Time{}
	}
	for _, j := range q.queued {
		if q.recovering[j.Owner] {
			continue
		}
		if j.parked {
			return nil, nil, time.Time{}
		}
		// A retried or recycled admission already started once: it does not wait again.
		if hold := j.Arrival.Add(StartHold); now.Before(hold) && !j.Retried && !j.Recycled {
			return nil, nil, hold
		}
		return j, q.CheckHead(now, j), time.Time{}
	}
	return nil, nil, time.Time{}
}

// Head returns the job that starts next: the first queued job whose worker is not
// recovering, held or not, gate busy or not. The supervisor evicts for it ahead of time, so
// its compile starts as soon as the gate is free.
func (q *Queue) Head() *Job {
	for _, j := range q.queued {
		if !q.recovering[j.Owner] {
			return j
		}
	}
	return nil
}

// CheckHead refuses the head's waiters that it can no longer serve in time, before anything
// is dispatched or evicted for it.
func (q *Queue) CheckHead(now time.Time, j *Job) []Refusal {
	ready := q.ReadyAt(now, j)
	var refused []Refusal
	for _, t := range j.Waiters() {
		if w := j.waiters[t]; ready.After(w.limit()) {
			delete(j.waiters, t)
			refused = append(refused, refuse(now, j, t, w, ready))
		}
	}
	return refused
}

// Drop removes a queued job and returns its waiters.
func (q *Queue) Drop(j *Job) []Ticket {
	q.queued = slices.DeleteFunc(q.queued, func(o *Job) bool { return o == j })
	return j.Waiters()
}

// StartBackground takes the compile gate for an admission no request waits for (prewarm)
// and returns its running job. Callers check that the gate is free and nothing is queued:
// background work runs only when no request waits.
func (q *Queue) StartBackground(now time.Time, owner string, shape Shape, layers int, cached bool) *Job {
	j := q.newJob(now, owner, shape, layers, cached)
	j.Background = true
	q.running, q.startedAt, q.failed = j, now, false
	return j
}

// Park puts a job the device refused for resources back at the head of the queue, with its
// waiters, while the eviction it asked for is acknowledged: requests for its shape keep joining
// it, nothing else is elected ahead of it, and it is retried once Unpark is called. It is
// retried once: Retried is set, and its duration is never learned.
func (q *Queue) Park(j *Job) {
	j.Retried, j.parked, j.Background = true, true, false
	q.queued = slices.Insert(q.queued, 0, j)
}

// Unpark lets a parked job be elected again (its eviction was acknowledged, refused or ended
// with its worker).
func (q *Queue) Unpark(j *Job) { j.parked = false }

// Parked reports whether j waits for its eviction.
func (j *Job) Parked() bool { return j.parked }

// Recycle puts a job whose worker asked to be replaced back at the head of the queue, with its
// waiters: the owner is recovering, so it is elected again once the replacement runs.
func (q *Queue) Recycle(j *Job) {
	j.Recycled, j.Background = true, false
	q.queued = slices.Insert(q.queued, 0, j)
}

// Start moves j from the queue to the running slot: the compile gate is now held.
func (q *Queue) Start(now time.Time, j *Job) {
	q.queued = slices.DeleteFunc(q.queued, func(o *Job) bool { return o == j })
	q.running, q.startedAt, q.failed = j, now, false
}

// Finish frees the compile gate if j holds it, and reports whether it did. The supervisor calls
// it when j's admission answered or, for a failed one, once the old worker's exit is confirmed
// or its hold expired: whichever comes second finds the gate already freed (or held by a later
// job) and changes nothing.
func (q *Queue) Finish(j *Job) bool {
	if j == nil || q.running != j {
		return false
	}
	q.running, q.failed = nil, false
	return true
}

// Fail marks j, the running admission, failed: it keeps the gate until Finish, at the latest
// until (the unknown outcome's hold), and nothing joins it any more.
func (q *Queue) Fail(j *Job, until time.Time) {
	if q.running == j {
		q.failed, q.heldUntil = true, until
	}
}

// Failed reports whether the running admission failed and only holds the gate.
func (q *Queue) Failed() bool { return q.running != nil && q.failed }

// Queues reports whether j is queued (not running, not dropped).
func (q *Queue) Queues(j *Job) bool { return slices.Contains(q.queued, j) }

// Reprice turns a running admission predicted as a load into a compile once it has run past
// twice its prediction plus a second: aned is evidently compiling it. It reports whether it
// did, and otherwise when it may have to (zero: never).
func (q *Queue) Reprice(now time.Time) (bool, time.Time) {
	r := q.running
	if r == nil || r.Prediction.Kind != Load {
		return false, time.Time{}
	}
	at := q.startedAt.Add(2*r.Prediction.Cost + repriceSlack)
	if now.Before(at) {
		return false, at
	}
	r.Prediction = q.costs.Predict(r.Shape, r.Layers, false)
	return true, time.Time{}
}

// Leave removes a ticket that stopped waiting (it leased, was cancelled or gave up).
func (q *Queue) Leave(j *Job, t Ticket) { delete(j.waiters, t) }

// SetRecovering marks owner's worker as recovering (its jobs are not elected and delay
// nobody) or recovered.
func (q *Queue) SetRecovering(owner string, recovering bool) {
	if recovering {
		q.recovering[owner] = true
	} else {
		delete(q.recovering, owner)
	}
}

// DropOwner removes every queued job of a retired worker at once and returns them, so their
// waiters can be answered.
func (q *Queue) DropOwner(owner string) []*Job {
	var dropped []*Job
	q.queued = slices.DeleteFunc(q.queued, func(j *Job) bool {
		if j.Owner == owner {
			dropped = append(dropped, j)
			return true
		}
		return false
	})
	delete(q.recovering, owner)
	return dropped
}

// Expire drops queued jobs that nobody waits for once twice their last promised delay has
// passed, so a caller that never retries does not keep compiling and evicting shapes others
// use; and it refuses waiters whose limit has passed: past the request's deadline with a
// deadline error, past the admission bound with shape_compiling and a fresh prediction. It
// returns what it did and when to look again (zero: not until something changes).
func (q *Queue) Expire(now time.Time) (dropped []*Job, refused []Refusal, next time.Time) {
	soonest := func(t time.Time) {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	jobs := q.queued
	if q.running != nil {
		jobs = append([]*Job{q.running}, jobs...)
	}
	for _, j := range jobs {
		for _, t := range j.Waiters() {
			w := j.waiters[t]
			if now.Before(w.limit()) {
				soonest(w.limit())
				continue
			}
			delete(j.waiters, t)
			refused = append(refused, refuse(now, j, t, w, q.ReadyAt(now, j)))
		}
	}
	q.queued = slices.DeleteFunc(q.queued, func(j *Job) bool {
		if len(j.waiters) > 0 {
			return false
		}
		if now.Before(j.dropAt) {
			soonest(j.dropAt)
			return false
		}
		dropped = append(dropped, j)
		return true
	})
	return dropped, refused, next
}
