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

// Package apiauth decides who calls the agent's API and what they may do, the way the kubelet
// and kube-rbac-proxy do: a bearer token is checked by a TokenReview for the fleet's audience,
// and each call by a SubjectAccessReview, so a team's access to a lane is ordinary RBAC on
// cataloglanes/embeddings and cataloglanes/rerank. Decisions are cached on an injected clock in
// bounded LRU caches (apiserver's delegating authenticator and authorizer cache on the wall
// clock in caches we cannot size or step in a test, so the reviews are made here directly
// through client-go and cached with apimachinery's LRUExpireCache).
package apiauth

import (
	"errors"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	authorizationv1client "k8s.io/client-go/kubernetes/typed/authorization/v1"
	"k8s.io/utils/clock"
)

// The agent asks the API server who a caller is and what it may do.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// DefaultAudience is the audience a client's token must be issued for. A token of the fleet's
// own audience is one the API server refuses, so an agent that receives it cannot replay it
// against the cluster as the caller.
const DefaultAudience = "fleet.synapse.dev"

// How long decisions are kept: a token's review about 2 minutes (a revoked ServiceAccount's
// token is refused within that), an allowed call 5 minutes and a denied one 30 seconds (RBAC
// granted a moment ago takes effect soon), as the kubelet's webhook defaults are in spirit.
const (
	DefaultAuthenticatedTTL   = 2 * time.Minute
	DefaultUnauthenticatedTTL = 30 * time.Second
	DefaultAllowedTTL         = 5 * time.Minute
	DefaultDeniedTTL          = 30 * time.Second
	// DefaultKnownGoodTTL is how long an accepted token is remembered as known good after its
	// review has expired: a projected ServiceAccount token lives an hour unless its pod asks
	// otherwise, so a client's current token is one accepted within the hour. A known token's
	// review is never held back by what made-up tokens cost.
	DefaultKnownGoodTTL = time.Hour
	// DefaultCacheSize bounds each cache (accepted tokens, refused tokens, allowed and denied
	// decisions); the least recently used goes.
	DefaultCacheSize = 4096
	// DefaultReviewTimeout bounds one review, retries none: a caller gets 503 and retries.
	DefaultReviewTimeout = 10 * time.Second
	// DefaultMaxReviews bounds the reviews in flight to the API server at once: a flood of
	// distinct tokens gets ErrBusy beyond it rather than a review each. Tokens not known good
	// may hold only part of them (unknownSlots).
	DefaultMaxReviews = 32
	// DefaultRefusedReviewsPerSecond and DefaultRefusedReviewBurst are each source address's
	// refusals' budget (refusalBudgets): a review of a token not known good takes one from its
	// source's, given back if the token is accepted, and while it is spent the source's unknown
	// tokens are answered ErrTooManyRefused, not reviewed. The reviews go through a client of
	// client-go's default rate, 5 per second, burst 10 (k8s.io/client-go rest/config.go
	// DefaultQPS, DefaultBurst), shared with the SubjectAccessReviews: one source's made-up
	// tokens may spend 2 of the 5 and half the burst. An honest client is refused far fewer:
	// a refused token is kept 30 s, so 2 a second is 60 distinct bad tokens at once. Sources
	// many enough to spend the client's whole rate are held by the slots' share (unknownSlots).
	DefaultRefusedReviewsPerSecond = 2
	DefaultRefusedReviewBurst      = 5
)

// ErrBusy: as many reviews as allowed are in flight; the caller answers 503 and retries.
var ErrBusy = errors.New("too many reviews in flight")

// ErrTooManyRefused: the tokens of the request's source address were refused at the budget's
// rate lately, and its tokens not known good are not reviewed until it refills; the caller
// answers 503 and retries. A token accepted before is still reviewed, one whose review is
// cached is still answered, and other sources' tokens are reviewed.
var ErrTooManyRefused = errors.New("too many tokens refused lately to review an unknown one now")

