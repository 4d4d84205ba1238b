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

package simulation

import (
	"fmt"
	"slices"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/compilequeue"
	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// The host's bounds on a worker's calls (workerhost's defaults): a call past them is a fault,
// and the worker is killed.
const (
	callTimeout  = 30 * time.Second
	admitTimeout = 30 * time.Minute
	exitGrace    = 10 * time.Second
	epsilon      = time.Millisecond
)

type lanePhase int

const (
	gone lanePhase = iota
	loading
	loaded
	retiring
)

// lane is one catalog lane the simulation loads, retires and loads again.
type lane struct {
	name  string
	spec  residency.ModelSpec
	phase lanePhase
	// factor is how much slower than the seed estimate this identity compiles here.
	factor float64
}

// proc is one worker process: one generation of one lane.
type proc struct {
	gen  *residency.Gen
	lane *lane
	// old: an older worker that sends no cache counts and no cached rungs.
	old bool
	// dead: the process is gone (crashed, killed or exited); exited: and its exit was
	// confirmed to the core.
	dead, exited bool
	closing      bool
	restartBegan time.Time
	// wedged: stuck in the driver; it ignores its channel closing and dies only when killed,
	// late; neverDies: not even then.
	wedged, neverDies bool
	// faulted: a fault of this generation was reported to the core, which may then close it
	// under held leases; until then it may close it only once drained.
	faulted  bool
	resident map[int]bool
	stream   []*call
}

// call is one exchange on a worker's stream.
type call struct {
	name string
	// start runs when the call reaches the worker: it decides the call's outcome and schedules
	// its end (or hangs).
	start func(c *call)
	// fail reports the call failed with a fault (its process died or its channel closed).
	fail     func()
	done     bool
	started  bool
	timedOut bool
	// underFaults: it began while faults were on, so its outcome may still be one.
	underFaults bool
}

// admitCall is an admission that may be compiling on the device.
type admitCall struct {
	p    *proc
	rung int
}

type world struct {
	s     *sim
	lanes []*lane
	procs map[*residency.Gen]*proc
	// aned is the machine-wide compiled-program cache, by identity and rung.
	aned map[string]bool
	// onDevice are the admissions that may be compiling; evicting the cells whose release was
	// dispatched and not yet acknowledged.
	onDevice []*admitCall
	evicting map[*residency.Cell]bool
	scale    float64
}

func (w *world) init(s *sim) {
	w.s, w.procs, w.aned, w.evicting = s, map[*residency.Gen]*proc{}, map[string]bool{}, map[*residency.Cell]bool{}
	w.scale = 0.05 + s.rng.Float64()*0.5
	n := 1 + s.rng.IntN(4)
	identities := []string{"gte", "qwen"}
	for i := range n {
		id := identities[s.rng.IntN(len(identities))]
		layers := []int{12, 22, 28}[s.rng.IntN(3)]
		all := []int{128, 256, 512, 1024, 2048, 4096}
		rungs := slices.Clone(all[:2+s.rng.IntN(4)])
		bound := 600 * time.Second
		if s.chance(0.3) {
			bound = s.dur(30*time.Second, 600*time.Second)
		}
		if s.chance(0.05) {
			layers = s.budget + 1 + s.rng.IntN(20) // one shape needs more than the machine has
		}
		spec := residency.ModelSpec{Lane: fmt.Sprintf("ns/lane-%d", i), Identity: id, Model: id, Dimensions: 8, Layers: layers,
			Rungs: rungs, MaxResidentShapes: 1 + s.rng.IntN(4), AdmissionBound: bound}
		if s.chance(0.6) {
			spec.Probe = func(int, int64, time.Duration, time.Duration) error { return nil } // the world judges
		}
		w.lanes = append(w.lanes, &lane{name: spec.Lane, spec: spec, factor: 0.5 + s.rng.Float64()*1.5})
	}
	s.res.Lanes = n
}

func (w *world) lane(name string) *lane {
	for _, l := range w.lanes {
		if l.name == name {
			return l
		}
	}
	return nil
}

// effect carries out one of the core's worker calls.
func (w *world) effect(fx residency.Effect) {
	s := w.s
	switch fx := fx.(type) {
	case residency.Spawn:
		w.spawn(fx)
	case residency.Admit:
		w.admit(fx)
	case residency.Evict:
		p := w.proc(fx.Gen)
		if n := s.leases[fx.Cell]; n > 0 {
			s.violate("%s#%d/%d was sent for eviction while %d leases hold it", fx.Gen.Lane, fx.Gen.N, fx.Rung, n)
		}
		w.evicting[fx.Cell] = true
		s.res.Evictions++
		w.enqueue(p, &call{name: "evict", start: func(c *call) {
			d := s.dur(2*time.Millisecond, 60*time.Millisecond)
			var err error
			released := true
			switch {
			case s.faulty(0.02):
				err = &residency.WorkerError{Code: "worker_refused", Message: "the release failed"}
				released = false
			case s.faulty(0.01):
				w.crashAt(p, s.now.Add(d/2))
				return
			case s.faulty(0.005):
				w.hang(p, c, callTimeout)
				return
			case s.faulty(0.01):
				err = fmt.Errorf("malformed release: %w", errFault)
				released = s.chance(0.5)
			}
			w.finish(p, c, d, func() {
				if released {
					delete(p.resident, fx.Rung)
				}
				delete(w.evicting, fx.Cell)
				s.report(residency.Evicted{Gen: fx.Gen, Load: fx.Load, Attempt: fx.Attempt, Err: err})
			})
		}, fail: func() {
			delete(w.evicting, fx.Cell)
			s.report(residency.Evicted{Gen: fx.Gen, Load: fx.Load, Attempt: fx.Attempt, Err: errFault})
		}})
	case residency.ProbeShape:
		p := w.proc(fx.Gen)
		s.res.Probes++
		w.enqueue(p, &call{name: "probe", start: func(c *call) {
			d := s.dur(5*time.Millisecond, 150*time.Millisecond)
			var err, verdict error
			switch {
			case s.faulty(0.03):
				verdict = refusal.New(refusal.ComputeUnitMismatch, fx.Gen.Lane, "ratio 0.97 over 0.8")
			case s.faulty(0.01):
				err = &residency.WorkerError{Code: "worker_refused", Message: "probe refused"}
			case s.faulty(0.01):
				w.crashAt(p, s.now.Add(d/2))
				return
			case s.faulty(0.01):
				w.hang(p, c, callTimeout)
				return
			}
			w.finish(p, c, d, func() {
				s.report(residency.Probed{Gen: fx.Gen, Load: fx.Load, Attempt: fx.Attempt, Cell: fx.Cell, Device: time.Millisecond, CPU: 3 * time.Millisecond, Err: err, Verdict: verdict})
			})
		}, fail: func() {
			s.report(residency.Probed{Gen: fx.Gen, Load: fx.Load, Attempt: fx.Attempt, Cell: fx.Cell, Err: errFault})
		}})
	case residency.ConfirmExit:
		w.confirmExit(fx.Gen)
	case residency.Inventory:
		p := w.proc(fx.Gen)
		w.enqueue(p, &call{name: "inventory", start: func(c *call) {
			if s.faulty(0.02) {
				w.finish(p, c, s.dur(time.Millisecond, 20*time.Millisecond), func() {
					s.report(residency.Inventoried{Observation: fx.Observation, Gen: fx.Gen, Err: fmt.Errorf("inventory: %w", errFault)})
				})
				return
			}
			w.finish(p, c, s.dur(time.Millisecond, 20*time.Millisecond), func() {
				var rungs []int
				for r := range p.resident {
					rungs = append(rungs, r)
				}
				slices.Sort(rungs)
				s.report(residency.Inventoried{Observation: fx.Observation, Gen: fx.Gen, Rungs: rungs})
			})
		}, fail: func() {
			s.report(residency.Inventoried{Observation: fx.Observation, Gen: fx.Gen, Err: errFault})
		}})
	default:
		s.violate("unknown effect %T", fx)
	}
}

func (w *world) proc(g *residency.Gen) *proc {
	p := w.procs[g]
	if p == nil {
		w.s.violate("a call for %s#%d, which was never spawned", g.Lane, g.N)
		p = &proc{gen: g, dead: true, resident: map[int]bool{}}
	}
	return p
}

func (w *world) spawn(fx residency.Spawn) {
	s := w.s
	l := w.lane(fx.Gen.Lane)
	s.after(s.dur(20*time.Millisecond, 2*time.Second), func() {
		if s.faulty(0.08) {
			s.report(residency.Spawned{Gen: fx.Gen, Err: fmt.Errorf("exec: the worker did not start")})
			return
		}
		p := &proc{gen: fx.Gen, lane: l, old: s.chance(0.2), resident: map[int]bool{}}
		w.procs[fx.Gen] = p
		var cached []int
		if !p.old {
			cached = []int{}
			for _, r := range l.spec.Rungs {
				if w.aned[l.spec.Identity+fmt.Sprint(r)] {
					cached = append(cached, r)
				}
			}
		}
		s.report(residency.Spawned{Gen: fx.Gen, Conn: p, Cached: cached})
	})
}

// admit runs an admission: it checks the compile gate's rule when the core dispatches it.
func (w *world) admit(fx residency.Admit) {
	s := w.s
	p := w.proc(fx.Gen)
	l := p.lane
	if p.closing {
		s.violate("an admission was sent to %s#%d, whose exit is being confirmed", fx.Gen.Lane, fx.Gen.N)
	}
	for _, o := range w.onDevice {
		if o.p.closing && !s.now.Before(o.p.restartBegan.Add(residency.UnknownOutcomeGateHold)) {
			continue // the seed's bound: an unknown outcome holds the gate at most 35 s
		}
		s.violate("two compiles on the device: %s#%d/%d was sent while %s#%d/%d may still compile",
			fx.Gen.Lane, fx.Gen.N, fx.Rung, o.p.gen.Lane, o.p.gen.N, o.rung)
	}
	s.checkPrewarmStart(fx, p)
	a := &admitCall{p: p, rung: fx.Rung}
	w.onDevice = append(w.onDevice, a)
	s.res.Admissions++
	off := func() { w.onDevice = slices.DeleteFunc(w.onDevice, func(o *admitCall) bool { return o == a }) }
	w.enqueue(p, &call{name: "admit", start: func(c *call) {
		key := l.spec.Identity + fmt.Sprint(fx.Rung)
		cached := w.aned[key]
		perLayer := compilequeue.SeedLayerCompile(fx.Rung)
		if cached {
			perLayer = compilequeue.SeedLayerLoad(fx.Rung)
		}
		d := time.Duration(float64(perLayer) * float64(l.spec.Layers) * l.factor * w.scale)
		var err error
		unknown := false
		switch {
		case s.faulty(0.03):
			err = &residency.WorkerError{Code: "compile_failed", Message: "ANECCompile() FAILED"}
			d /= 3
		case s.faulty(0.03):
			err = &residency.WorkerError{Code: string(refusal.ResourcesExhausted), Message: "0x20004: the device address window is full"}
			d = s.dur(time.Millisecond, 50*time.Millisecond)
		case s.faulty(0.02):
			err = &residency.WorkerError{Code: protocol.CodeRecycle, Message: "no compiles left"}
			d = time.Millisecond
		case s.faulty(0.02):
			w.crashAt(p, s.now.Add(d/2))
			return
		case s.faulty(0.015):
			w.hang(p, c, admitTimeout)
			return
		case s.faulty(0.02):
			err = fmt.Errorf("malformed admitted frame: %w", errFault)
			unknown = true
		}
		w.finish(p, c, d, func() {
			if err == nil || (unknown && s.chance(0.5)) {
				p.resident[fx.Rung] = true
				w.aned[key] = true
			}
			if !unknown {
				off()
			}
			var adm residency.Admission
			if err == nil && !p.old {
				zero, layers := 0, l.spec.Layers
				if cached {
					adm = residency.Admission{CacheHitLayers: &layers, CompiledLayers: &zero}
				} else {
					adm = residency.Admission{CacheHitLayers: &zero, CompiledLayers: &layers}
				}
			}
			s.report(residency.Admitted{Gen: fx.Gen, Job: fx.Job, Load: fx.Load, Admission: adm, Took: d, Err: err})
			if residency.IsWorkerError(err) {
				s.gateFreedAtOnce(fx)
			}
		})
	}, fail: func() {
		if p.dead {
			off() // it never reached a live process, or the process is gone
		}
		s.report(residency.Admitted{Gen: fx.Gen, Job: fx.Job, Load: fx.Load, Err: errFault})
	}})
}

// enqueue puts a call on the process's stream; it starts once the calls before it are done.
func (w *world) enqueue(p *proc, c *call) {
	p.gen.Enter()
	if p.dead || p.closing {
		// The channel is closed or the process gone: the call fails at once.
		c.done = true
		w.s.after(epsilon, func() { p.gen.Exit(); c.fail() })
		return
	}
	p.stream = append(p.stream, c)
	if len(p.stream) == 1 {
		w.startNext(p)
	}
}

func (w *world) startNext(p *proc) {
	if len(p.stream) == 0 || p.dead {
		return
	}
	c := p.stream[0]
	if c.started || c.done {
		return
	}
	c.started = true
	c.underFaults = !w.s.cfg.NoFaults && w.s.now.Before(w.s.faultsUntil)
	c.start(c)
}

// finish ends call c after d with its outcome, unless the process died first.
func (w *world) finish(p *proc, c *call, d time.Duration, outcome func()) {
	w.s.after(d, func() {
		if c.done {
			return
		}
		c.done = true
		w.pop(p, c)
		outcome()
	})
}

func (w *world) pop(p *proc, c *call) {
	p.gen.Exit()
	p.stream = slices.DeleteFunc(p.stream, func(o *call) bool { return o == c })
	if p.closing && len(p.stream) == 0 && !p.dead && !p.wedged {
		w.s.after(epsilon, func() { w.die(p) })
	}
	w.startNext(p)
}

// hang: the call never answers; the host gives up after its bound, counts a fault and kills
// the worker, which is wedged in the driver and dies late, or never.
func (w *world) hang(p *proc, c *call, bound time.Duration) {
	s := w.s
	p.wedged = true
	p.neverDies = s.chance(0.05)
	s.after(bound, func() {
		if c.done {
			return
		}
		c.timedOut = true
		w.kill(p)
		c.done = true
		w.pop(p, c)
		c.fail()
	})
}

func (w *world) crashAt(p *proc, t time.Time) {
	w.s.res.Faults++
	w.s.at(t, func() { w.die(p) })
}

// kill ends the process: at once, or late if it is wedged (past the 35 s gate hold at times).
func (w *world) kill(p *proc) {
	s := w.s
	if p.dead {
		return
	}
	if !p.wedged {
		s.after(epsilon, func() { w.die(p) })
		return
	}
	if p.neverDies {
		return
	}
	s.after(s.dur(0, 120*time.Second), func() { w.die(p) })
}

// die ends the process: its calls fail, nothing of it is on the device any more, and a closing
// channel's exit is confirmed.
func (w *world) die(p *proc) {
	if p.dead {
		return
	}
	s := w.s
	p.dead = true
	w.onDevice = slices.DeleteFunc(w.onDevice, func(o *admitCall) bool { return o.p == p })
	for _, c := range slices.Clone(p.stream) {
		if c.done {
			continue
		}
		c.done = true
		cc := c
		// The call's failure and the process's confirmed exit reach the owner in either order.
		s.after(s.dur(epsilon, 20*time.Millisecond), func() { w.pop(p, cc); cc.fail() })
	}
	if p.closing {
		s.after(s.dur(epsilon, 20*time.Millisecond), func() { w.exited(p) })
	}
}

// confirmExit closes the worker's channel: calls not yet sent fail, the running one finishes,
// then the process exits; a wedged one is killed after the grace.
func (w *world) confirmExit(g *residency.Gen) {
	s := w.s
	p := w.proc(g)
	if p.closing {
		s.violate("%s#%d's exit was confirmed twice", g.Lane, g.N)
		return
	}
	if !p.faulted {
		for _, c := range p.stream {
			if c.name != "exchange" {
				s.violate("%s#%d was closed while the core's %s call on it was in flight and no fault was reported", g.Lane, g.N, c.name)
			}
		}
		for c, n := range s.leases {
			if c.Gen == g && n > 0 {
				s.violate("%s#%d was closed under %d held leases of rung %d, with no fault reported: retirement must drain first", g.Lane, g.N, n, c.Rung)
			}
		}
	}
	p.closing = true
	p.restartBegan = s.now
	s.res.Exits++
	if p.dead {
		s.after(s.dur(epsilon, 20*time.Millisecond), func() { w.exited(p) })
		return
	}
	for _, c := range slices.Clone(p.stream) {
		if !c.started && !c.done {
			c.done = true
			cc := c
			s.after(epsilon, func() { w.pop(p, cc); cc.fail() })
		}
	}
	switch {
	case p.wedged:
		s.after(exitGrace, func() { w.kill(p) })
	case len(p.stream) == 0 || s.chance(0.1):
		// Idle, or the close takes the process down mid-call.
		s.after(s.dur(epsilon, 50*time.Millisecond), func() { w.die(p) })
	}
}

func (w *world) exited(p *proc) {
	if p.exited {
		return
	}
	p.exited = true
	w.s.report(residency.Exited{Gen: p.gen})
}
