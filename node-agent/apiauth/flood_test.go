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

package apiauth_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes/fake"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
)

// A flood of ten times the cache's size of distinct made-up tokens, each reviewed and refused,
// leaves an accepted token's review cached: the refusals evict each other, never it.
func TestRefusedTokensNeverEvictAnAcceptedOne(t *testing.T) {
	const size = 16
	reviews := newTokenReviews("good")
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	auth := apiauth.New(apiauth.Config{TokenReviews: reviews, SubjectAccessReviews: fake.NewClientset().AuthorizationV1(),
		Clock: clk, CacheSize: size, RefusedReviewBurst: 20 * size}) // a budget the flood does not spend: every bad token is reviewed
	mustAuthenticate(t, auth, "good", true)
	for i := range 10 * size {
		mustAuthenticate(t, auth, fmt.Sprintf("bad-%d", i), false)
	}
	mustAuthenticate(t, auth, "good", true)
	if n := reviews.of("good"); n != 1 {
		t.Fatalf("the good token was reviewed %d times after the flood, want 1: the flood evicted it", n)
	}
	if n := reviews.total(); n != 1+10*size {
		t.Fatalf("%d reviews, want one a token", n)
	}
	// The refusals are cached, as many as the cache holds: the latest is answered from it, the
	// first was evicted.
	mustAuthenticate(t, auth, fmt.Sprintf("bad-%d", 10*size-1), false)
	mustAuthenticate(t, auth, "bad-0", false)
	if latest, first := reviews.of(fmt.Sprintf("bad-%d", 10*size-1)), reviews.of("bad-0"); latest != 1 || first != 2 {
		t.Fatalf("reviews of the latest refused token %d (want 1, cached), of the first %d (want 2, evicted)", latest, first)
	}
	// The accepted review still expires on time.
	clk.Step(apiauth.DefaultAuthenticatedTTL - time.Second)
	mustAuthenticate(t, auth, "good", true)
	clk.Step(time.Second)
	mustAuthenticate(t, auth, "good", true)
	if n := reviews.of("good"); n != 2 {
		t.Fatalf("the good token was reviewed %d times after its review expired, want 2", n)
	}
}

// Made-up tokens held in review (an API server slow to refuse them) take at most their share
// of the review slots: a token accepted before whose review has expired is still reviewed, and
// another made-up token is answered ErrBusy at once.
func TestAFloodOfBadTokensCannotTakeEveryReviewSlot(t *testing.T) {
	const maxReviews, share = 4, 3
	reviews := newTokenReviews("good")
	reviews.held = make(chan struct{})
	reviews.started = make(chan string, share)
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	auth := apiauth.New(apiauth.Config{TokenReviews: reviews, SubjectAccessReviews: fake.NewClientset().AuthorizationV1(),
		Clock: clk, MaxReviews: maxReviews})
	mustAuthenticate(t, auth, "good", true)
	clk.Step(apiauth.DefaultAuthenticatedTTL) // its review expired: the next call has it reviewed again

	var wg sync.WaitGroup
	results := make(chan error, share)
	for i := range share {
		wg.Go(func() {
			_, ok, _, err := auth.AuthenticateRequest(bearer(fmt.Sprintf("held-%d", i)))
			if ok {
				err = errors.New("a made-up token was let in")
			}
			results <- err
		})
	}
	for range share {
		<-reviews.started
	}
	if _, ok, _, err := auth.AuthenticateRequest(bearer("bad-more")); !errors.Is(err, apiauth.ErrBusy) || ok {
		t.Fatalf("one more made-up token while the flood holds its share: ok %v, err %v, want ErrBusy", ok, err)
	}
	mustAuthenticate(t, auth, "good", true)
	if n := reviews.of("good"); n != 2 {
		t.Fatalf("the good token was reviewed %d times, want 2: its expired review was not made again", n)
	}
	reviews.release(t, &wg, results)
}

