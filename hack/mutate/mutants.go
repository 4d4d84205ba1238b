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

package main

// mutant is one planted bug: the rule it breaks, and the one place in the source it changes.
// Old must occur exactly once in File, so a mutant whose code has moved fails the gate loudly
// instead of testing nothing.
type mutant struct {
	Name, Rule string
	File       string
	Old, New   string
}

// mutants are the residency core's rules, one planted bug each. The issue that asked for the
// gate named the first nine; every rule added since has one too.
var mutants = []mutant{
	{
		Name: "hold-never-expires", Rule: "an unknown outcome holds the gate at most 35 s after its worker's restart began",
		File: "node-agent/residency/schedule.go",
		Old: `			c.queue.Finish(h.job)
			c.hold = nil
		}
	}

	_, refused, t := c.queue.Expire(now)`,
		New: `		}
	}

	_, refused, t := c.queue.Expire(now)`,
	},
	{
		Name: "no-start-hold", Rule: "a compile with a known cost waits 50 ms after its arrival before it may start",
		File: "node-agent/compilequeue/queue.go",
		Old:  `if hold := j.Arrival.Add(StartHold); now.Before(hold) && !j.Retried && !j.Recycled {`,
		New:  `if hold := j.Arrival; now.Before(hold) && !j.Retried && !j.Recycled {`,
	},
	{
		Name: "fifo", Rule: "queued compiles start in order of their start key (arrival plus predicted cost)",
		File: "node-agent/compilequeue/queue.go",
		Old:  `		if j.StartKey().Before(other.StartKey()) {`,
		New:  `		if false && j.StartKey().Before(other.StartKey()) {`,
	},
	{
		Name: "prewarm-while-requests-wait", Rule: "prewarm runs only while no request waits",
		File: "node-agent/residency/prewarm.go",
		Old:  `	if c.queue.Len() > 0 || len(c.waiters) > 0 {`,
		New:  `	if c.queue.Running() != nil {`,
	},
	{
		Name: "recovering-job-elected", Rule: "a recovering worker's queued compiles are not elected",
		File: "node-agent/compilequeue/queue.go",
		Old: `		if q.recovering[j.Owner] {
			continue
		}
		if j.parked {`,
		New: `		if j.parked {`,
	},
	{
		Name: "retiring-jobs-left-queued", Rule: "a queued compile is dropped at once when its worker retires",
		File: "node-agent/residency/lifecycle.go",
		Old: `	c.cancelPrewarm(m)
	for _, j := range c.queue.DropOwner(m.owner()) {`,
		New: `	c.cancelPrewarm(m)
	for _, j := range []*compilequeue.Job(nil) {`,
	},
	{
		Name: "cohort-shape-evicted", Rule: "a shape its handoff cohort protects is not an eviction candidate",
		File: "node-agent/residency/eviction.go",
		Old:  ` || sh.cohort.protects(c.now) || sh.probe.running {`,
		New:  ` || sh.probe.running {`,
	},
	{
		Name: "worker-error-holds-gate", Rule: "a worker answering an admission with an error frees the gate at once",
		File: "node-agent/residency/admission.go",
		Old: `		c.queue.Finish(j)
		c.trace(Event{Kind: EventAdmissionRefused`,
		New: `		c.holdGate(j, sh.load, in.Gen, c.holdUntil(m), false)
		c.trace(Event{Kind: EventAdmissionRefused`,
	},
	{
		Name: "refusal-keeps-old-promise", Rule: "a queued compile is dropped after twice the delay it last promised",
		File: "node-agent/compilequeue/queue.go",
		Old:  `		r.RetryAfter = j.promise(now, retryAfter(ready.Sub(now)))`,
		New:  `		r.RetryAfter = retryAfter(ready.Sub(now))`,
	},
	{
		Name: "raw-prediction-promised", Rule: "the compile is kept for twice the retry time the client is told, not the raw prediction",
		File: "node-agent/compilequeue/queue.go",
		Old:  `		return Answer{ReadyAt: ready, RetryAfter: j.promise(now, retryAfter(ready.Sub(now)))}`,
		New:  `		return Answer{ReadyAt: ready, RetryAfter: retryAfter(j.promise(now, ready.Sub(now)))}`,
	},
	{
		Name: "hold-not-predicted", Rule: "while an unknown outcome holds the gate, predictions count it busy until the hold's end",
		File: "node-agent/compilequeue/queue.go",
		Old: `		if q.failed {
			end = q.heldUntil
		}`,
		New: ``,
	},
	{
		Name: "queued-wait-for-dead-replacement", Rule: "requests queued for a replacement that fails to start fail loudly at once",
		File: "node-agent/residency/lifecycle.go",
		Old:  `			c.failQueued(m, in.Err)`,
		New:  ``,
	},
	{
		Name: "probe-released-twice", Rule: "a repeated probe outcome gives the probe's lease back once",
		File: "node-agent/residency/cell.go",
		Old:  `	if attempt != 0 && c.probeAttempt == attempt {`,
		New:  `	if true {`,
	},
	{
		Name: "unknown-admission-settled-twice", Rule: "a repeated admission outcome of unknown outcome changes nothing",
		File: "node-agent/residency/admission.go",
		Old:  `s.state == admitting && !s.unknownOutcome && s.job != nil`,
		New:  `s.state == admitting && s.job != nil`,
	},
	{
		Name: "unknown-eviction-settled-twice", Rule: "a repeated eviction outcome of unknown outcome changes nothing",
		File: "node-agent/residency/eviction.go",
		Old:  `	if sh == nil || sh.state != evicting || sh.unknownOutcome || sh.attempt != in.Attempt {`,
		New:  `	if sh == nil || sh.state != evicting || sh.attempt != in.Attempt {`,
	},
	{
		Name: "attempt-not-matched", Rule: "a late report of a first admission attempt never settles its retry",
		File: "node-agent/residency/admission.go",
		Old:  ` && s.job.ID == in.Job && s.load == in.Load {`,
		New:  ` && s.job.ID == in.Job {`,
	},
	{
		Name: "spawn-matched-by-number", Rule: "a late report of a failed start never settles the next start",
		File: "node-agent/residency/lifecycle.go",
		Old:  `	if m == nil || !m.spawning || in.Gen != m.spawnGen {`,
		New:  `	if m == nil || !m.spawning || in.Gen.N != m.genN()+1 {`,
	},
	{
		Name: "observation-end-no-pass", Rule: "admissions an observation held back start when it ends",
		File: "node-agent/residency/observe.go",
		Old: `	c.soon(c.now)
	c.emit(Observed{`,
		New: `	c.emit(Observed{`,
	},
	{
		Name: "fault-restarts-twice", Rule: "one fault restarts its generation once",
		File: "node-agent/residency/lifecycle.go",
		Old:  `	if m.gen != g || !m.live() || m.exiting || (m.state != running && m.state != retiring) {`,
		New:  `	if m.gen != g || !m.live() || (m.state != running && m.state != retiring) {`,
	},
	{
		Name: "budget-ignored", Rule: "the supervisor reserves at most its budget of layer executables",
		File: "node-agent/residency/schedule.go",
		Old:  `c.used+j.Layers <= c.budget`,
		New:  `c.used <= c.budget`,
	},
	{
		Name: "retried-compile-learned", Rule: "compile times are never learned from retried compiles",
		File: "node-agent/compilequeue/cost.go",
		Old:  `	if o.Retried || o.Packed || o.Duration <= 0 {`,
		New:  `	if o.Packed || o.Duration <= 0 {`,
	},
	{
		Name: "handoff-returned-as-lease", Rule: "a handoff answered just before the owner stops is never a lease",
		File: "node-agent/supervisor/lease.go",
		Old: `		if !a.Handoff {
			return a, nil
		}`,
		New: `		return a, nil`,
	},
	{
		Name: "two-compiles", Rule: "at most one cold shape compile runs at a time across all workers",
		File: "node-agent/compilequeue/queue.go",
		Old: `func (q *Queue) Elect(now time.Time) (*Job, []Refusal, time.Time) {
	if q.running != nil {
		return nil, nil, time.Time{}
	}`,
		New: `func (q *Queue) Elect(now time.Time) (*Job, []Refusal, time.Time) {`,
	},
	{
		Name: "leased-shape-evicted", Rule: "a leased shape is never evicted: the close for an eviction and a lease are one atomic step each",
		File: "node-agent/residency/cell.go",
		Old:  `		if w&leaseMask != 0 || w&closedBit != 0 {`,
		New:  `		if w&closedBit != 0 {`,
	},
	{
		Name: "refund-without-release", Rule: "eviction refunds its charge only after the worker acknowledges the release",
		File: "node-agent/residency/eviction.go",
		Old: `		sh.state = resident
		if m.state == running {
			sh.cell.clearBits(closedBit)
		}`,
		New: `		m.removeShape(sh)
		c.used -= sh.charge
		if c.cfg.CertifyObservation {
			c.admittedCount--
		}`,
	},
	{
		Name: "eviction-order-lru-only", Rule: "eviction prefers an idle stream, then no queued demand, then a non-smallest rung, then LRU",
		File: "node-agent/residency/eviction.go",
		Old:  `		for _, p := range [][2]bool{{a.busy, b.busy}, {a.demanded, b.demanded}, {a.smallest, b.smallest}} {`,
		New:  `		for _, p := range [][2]bool{} {`,
	},
	{
		Name: "newcomer-joins-cohort", Rule: "requests arriving after an admission completed cannot join or extend its handoff cohort",
		File: "node-agent/residency/route.go",
		Old:  `	member := w.Member && sh.cohort.protects(c.now) && sh.cohort.members[w.Ticket]`,
		New:  `	member := sh.cohort.protects(c.now)`,
	},
	{
		Name: "eviction-attempt-not-matched", Rule: "a late report of a refused eviction never settles the next eviction of the same load",
		File: "node-agent/residency/eviction.go",
		Old:  ` || sh.unknownOutcome || sh.attempt != in.Attempt {`,
		New:  ` || sh.unknownOutcome {`,
	},
	{
		Name: "probe-attempt-not-matched", Rule: "a late report of a probe never settles a later probe of the same load",
		File: "node-agent/residency/probe.go",
		Old:  `	if sh == nil || !sh.probe.running || sh.probe.attempt != in.Attempt {`,
		New:  `	if sh == nil || !sh.probe.running {`,
	},
	{
		Name: "insert-passes-put-back-head", Rule: "queued compiles start in start-key order behind a job put back at the head",
		File: "node-agent/compilequeue/queue.go",
		Old:  `		if other.parked || other.Retried || other.Recycled {`,
		New:  `		if other.parked {`,
	},
	{
		Name: "head-unchecked-before-evicting", Rule: "the queue head's prediction is checked against its bound before anything is dispatched or evicted for it",
		File: "node-agent/residency/schedule.go",
		Old: `			c.refuseQueued(c.queue.CheckHead(now, head))
			switch c.makeRoom(head) {`,
		New: `			switch c.makeRoom(head) {`,
	},
	{
		Name: "exit-no-unpark", Rule: "a parked retry is unparked when its victim's worker exits",
		File: "node-agent/residency/lifecycle.go",
		Old: `		if j := sh.unpark; j != nil {
			sh.unpark = nil
			c.queue.Unpark(j)
		}
		if sh.state == admitting {`,
		New: `		if sh.state == admitting {`,
	},
	{
		Name: "retry-forever", Rule: "an admission refused for resources is retried once",
		File: "node-agent/residency/admission.go",
		Old:  `	case we.Code == string(refusal.ResourcesExhausted) && waited && !j.Retried && m.state == running:`,
		New:  `	case we.Code == string(refusal.ResourcesExhausted) && waited && m.state == running:`,
	},
	{
		Name: "backstop-stale-retry", Rule: "a wait that reaches the 600 s backstop is answered shape_compiling with a fresh prediction",
		File: "node-agent/residency/schedule.go",
		Old:  `			retry = max(retry, c.queue.ReadyAt(c.now, head).Sub(c.now))`,
		New:  ``,
	},
	{
		Name: "recovering-delays-others", Rule: "a recovering worker's queued compiles do not delay others' predictions",
		File: "node-agent/compilequeue/queue.go",
		Old:  `		if q.recovering[other.Owner] && other != j {`,
		New:  `		if false && q.recovering[other.Owner] && other != j {`,
	},
	{
		Name: "recycled-to-tail", Rule: "a recycled admission is put back at the head of the queue",
		File: "node-agent/compilequeue/queue.go",
		Old: `	j.Recycled, j.Background = true, false
	q.queued = slices.Insert(q.queued, 0, j)`,
		New: `	j.Recycled, j.Background = true, false
	q.queued = append(q.queued, j)`,
	},
	{
		Name: "outstanding-call-ignored", Rule: "after a confirmed exit, an admission whose call has not returned keeps the gate until it returns (at most the hold)",
		File: "node-agent/residency/lifecycle.go",
		Old: `			if c.queue.Running() == sh.job {
				c.holdGate(sh.job, sh.load, in.Gen, c.holdUntil(m), true)
			}`,
		New: `			c.queue.Finish(sh.job)`,
	},
	{
		Name: "accept-no-promise", Rule: "an accepted request's prediction is a promise too: the job is kept twice it",
		File: "node-agent/compilequeue/queue.go",
		Old: `	j.promise(now, ready.Sub(now))
	j.waiters[r.Ticket] = w`,
		New: `	j.waiters[r.Ticket] = w`,
	},
}
