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
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"
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

// refusalBudget is a token bucket (golang.org/x/time/rate, on the injected clock) that each
// refused or failed TokenReview takes one from. It is charged after the review, so that
// accepted tokens, however many, cost it nothing; the reviews in flight when it empties may
// take it below zero (at most the unknown tokens' share of the slots), and it refills from
// there.
type refusalBudget struct {
	lim *rate.Limiter
	clk clock.PassiveClock
}

func newRefusalBudget(perSecond float64, burst int, clk clock.PassiveClock) *refusalBudget {
	return &refusalBudget{lim: rate.NewLimiter(rate.Limit(perSecond), burst), clk: clk}
}

// open reports whether a token not known good may be reviewed now.
func (b *refusalBudget) open() bool { return b.lim.TokensAt(b.clk.Now()) >= 1 }

// charge takes one for a review that accepted nobody.
func (b *refusalBudget) charge() { b.lim.ReserveN(b.clk.Now(), 1) }
