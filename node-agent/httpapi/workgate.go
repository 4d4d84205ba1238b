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
	"net/http"
	"runtime"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// WorkLimits bound the calls doing the API's own CPU work at once: parsing a body and
// tokenising its inputs (encoding an answer needs no slot: the lanes' permits bound the calls
// that get one). Past the node's capacity, a call waits (parked, costing no
// CPU) for a slot. Without the bound, every connection's handler runs at once when the node is
// overloaded: the goroutines the admitted calls need (their exchange with the worker, the
// supervisor's owner) wait behind hundreds of runnable handlers, every admitted call slows
// down, and the lane's queue holds calls past their deadline. Measured under make load: with
// the gate, 4 times as many valid calls answered 200 in the same time, and none 504.
type WorkLimits struct {
	// Slots bounds the calls working at once; 0 means two per CPU the process may use.
	Slots int
	// MaxWaiting bounds the calls waiting for a slot; past it a call is refused overloaded at
	// once. 0 means DefaultMaxWorkWaiting; negative, none may wait.
	MaxWaiting int
	// MaxWait bounds a call's wait for a slot; past it the call is refused overloaded. 0 means
	// DefaultMaxWorkWait.
	MaxWait time.Duration
	// LargeBody is the body size from which a call is bulk work (so is a body of unknown
	// length): bulk calls read their bodies and hold work slots at most half the slots at a
	// time, so calls of ordinary size always find some (a flood of oversize bodies, whose
	// parsing costs as much as hundreds of ordinary calls, cannot starve them), and the memory
	// of the bodies read at once is bounded: that many large ones, and ordinary ones of less
	// than LargeBody each. 0 means DefaultLargeBody.
	LargeBody int
}

// DefaultLargeBody: 64 KiB is more than a batch of 32 texts of a few hundred words.
const DefaultLargeBody = 64 << 10

// DefaultMaxWorkWaiting and DefaultMaxWorkWait are the work gate's bounds when Config sets none:
// as many waiting calls as the server's connection limit, each waiting at most a second.
const (
	DefaultMaxWorkWaiting = 1024
	DefaultMaxWorkWait    = time.Second
)

// workGate hands out the work slots.
type workGate struct {
	slots chan struct{}
	// bulk are the slots' share bulk calls may hold: a bulk call takes one of these first.
	bulk      chan struct{}
	largeBody int
	clk       clock.Clock
	maxWait   time.Duration

	mu         sync.Mutex
	waiting    int
	maxWaiting int
}

func newWorkGate(l WorkLimits, clk clock.Clock) *workGate {
	if l.Slots <= 0 {
		l.Slots = 2 * runtime.GOMAXPROCS(0)
	}
	if l.MaxWaiting == 0 {
		l.MaxWaiting = DefaultMaxWorkWaiting
	}
	if l.MaxWait <= 0 {
		l.MaxWait = DefaultMaxWorkWait
	}
	if l.LargeBody <= 0 {
		l.LargeBody = DefaultLargeBody
	}
	return &workGate{slots: make(chan struct{}, l.Slots), bulk: make(chan struct{}, max(1, l.Slots/2)), largeBody: l.LargeBody,
		clk: clk, maxWait: l.MaxWait, maxWaiting: l.MaxWaiting}
}

// bulkBody reports whether a request's body makes its call bulk work: a large body by its
// Content-Length, or one of unknown length (chunked).
func (g *workGate) bulkBody(contentLength int64) bool {
	return contentLength < 0 || contentLength >= int64(g.largeBody)
}

// enterBulk takes one of the bulk calls' share, bounded as enter is.
func (g *workGate) enterBulk(ctx context.Context) error { return g.take(ctx, g.bulk) }

func (g *workGate) leaveBulk() { <-g.bulk }

// overloaded is the answer to a call that found no work slot within the gate's bounds.
func overloaded(why string) *apiError {
	return &apiError{status: http.StatusTooManyRequests, code: string(refusal.Overloaded), retryAfter: time.Second,
		message: "the node is busy with other calls (" + why + "); retry later"}
}

// enter takes a slot: at once if one is free, else after waiting, at most maxWait and only while
// fewer than maxWaiting others wait.
func (g *workGate) enter(ctx context.Context) error { return g.take(ctx, g.slots) }

// take takes a slot of slots, as enter says (a bulk call waits so twice: for its bulk slot, then
// for its slot).
func (g *workGate) take(ctx context.Context, slots chan struct{}) error {
	select {
	case slots <- struct{}{}:
		return nil
	default:
	}
	g.mu.Lock()
	if g.waiting >= max(g.maxWaiting, 0) {
		g.mu.Unlock()
		return overloaded("too many calls wait for a work slot")
	}
	g.waiting++
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.waiting--
		g.mu.Unlock()
	}()
	timer := g.clk.NewTimer(g.maxWait)
	defer timer.Stop()
	select {
	case slots <- struct{}{}:
		return nil
	case <-timer.C():
		return overloaded("no work slot came free in " + g.maxWait.String())
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *workGate) leave() { <-g.slots }

// waiters reports how many calls wait for a slot (tests).
func (g *workGate) waiters() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.waiting
}