// Once refused tokens have spent the refusals' budget, a token not known good is answered
// ErrTooManyRefused at once, with no review, until it refills; a cached token is still
// answered, and a token accepted before is still reviewed.
func TestTheRefusalsBudgetHoldsBackOnlyTokensNotKnownGood(t *testing.T) {
	reviews := newTokenReviews("good", "new")
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	auth := apiauth.New(apiauth.Config{TokenReviews: reviews, SubjectAccessReviews: fake.NewClientset().AuthorizationV1(), Clock: clk})
	mustAuthenticate(t, auth, "good", true)
	flood := 0
	spend := func() {
		t.Helper()
		for range apiauth.DefaultRefusedReviewBurst {
			mustAuthenticate(t, auth, fmt.Sprintf("bad-%d", flood), false)
			flood++
		}
	}
	throttled := func(token string) {
		t.Helper()
		before := reviews.total()
		if _, ok, _, err := auth.AuthenticateRequest(bearer(token)); !errors.Is(err, apiauth.ErrTooManyRefused) || ok {
			t.Fatalf("%s with the budget spent: ok %v, err %v, want ErrTooManyRefused", token, ok, err)
		}
		if reviews.total() != before {
			t.Fatalf("%s was reviewed with the budget spent", token)
		}
	}
	spend()
	throttled("bad-more")
	throttled("new") // a good token never seen is as unknown as a made-up one
	mustAuthenticate(t, auth, "good", true)
	if n := reviews.of("good"); n != 1 {
		t.Fatalf("the cached good token was reviewed %d times, want 1", n)
	}

	// Its review expired (and the budget refilled meanwhile): spent again, the good token is
	// still reviewed, as one known good.
	clk.Step(apiauth.DefaultAuthenticatedTTL)
	spend()
	throttled("bad-more")
	mustAuthenticate(t, auth, "good", true)
	if n := reviews.of("good"); n != 2 {
		t.Fatalf("the known good token was reviewed %d times, want 2", n)
	}

	// Another source's tokens, new ones too, are reviewed while this one's budget is spent: a
	// flood from one address locks no one else out (a client's rotated token is new).
	if _, ok, _, err := auth.AuthenticateRequest(bearerFrom("new", "192.0.2.7:40000")); err != nil || !ok {
		t.Fatalf("a new token from another source with the flood's budget spent: ok %v, err %v", ok, err)
	}
	if _, ok, _, err := auth.AuthenticateRequest(bearerFrom("bad-other", "192.0.2.7:40001")); err != nil || ok {
		t.Fatalf("a bad token from another source: ok %v, err %v; want reviewed and refused", ok, err)
	}

	// The budget refills at its rate: one more unknown token may be reviewed after 1/rate.
	clk.Step(time.Duration(float64(time.Second)/apiauth.DefaultRefusedReviewsPerSecond) - time.Millisecond)
	throttled("bad-later")
	clk.Step(time.Millisecond)
	mustAuthenticate(t, auth, "bad-later", false)
}

// A known good token's reviews take nothing from the budget, whatever becomes of them: a client
// retrying through an API server outage leaves its source's budget as it was, and new tokens
// are reviewed as soon as the API server answers again. Accepted tokens give back what they
// took, so a source of many good clients never spends it.
func TestOnlyRefusedUnknownTokensSpendTheBudget(t *testing.T) {
	reviews := newTokenReviews("good")
	for i := range 3 * apiauth.DefaultRefusedReviewBurst {
		reviews.good[fmt.Sprintf("pod-%d", i)] = true
	}
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	auth := apiauth.New(apiauth.Config{TokenReviews: reviews, SubjectAccessReviews: fake.NewClientset().AuthorizationV1(), Clock: clk})
	// Three bursts' worth of distinct good tokens from one source, at one instant.
	for i := range 3 * apiauth.DefaultRefusedReviewBurst {
		mustAuthenticate(t, auth, fmt.Sprintf("pod-%d", i), true)
	}
	mustAuthenticate(t, auth, "good", true)
	clk.Step(apiauth.DefaultAuthenticatedTTL)
	reviews.failing.Store(true)
	for range 10 * apiauth.DefaultRefusedReviewBurst {
		if _, _, _, err := auth.AuthenticateRequest(bearer("good")); err == nil || errors.Is(err, apiauth.ErrTooManyRefused) {
			t.Fatalf("a known good token's review during the outage: err %v, want the review's own error", err)
		}
	}
	reviews.failing.Store(false)
	// The whole budget is there: a burst of bad tokens is reviewed, and only then held back.
	for i := range apiauth.DefaultRefusedReviewBurst {
		mustAuthenticate(t, auth, fmt.Sprintf("bad-%d", i), false)
	}
	if _, _, _, err := auth.AuthenticateRequest(bearer("bad-more")); !errors.Is(err, apiauth.ErrTooManyRefused) {
		t.Fatalf("past the budget: err %v, want ErrTooManyRefused", err)
	}
}