// Config configures a Delegating.
type Config struct {
	// TokenReviews and SubjectAccessReviews are the API the reviews go to
	// (kubernetes.Interface's AuthenticationV1() and AuthorizationV1()), as the agent's own
	// identity, which RBAC allows to create both.
	TokenReviews         authenticationv1client.TokenReviewsGetter
	SubjectAccessReviews authorizationv1client.SubjectAccessReviewsGetter
	// Audience is what a caller's token must be issued for (DefaultAudience if empty).
	Audience string
	// The caches' lifetimes and bound (the defaults above if zero; KnownGoodTTL is at least
	// AuthenticatedTTL).
	AuthenticatedTTL, UnauthenticatedTTL, AllowedTTL, DeniedTTL, KnownGoodTTL time.Duration
	CacheSize                                                                 int
	ReviewTimeout                                                             time.Duration
	// MaxReviews bounds the reviews in flight (DefaultMaxReviews if zero).
	MaxReviews int
	// RefusedReviewsPerSecond and RefusedReviewBurst are each source's refusals' budget (the
	// defaults above if zero); CacheSize sources are kept.
	RefusedReviewsPerSecond float64
	RefusedReviewBurst      int
	Clock                   clock.PassiveClock
	Log                     logr.Logger
}

// Delegating authenticates and authorizes by delegating to the API server, with caches.
type Delegating struct {
	cfg     Config
	tokens  *tokenCache
	access  *accessCache
	metrics *metrics
	// slots holds one token per review in flight; unknown one per review of a token not known
	// good, which holds a slot too.
	slots, unknown chan struct{}
	budgets        *refusalBudgets
}

// New returns a Delegating for cfg.
func New(cfg Config) *Delegating {
	if cfg.Audience == "" {
		cfg.Audience = DefaultAudience
	}
	setDefault(&cfg.AuthenticatedTTL, DefaultAuthenticatedTTL)
	setDefault(&cfg.UnauthenticatedTTL, DefaultUnauthenticatedTTL)
	setDefault(&cfg.AllowedTTL, DefaultAllowedTTL)
	setDefault(&cfg.DeniedTTL, DefaultDeniedTTL)
	setDefault(&cfg.ReviewTimeout, DefaultReviewTimeout)
	setDefault(&cfg.KnownGoodTTL, DefaultKnownGoodTTL)
	cfg.KnownGoodTTL = max(cfg.KnownGoodTTL, cfg.AuthenticatedTTL)
	if cfg.CacheSize <= 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	if cfg.MaxReviews <= 0 {
		cfg.MaxReviews = DefaultMaxReviews
	}
	if cfg.RefusedReviewsPerSecond <= 0 {
		cfg.RefusedReviewsPerSecond = DefaultRefusedReviewsPerSecond
	}
	if cfg.RefusedReviewBurst <= 0 {
		cfg.RefusedReviewBurst = DefaultRefusedReviewBurst
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	d := &Delegating{cfg: cfg, metrics: newMetrics(), slots: make(chan struct{}, cfg.MaxReviews),
		unknown: make(chan struct{}, unknownSlots(cfg.MaxReviews)),
		budgets: newRefusalBudgets(cfg.RefusedReviewsPerSecond, cfg.RefusedReviewBurst, cfg.CacheSize, cfg.Clock)}
	d.tokens = newTokenCache(cfg.CacheSize, cfg.Clock)
	d.access = newAccessCache(cfg.CacheSize, cfg.Clock)
	return d
}

func setDefault(d *time.Duration, v time.Duration) {
	if *d <= 0 {
		*d = v
	}
}

// Describe and Collect make the reviews' metrics a prometheus.Collector, which the agent
// registers with its own.
func (d *Delegating) Describe(ch chan<- *prometheus.Desc) { d.metrics.describe(ch) }

// Collect implements prometheus.Collector.
func (d *Delegating) Collect(ch chan<- prometheus.Metric) { d.metrics.collect(ch) }

// Audience is the audience callers' tokens must be issued for.
func (d *Delegating) Audience() string { return d.cfg.Audience }
