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

package supervisor

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

// leaseBook is the test's own record of held leases, which the fake workers consult: a worker
// asked to evict a shape someone holds a lease on is a violation.
type leaseBook struct {
	sync.Mutex
	held       map[string]int
	violations []string
	admitting  atomic.Int32
}

func (b *leaseBook) key(lane string, gen int64, rung int) string {
	return fmt.Sprintf("%s#%d/%d", lane, gen, rung)
}

func (b *leaseBook) add(lane string, gen int64, rung, n int) {
	b.Lock()
	defer b.Unlock()
	b.held[b.key(lane, gen, rung)] += n
}

func (b *leaseBook) violate(format string, args ...any) {
	b.Lock()
	defer b.Unlock()
	b.violations = append(b.violations, fmt.Sprintf(format, args...))
}

// overlapWorker wraps a fakeWorker to check the machine-wide rules from the workers' side.
type overlapWorker struct {
	*fakeworker.Worker
	book *leaseBook
}

func (w overlapWorker) Admit(ctx context.Context, rung int) (Admission, error) {
	if n := w.book.admitting.Add(1); n > 1 {
		w.book.violate("%d admissions ran at once", n)
	}
	defer w.book.admitting.Add(-1)
	return w.Worker.Admit(ctx, rung)
}

func (w overlapWorker) Evict(ctx context.Context, rung int) error {
	w.book.Lock()
	n := w.book.held[w.book.key(w.Lane, w.Gen, rung)]
	w.book.Unlock()
	if n > 0 {
		w.book.violate("%s#%d/%d evicted while %d leases hold it", w.Lane, w.Gen, rung, n)
	}
	return w.Worker.Evict(ctx, rung)
}

type overlapSpawner struct {
	*fakeworker.Spawner
	book *leaseBook
}

func (s overlapSpawner) Spawn(ctx context.Context, spec ModelSpec, gen int64) (Worker, []int, error) {
	w, cached, err := s.Spawner.Spawn(ctx, spec, gen)
	if err != nil {
		return nil, nil, err
	}
	return overlapWorker{w.(*fakeworker.Worker), s.book}, cached, nil
}

// checkInvariants runs the core's own checks on the owner goroutine, between two steps.
func checkInvariants(s *Supervisor) error {
	c := make(chan error, 1)
	s.in <- input{fn: func(core *residency.Core) { c <- core.CheckInvariants() }}
	return <-c
}

// TestRandomisedResidencyKeepsItsInvariants drives many concurrent requests, admissions,
// evictions, faults and retirements against fake workers on a fake clock, checking after every
// step of the clock that the budget adds up and holds, and at the end that no leased shape was
// evicted, no two admissions overlapped and every request got exactly one answer.
func TestRandomisedResidencyKeepsItsInvariants(t *testing.T) {
	var total coverage
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			c := randomisedRun(t, seed)
			total.leases += c.leases
			total.admissions += c.admissions
			total.evictions += c.evictions
			total.faults += c.faults
		})
	}
	// A property that held because nothing happened proves nothing.
	if total.leases == 0 || total.admissions == 0 || total.evictions == 0 || total.faults == 0 {
		t.Fatalf("the runs did not exercise leases, admissions, evictions and faults: %+v", total)
	}
}

// coverage counts what a randomised run exercised.
type coverage struct{ leases, admissions, evictions, faults int }