// bearerFrom is bearer sent from the address remote.
func bearerFrom(token, remote string) *http.Request {
	r := bearer(token)
	r.RemoteAddr = remote
	return r
}

func bearer(token string) *http.Request {
	r, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://mac/metrics", nil)
	r.Header.Set("Authorization", "Bearer "+token)
	return r
}

func mustAuthenticate(t *testing.T, auth *apiauth.Delegating, token string, want bool) user.Info {
	t.Helper()
	u, ok, _, err := auth.AuthenticateRequest(bearer(token))
	if err != nil || ok != want {
		t.Fatalf("%s: ok %v, err %v, want ok %v", token, ok, err, want)
	}
	return u
}

// tokenReviews accepts the tokens it was made with, for the fleet's audience, refuses every
// other, and counts the reviews of each. A token named held-* is refused only once held is
// closed, after saying so on started.
type tokenReviews struct {
	good    map[string]bool
	held    chan struct{}
	started chan string
	// failing makes every review fail, as an API server away does.
	failing atomic.Bool

	mu     sync.Mutex
	counts map[string]int
}

func newTokenReviews(good ...string) *tokenReviews {
	r := &tokenReviews{good: map[string]bool{}, counts: map[string]int{}}
	for _, g := range good {
		r.good[g] = true
	}
	return r
}

func (r *tokenReviews) TokenReviews() authenticationv1client.TokenReviewInterface { return r }

func (r *tokenReviews) Create(_ context.Context, tr *authenticationv1.TokenReview, _ metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	token := tr.Spec.Token
	r.mu.Lock()
	r.counts[token]++
	r.mu.Unlock()
	if strings.HasPrefix(token, "held-") {
		r.started <- token
		<-r.held
	}
	if r.failing.Load() {
		return nil, errors.New("the API server is away")
	}
	out := tr.DeepCopy()
	if r.good[token] {
		out.Status = authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: tr.Spec.Audiences,
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:team:" + token}}
	} else {
		out.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
	}
	return out, nil
}

// release lets the held reviews finish, waits for their callers (wg), and fails t if any of them
// reported an error on results.
func (r *tokenReviews) release(t *testing.T, wg *sync.WaitGroup, results chan error) {
	t.Helper()
	close(r.held)
	wg.Wait()
	close(results)
	for err := range results {
		if err != nil {
			t.Fatalf("a held review: %v", err)
		}
	}
}

func (r *tokenReviews) of(token string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[token]
}

func (r *tokenReviews) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.counts {
		n += c
	}
	return n
}

// A burst of made-up tokens from one source, all at once and held in review: the budget is taken
// before each review, so no more than its burst are reviewed at once, whatever the slots allow;
// the rest are answered ErrTooManyRefused at once, and another source's token is still reviewed.
func TestABurstFromOneSourceIsReviewedAtMostABurstAtOnce(t *testing.T) {
	const burst, flood = apiauth.DefaultRefusedReviewBurst, 4 * apiauth.DefaultRefusedReviewBurst
	reviews := newTokenReviews()
	reviews.held = make(chan struct{})
	reviews.started = make(chan string, flood+1)
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	auth := apiauth.New(apiauth.Config{TokenReviews: reviews, SubjectAccessReviews: fake.NewClientset().AuthorizationV1(), Clock: clk})

	var wg sync.WaitGroup
	results := make(chan error, flood)
	for i := range flood {
		wg.Go(func() {
			_, _, _, err := auth.AuthenticateRequest(bearerFrom(fmt.Sprintf("held-%d", i), "192.0.2.9:5000"))
			results <- err
		})
	}
	for range burst {
		<-reviews.started
	}
	// Every call past the burst is answered without waiting for the held reviews.
	for range flood - burst {
		if err := <-results; !errors.Is(err, apiauth.ErrTooManyRefused) {
			t.Fatalf("a call past the burst: err %v, want ErrTooManyRefused", err)
		}
	}
	if n := reviews.total(); n != burst {
		t.Fatalf("%d reviews started for one source's burst of %d, want %d", n, flood, burst)
	}
	// Another source's unknown token is reviewed meanwhile.
	go func() { _, _, _, _ = auth.AuthenticateRequest(bearerFrom("held-other", "192.0.2.10:5000")) }()
	if got := <-reviews.started; got != "held-other" {
		t.Fatalf("review started for %s, want held-other", got)
	}
	reviews.release(t, &wg, results)
}
