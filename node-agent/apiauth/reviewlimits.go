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

package apiauth

import (
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
)

// unknownSlots is how many of max review slots reviews of tokens not known good may hold at
// once: three quarters, leaving a quarter (at least one) for what a flood of made-up tokens
// cannot cause, the reviews of tokens accepted before and the SubjectAccessReviews of callers
// already authenticated. Of the default 32 that leaves 8: those reviews come once per token
// every 2 minutes and once per caller and lane every 5, a few milliseconds each, so 8 in
// flight serve hundreds a second, more than the review client's own rate (5 a second).
func unknownSlots(n int) int {
	if n < 2 {
		return n
	}
	return n - max(1, n/4)
}

// acquire takes a review slot, and for a token not known good (unknown) one of their share
// too, or answers ErrBusy at once when none is free.
func (d *Delegating) acquire(unknown bool) (release func(), err error) {
	if unknown {
		select {
		case d.unknown <- struct{}{}:
		default:
			d.metrics.reviews.WithLabelValues("none", "busy").Inc()
			return nil, ErrBusy
		}
	}
	select {
	case d.slots <- struct{}{}:
		return func() {
			<-d.slots
			if unknown {
				<-d.unknown
			}
		}, nil
	default:
		if unknown {
			<-d.unknown
		}
		d.metrics.reviews.WithLabelValues("none", "busy").Inc()
		return nil, ErrBusy
	}
}

// refusalBudgets are the refusals' budgets, one per source address: token buckets, on the
// injected clock, from which a review of a token not known good takes one before it is made,
// given back if the token is accepted. A source whose tokens the API server keeps refusing (a
// flood of made-up ones) spends its own budget: its next unknown token is answered
// ErrTooManyRefused at once, while the tokens of every other source, new ones included (a
// client's rotated token is new), are still reviewed. Taken before the review, a budget never
// goes below zero, and its burst is the most reviews a source's unknown tokens have in flight
// at once. Tokens known good take nothing from it, whatever becomes of their reviews. The
// sources are kept in a bounded LRU: a source forgotten starts again from a full budget,
// which costs at most a burst. (golang.org/x/time/rate's Limiter gives a reservation back only
// before its time to act, which for one taken at once has passed by the review's end: hence a
// bucket of its own.)
type refusalBudgets struct {
	perSecond float64
	burst     float64
	clk       clock.PassiveClock

	mu      sync.Mutex
	sources *lru.Cache
}

// bucket is one source's budget: tokens left at last.
type bucket struct {
	tokens float64
	last   time.Time
}

func newRefusalBudgets(perSecond float64, burst, size int, clk clock.PassiveClock) *refusalBudgets {
	return &refusalBudgets{perSecond: perSecond, burst: float64(burst), clk: clk, sources: lru.New(size)}
}

// take takes one from source's budget for a review of a token not known good: ok is false
// (and nothing is taken) when it is spent. giveBack returns it, for a token accepted or not
// reviewed.
func (b *refusalBudgets) take(source string) (giveBack func(), ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clk.Now()
	bk := &bucket{tokens: b.burst, last: now}
	if v, found := b.sources.Get(source); found {
		bk = v.(*bucket)
		bk.tokens = min(b.burst, bk.tokens+now.Sub(bk.last).Seconds()*b.perSecond)
		bk.last = now
	} else {
		b.sources.Add(source, bk)
	}
	if bk.tokens < 1 {
		return nil, false
	}
	bk.tokens--
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		bk.tokens = min(b.burst, bk.tokens+1)
	}, true
}

// sourceOf is the address a request came from, without its port: the unit a budget is kept
// for.
func sourceOf(r *http.Request) string {
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return host
	}
	return r.RemoteAddr
}
