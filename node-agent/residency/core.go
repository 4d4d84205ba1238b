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

package residency

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// Config configures a Core.
type Config struct {
	// Budget is the number of layer executables; DefaultBudget if zero.
	Budget int
	// CertifyObservation keeps the independent admission count and answers Observe. Ordinary
	// serving leaves it off and records nothing.
	CertifyObservation bool
	Log                logr.Logger
	// Warn, if set, receives warnings (a refused prewarm admission); otherwise they are logged
	// as errors.
	Warn func(msg string, keysAndValues ...any)
	// Trace, if set, receives the timeline events the core decides (queue entries,
	// reservations, evictions, refunds).
	Trace func(Event)
}

// Core is the residency state machine. It is not safe for concurrent use, except for what its
// View and Cells offer: one owner calls Step and Ready.
type Core struct {
	cfg    Config
	budget int
	log    logr.Logger

	now    time.Time
	models map[string]*model
	lanes  []string // the models' lanes, sorted: every walk over the models is in this order
	// used counts the charged executables: resident, admitting and evicting shapes.
	used  int
	queue *compilequeue.Queue
	// waiters are the unanswered slow-path requests, wherever they wait.
	waiters map[Ticket]*waiter
	// blocked are tickets for resident shapes waiting behind a starved budget head; reroute
	// are tickets to route again in this pass (a probe passed, a recovery began).
	blocked, reroute []Ticket
	// starved: a budget head waits for leased shapes to be released, and resident traffic
	// yields to it: every lane's, or only starvedLane's when the head lacks a slot of its own.
	starved     bool
	starvedLane string
	// hold is the admission of unknown outcome holding the compile gate until its worker's
	// exit is confirmed or its hold expires.
	hold *gateHold
	// admitted is the certify count: admissions minus evictions, kept apart from the shapes.
	admittedCount int
	counts        Counts
	obs           []*observation
	stopped       error
	lastLoad      uint64
	lastAttempt   uint64

	// epoch counts steps; cells stamp their last use with it.
	epoch   atomic.Int64
	effects []Effect
	next    time.Time
	view    *View
}

// gateHold is a failed admission that keeps the gate while its worker's exit is unconfirmed,
// or, if the exit was confirmed while the admission's call had not yet returned, until it
// returns. Either way for at most UnknownOutcomeGateHold after the worker's restart began.
type gateHold struct {
	job *compilequeue.Job
	// load is the admission attempt whose call holds the gate.
	load  uint64
	gen   *Gen
	until time.Time
	// outstanding: the exit is confirmed, but the admission's call has not returned.
	outstanding bool
}

// waiter is a slow-path request the core has not answered yet.
type waiter struct {
	Acquire
	boundAt time.Time
	// Where it waits, at most one of: the admission it is queued for, the shape whose
	// placement probe it waits for, or behind a starved budget head.
	job     *compilequeue.Job
	probing *shape
	blocked bool
}

// limit is when the waiter must be answered: its deadline or its admission bound.
func (w *waiter) limit() time.Time {
	if !w.Deadline.IsZero() && w.Deadline.Before(w.boundAt) {
		return w.Deadline
	}
	return w.boundAt
}

// New returns an empty core.
func New(cfg Config) *Core {
	if cfg.Budget == 0 {
		cfg.Budget = DefaultBudget
	}
	c := &Core{cfg: cfg, budget: cfg.Budget, log: cfg.Log, models: map[string]*model{},
		queue: compilequeue.New(compilequeue.NewCostModel()), waiters: map[Ticket]*waiter{}}
	c.view = c.buildView()
	return c
}

// Step applies one input at time now (a clock that went backwards is taken as not moving) and
// runs one scheduling pass.
func (c *Core) Step(now time.Time, in Input) {
	if now.After(c.now) {
		c.now = now
	}
	c.epoch.Add(1)
	if c.stopped != nil {
		c.stepStopped(in)
		c.view = c.buildView()
		return
	}
	switch in := in.(type) {
	case Load:
		c.load(in.Spec)
	case Acquire:
		c.acquire(in)
	case Leave:
		c.leave(in.Ticket)
	case Retire:
		c.retire(in.Lane)
	case Prewarm:
		c.setPrewarm(in.Lane, in.Rungs)
	case Observe:
		c.observe(in.ID, in.Withdraw)
	case Tick:
	case ExchangeFault:
		if m := c.current(in.Gen); m != nil {
			c.fault(m, in.Gen, in.Err)
		}
	case Spawned:
		c.spawned(in)
	case Admitted:
		c.admitted(in)
	case Evicted:
		c.evicted(in)
	case Probed:
		c.probed(in)
	case Exited:
		c.exited(in)
	case Inventoried:
		c.inventoried(in)
	default:
		panic(fmt.Sprintf("residency: unknown input %T", in))
	}
	c.schedule()
	c.view = c.keepIfSame(c.buildView())
}