func randomisedRun(t *testing.T, seed uint64) coverage {
	rng := rand.New(rand.NewPCG(seed, 7))
	var rngMu sync.Mutex
	intn := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }

	clk := newHarness(t, 0).clk // a fake clock; the harness's own supervisor stays idle
	book := &leaseBook{held: map[string]int{}}
	fs := fakeworker.New(clk)
	fs.Configure = func(w *fakeworker.Worker) {
		for _, r := range []int{128, 256, 512, 1024} {
			w.AdmitCost[r] = time.Duration(r/128) * 300 * time.Millisecond
		}
	}
	s := New(Config{Clock: clk, Spawner: overlapSpawner{fs, book}, Budget: 88})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	defer func() { cancel(); <-done }()

	lanes := []string{"a", "b", "c"}
	spec := func(lane string) ModelSpec {
		return ModelSpec{Lane: lane, Identity: "gte", Layers: 22, Rungs: []int{128, 256, 512, 1024},
			MaxResidentShapes: 3, AdmissionBound: 600 * time.Second}
	}
	for _, l := range lanes {
		if err := s.LoadModel(ctx, spec(l)); err != nil {
			t.Fatal(err)
		}
	}

	const requests = 120
	var answered, leased, faulted atomic.Int32
	var reloading sync.Mutex // one retire-and-reload at a time
	var wg sync.WaitGroup
	for i := range requests {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lane := lanes[intn(len(lanes))]
			rung := []int{128, 256, 512, 1024}[intn(4)]
			<-clk.After(time.Duration(intn(120)) * time.Second) // arrivals spread over two minutes
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			if i%17 == 0 {
				rcancel() // a caller that gives up at once
			}
			var l Lease
			var err error
			// A well-behaved client retries once after shape_compiling's retry time.
			for attempt := range 2 {
				l, err = s.Acquire(rctx, lane, rung, clk.Now().Add(time.Duration(30+intn(90))*time.Second))
				var r *refusal.Error
				if attempt == 1 || !errors.As(err, &r) || r.Code != refusal.ShapeCompiling {
					break
				}
				<-clk.After(r.RetryAfter)
			}
			answered.Add(1)
			if err != nil {
				switch refusal.CodeOf(err) {
				case refusal.ShapeCompiling, refusal.DeadlineExceeded, refusal.EngineCrashed, refusal.LaneRetired, refusal.UnknownLane:
				default:
					if rctx.Err() == nil {
						book.violate("unexpected answer: %v", err)
					}
				}
				return
			}
			leased.Add(1)
			book.add(lane, l.Generation(), l.Rung(), 1)
			if intn(6) == 0 {
				w := fs.Get(t, lane, l.Generation())
				w.Lock()
				w.NextExchangeErr = fakeworker.ErrBrokenPipe
				w.Unlock()
			}
			if _, err := l.Exchange(context.Background(), []byte("q")); err != nil {
				faulted.Add(1)
			}
			book.add(lane, l.Generation(), l.Rung(), -1)
			l.Release()
		}()
		if i%40 == 39 {
			// Retire a lane and load it again, while requests run.
			lane := lanes[intn(len(lanes))]
			wg.Add(1)
			go func() {
				defer wg.Done()
				reloading.Lock()
				defer reloading.Unlock()
				if err := s.Retire(ctx, lane); err != nil {
					book.violate("retire %s: %v", lane, err)
					return
				}
				if err := s.LoadModel(ctx, spec(lane)); err != nil {
					book.violate("reload %s: %v", lane, err)
				}
			}()
		}
	}

	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	for steps := 0; ; steps++ {
		select {
		case <-finished:
			if n := answered.Load(); n != requests {
				t.Fatalf("%d of %d requests answered", n, requests)
			}
			if len(book.violations) > 0 {
				t.Fatalf("violations: %v", book.violations)
			}
			evictions, admissions := 0, 0
			workers := fs.Workers()
			for _, w := range workers {
				for _, c := range w.Calls() {
					switch c[:5] {
					case "evict":
						evictions++
					case "admit":
						admissions++
					}
				}
			}
			t.Logf("%d leases, %d admissions, %d evictions, %d faulted exchanges, %d workers spawned, %v of fake time",
				leased.Load(), admissions, evictions, faulted.Load(), len(workers), clk.Now().Sub(epoch))
			return coverage{int(leased.Load()), admissions, evictions, int(faulted.Load())}
		default:
		}
		if steps > 200000 {
			t.Fatalf("requests still unanswered after %v of fake time", clk.Now().Sub(epoch))
			return coverage{}
		}
		clk.Step(time.Duration(1+intn(200)) * time.Millisecond)
		if err := checkInvariants(s); err != nil {
			t.Fatal(err)
		}
		runtime.Gosched()
	}
}
