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
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/clock"
)

// tokenCache holds token reviews by the token's SHA-256 (never the token itself), and makes
// one review at a time per token however many calls carry it. Accepted and refused tokens are
// kept in caches of their own, each bounded, so that no number of refused tokens evicts an
// accepted one: a flood of made-up tokens costs its own entries, never a caller's.
type tokenCache struct {
	// accepted holds the tokens the API server accepted, for KnownGoodTTL: an entry answers
	// for AuthenticatedTTL after its review; after that the token is reviewed again, as a
	// token known good (reserved review slots, not held back by the refusals' budget).
	accepted *cache.LRUExpireCache
	// refused holds the tokens the API server refused, for UnauthenticatedTTL.
	refused *cache.LRUExpireCache
	flight  singleflight.Group
}

type tokenVerdict struct {
	user user.Info // nil: not authenticated
	why  string
}

// acceptedToken is an accepted token's review, which answers until fresh.
type acceptedToken struct {
	user  user.Info
	fresh time.Time
}

func newTokenCache(size int, clk clock.PassiveClock) *tokenCache {
	return &tokenCache{accepted: cache.NewLRUExpireCacheWithClock(size, clk), refused: cache.NewLRUExpireCacheWithClock(size, clk)}
}

// BearerToken is the token of an "Authorization: Bearer <token>" header, or "".
func BearerToken(r *http.Request) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// AuthenticateRequest says who sent r by its bearer token. ok is false when r has no token or
// the API server does not accept it for the audience (why says which, for the log, never the
// caller); err is set when no decision could be made (the API server is away, or the review
// was not made: ErrBusy, ErrTooManyRefused): the caller answers 503, and nothing is cached.
func (d *Delegating) AuthenticateRequest(r *http.Request) (u user.Info, ok bool, why string, err error) {
	token := BearerToken(r)
	if token == "" {
		d.metrics.authn.WithLabelValues("no_token").Inc()
		return nil, false, "no bearer token", nil
	}
	v, err := d.authenticate(r.Context(), token, sourceOf(r))
	if err != nil {
		d.metrics.authn.WithLabelValues("error").Inc()
		return nil, false, "", err
	}
	if v.user == nil {
		d.metrics.authn.WithLabelValues("rejected").Inc()
		return nil, false, v.why, nil
	}
	d.metrics.authn.WithLabelValues("authenticated").Inc()
	return v.user, true, "", nil
}

func (d *Delegating) authenticate(ctx context.Context, token, source string) (tokenVerdict, error) {
	sum := sha256.Sum256([]byte(token))
	known := false
	if v, ok := d.tokens.accepted.Get(sum); ok {
		a := v.(acceptedToken)
		if d.cfg.Clock.Now().Before(a.fresh) {
			return tokenVerdict{user: a.user}, nil
		}
		known = true
	}
	if v, ok := d.tokens.refused.Get(sum); ok {
		return v.(tokenVerdict), nil
	}
	// The review is made for every waiter, so it must not end with the first one's request.
	res, err := wait(ctx, &d.tokens.flight, string(sum[:]), func() (any, error) {
		// A token not known good may be one of a flood of made-up ones: it is reviewed only
		// while its source's refusals' budget lasts, and in the share of the slots such tokens
		// may hold.
		giveBack := func() {}
		if !known {
			var ok bool
			if giveBack, ok = d.budgets.take(source); !ok {
				d.metrics.reviews.WithLabelValues("none", "throttled").Inc()
				return nil, ErrTooManyRefused
			}
		}
		release, err := d.acquire(!known)
		if err != nil {
			giveBack() // not reviewed
			return nil, err
		}
		defer release()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ReviewTimeout)
		defer cancel()
		v, err := d.review(ctx, token)
		d.metrics.reviewed("TokenReview", err)
		if err != nil {
			return nil, err
		}
		if v.user == nil {
			d.tokens.accepted.Remove(sum)
			d.tokens.refused.Add(sum, v, d.cfg.UnauthenticatedTTL)
			return v, nil
		}
		giveBack() // accepted tokens cost the budget nothing
		d.tokens.refused.Remove(sum)
		d.tokens.accepted.Add(sum, acceptedToken{user: v.user, fresh: d.cfg.Clock.Now().Add(d.cfg.AuthenticatedTTL)}, d.cfg.KnownGoodTTL)
		return v, nil
	})
	if err != nil {
		return tokenVerdict{}, err
	}
	return res.(tokenVerdict), nil
}

// wait joins (or starts) the review of key and waits for it or for the caller to go away.
func wait(ctx context.Context, g *singleflight.Group, key string, review func() (any, error)) (any, error) {
	select {
	case r := <-g.DoChan(key, review):
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a review: %w", ctx.Err())
	}
}

// review asks the API server whether token is valid for the audience.
func (d *Delegating) review(ctx context.Context, token string) (tokenVerdict, error) {
	tr, err := d.cfg.TokenReviews.TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{d.cfg.Audience}}}, metav1.CreateOptions{})
	if err != nil {
		return tokenVerdict{}, fmt.Errorf("reviewing a caller's token: %w", err)
	}
	st := tr.Status
	switch {
	case !st.Authenticated:
		why := st.Error
		if why == "" {
			why = "the API server does not accept the token"
		}
		return tokenVerdict{why: why}, nil
	case len(st.Audiences) > 0 && !slices.Contains(st.Audiences, d.cfg.Audience):
		// The API server checked the audience it was asked for; this guards against one that
		// answers for another.
		return tokenVerdict{why: fmt.Sprintf("the token is for %v, not %s", st.Audiences, d.cfg.Audience)}, nil
	}
	var extra map[string][]string
	if len(st.User.Extra) > 0 {
		extra = make(map[string][]string, len(st.User.Extra))
		for k, v := range st.User.Extra {
			extra[k] = v
		}
	}
	return tokenVerdict{user: &user.DefaultInfo{Name: st.User.Username, UID: st.User.UID, Groups: st.User.Groups, Extra: extra}}, nil
}