// keepIfSame returns the view published before if v says nothing new, so the owner's
// watchers (the agent's status writer) wake only on change.
func (c *Core) keepIfSame(v *View) *View {
	if old := c.view; old != nil && old.same(v) {
		return old
	}
	return v
}

// Ready hands over what the last Steps decided. The effects are the owner's from then on.
func (c *Core) Ready() Ready {
	r := Ready{Effects: c.effects, View: c.view, Next: c.next}
	c.effects = nil
	return r
}

// Abort stops the core for good, as the owner does when its scheduler failed: every waiting
// request is answered engine_crashed with its lane, every later one too, and pending loads,
// retirements and observations fail with err.
func (c *Core) Abort(err error) {
	if c.stopped != nil {
		return
	}
	c.stopped = err
	for _, t := range sortedTickets(c.waiters) {
		w := c.waiters[t]
		c.answer(w, Answer{Err: refusal.New(refusal.EngineCrashed, w.Lane, "the compile scheduler stopped: %v", err)})
	}
	for _, lane := range c.lanes {
		m := c.models[lane]
		if m.state == loading {
			c.emit(Loaded{Lane: lane, Err: fmt.Errorf("the compile scheduler stopped: %w", err)})
		}
		if m.state == retiring {
			c.emit(Retired{Lane: lane, Err: fmt.Errorf("the compile scheduler stopped: %w", err)})
		}
	}
	for _, o := range c.obs {
		c.emit(Observed{ID: o.id, Err: fmt.Errorf("the compile scheduler stopped: %w", err)})
	}
	c.obs = nil
	c.next = time.Time{}
	c.view = c.buildView()
}

// stepStopped answers what arrives after Abort; worker outcomes change nothing.
func (c *Core) stepStopped(in Input) {
	err := fmt.Errorf("the compile scheduler stopped: %w", c.stopped)
	switch in := in.(type) {
	case Acquire:
		c.emit(Answer{Ticket: in.Ticket, Lane: in.Lane, Err: refusal.New(refusal.EngineCrashed, in.Lane, "%v", err)})
	case Load:
		c.emit(Loaded{Lane: in.Spec.Lane, Err: err})
	case Retire:
		c.emit(Retired{Lane: in.Lane, Err: err})
	case Observe:
		if !in.Withdraw {
			c.emit(Observed{ID: in.ID, Err: err})
		}
	case Probed:
		in.Cell.releaseProbe(in.Attempt)
	}
}

func (c *Core) emit(e Effect) { c.effects = append(c.effects, e) }

// yields reports whether lane's resident traffic yields to a starved head.
func (c *Core) yields(lane string) bool {
	return c.starved && (c.starvedLane == "" || c.starvedLane == lane)
}

// current returns the model whose current, live generation g is, or nil: an outcome about any
// other generation (an older one, one whose exit is confirmed, one of a lane since retired and
// loaded again) is stale.
func (c *Core) current(g *Gen) *model {
	if g == nil {
		return nil
	}
	m := c.models[g.Lane]
	if m == nil || m.gen != g || !m.live() {
		return nil
	}
	return m
}

// answer answers a waiting request exactly once: it leaves every place it waited in.
func (c *Core) answer(w *waiter, a Answer) {
	if c.waiters[w.Ticket] != w {
		panic(fmt.Sprintf("residency: ticket %d answered twice", w.Ticket))
	}
	c.unwait(w)
	a.Ticket, a.Lane = w.Ticket, w.Lane
	c.emit(a)
}

// unwait forgets a waiter wherever it waits.
func (c *Core) unwait(w *waiter) {
	delete(c.waiters, w.Ticket)
	if w.job != nil {
		c.queue.Leave(w.job, w.Ticket)
		w.job = nil
	}
	if sh := w.probing; sh != nil {
		sh.probe.waiters = slices.DeleteFunc(sh.probe.waiters, func(t Ticket) bool { return t == w.Ticket })
		w.probing = nil
	}
	if w.blocked {
		c.blocked = slices.DeleteFunc(c.blocked, func(t Ticket) bool { return t == w.Ticket })
		w.blocked = false
	}
}

func (c *Core) refuse(w *waiter, code refusal.Code, format string, args ...any) {
	c.answer(w, Answer{Err: refusal.New(code, w.Lane, format, args...)})
}

func (c *Core) trace(e Event) {
	if c.cfg.Trace == nil {
		return
	}
	if e.At.IsZero() {
		e.At = c.now
	}
	c.cfg.Trace(e)
}

func (c *Core) warn(msg string, kv ...any) {
	if c.cfg.Warn != nil {
		c.cfg.Warn(msg, kv...)
		return
	}
	c.log.Error(errors.New(msg), "warning", kv...)
}

// soon lowers the next wake-up to t if t is set and earlier.
func (c *Core) soon(t time.Time) {
	if !t.IsZero() && (c.next.IsZero() || t.Before(c.next)) {
		c.next = t
	}
}

func (c *Core) addModel(m *model) {
	c.models[m.spec.Lane] = m
	i, _ := slices.BinarySearch(c.lanes, m.spec.Lane)
	c.lanes = slices.Insert(c.lanes, i, m.spec.Lane)
}

func (c *Core) removeModel(m *model) {
	delete(c.models, m.spec.Lane)
	c.lanes = slices.DeleteFunc(c.lanes, func(l string) bool { return l == m.spec.Lane })
}

func (c *Core) nextLoad() uint64 {
	c.lastLoad++
	return c.lastLoad
}

// nextAttempt names a worker call whose outcome must not be confused with an earlier call's
// about the same load (an eviction or a probe asked again).
func (c *Core) nextAttempt() uint64 {
	c.lastAttempt++
	return c.lastAttempt
}

func sortedTickets[T any](m map[Ticket]T) []Ticket {
	out := make([]Ticket, 0, len(m))
	for t := range m {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// buildView builds the view to publish.
func (c *Core) buildView() *View {
	v := &View{starved: c.starved && c.starvedLane == "", stopped: c.stopped, lanes: make(map[string]*laneView, len(c.models)),
		node: c.nodeSnapshot()}
	if c.stopped != nil {
		return v
	}
	for _, lane := range c.lanes {
		m := c.models[lane]
		lv := &laneView{rungs: m.spec.Rungs, yield: c.starved && c.starvedLane == lane, snap: LaneSnapshot{
			Generation: m.genN(), Loading: m.state == loading, Running: m.state == running,
			Recovering: m.state == recovering, Retiring: m.state == retiring, Restarts: m.restarts,
		}}
		if m.state == running {
			lv.cells = make([]*Cell, len(m.spec.Rungs))
		}
		for _, sh := range m.shapes {
			if sh.state != resident {
				continue
			}
			lv.snap.Resident = append(lv.snap.Resident, sh.rung)
			if lv.cells != nil {
				lv.cells[slices.Index(m.spec.Rungs, sh.rung)] = sh.cell
			}
		}
		for _, r := range m.spec.Rungs {
			if m.cached[r] {
				lv.snap.Cached = append(lv.snap.Cached, r)
			}
		}
		if m.lastFault != nil {
			f := *m.lastFault
			lv.snap.LastFault = &f
		}
		lv.progress = m.admitting
		if m.prewarm != nil {
			p := m.prewarm.summary
			p.Loaded = slices.Clone(p.Loaded)
			lv.prewarm = &p
		}
		v.lanes[lane] = lv
	}
	return v
}

func (c *Core) nodeSnapshot() NodeSnapshot {
	out := NodeSnapshot{Budget: c.budget, Used: c.used, QueueLength: c.queue.Len(), Counts: c.counts}
	drain := c.now
	if j := c.queue.Running(); j != nil {
		out.Running = j.Owner + "@" + strconv.Itoa(j.Shape.Rung)
		if m := c.models[j.Owner]; m != nil && m.admitting != nil && m.admitting.PredictedDone.After(drain) {
			drain = m.admitting.PredictedDone
		}
	}
	for _, j := range c.queue.Queued() {
		drain = drain.Add(j.Prediction.Cost)
	}
	if out.QueueLength > 0 {
		out.PredictedDrain = drain
	}
	return out
}

// Used reports the charged layer executables.
func (c *Core) Used() int { return c.used }
