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

package nodeidentity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

var (
	// ErrRevoked: the API server no longer accepts the Mac's token (its ServiceAccount was
	// deleted, or the token is not one the API server issued). Join the Mac again.
	ErrRevoked = errors.New("the node identity is revoked")
	// ErrExpired: the token expired before it could be renewed. Join the Mac again.
	ErrExpired = errors.New("the node's token has expired")
)

const (
	// FirstRetry and MaxRetry bound the wait between failed renewals: doubling from the first,
	// never more than the last.
	FirstRetry = 5 * time.Second
	MaxRetry   = 5 * time.Minute
)

// TokenRequester is the part of the API the Renewer calls: a TokenRequest for a
// ServiceAccount (kubernetes.Interface's CoreV1().ServiceAccounts(ns) is one).
type TokenRequester interface {
	CreateToken(ctx context.Context, serviceAccountName string, tr *authenticationv1.TokenRequest, opts metav1.CreateOptions) (*authenticationv1.TokenRequest, error)
}

// TokensFor requests tokens from the API server of cfg, authenticated by the given token
// rather than cfg's credentials: client-go re-reads a token file only every minute, and a
// renewal must use the token on disk now (a Mac joined again has a new one).
func TokensFor(cfg *rest.Config) func(token string) (TokenRequester, error) {
	return func(token string) (TokenRequester, error) {
		c := rest.AnonymousClientConfig(cfg)
		c.BearerToken = token
		cs, err := kubernetes.NewForConfig(c)
		if err != nil {
			return nil, err
		}
		return cs.CoreV1().ServiceAccounts(Namespace), nil
	}
}

// Renewer keeps a Mac's token file fresh: after 80% of a token's lifetime it requests a new one
// for the same ServiceAccount and lifetime, authenticated by the current token, and replaces
// the file atomically. A failed renewal is retried, waiting FirstRetry doubling up to
// MaxRetry; each attempt re-reads the file, so a Mac joined again picks up its new token
// without a restart. Time comes from Clock.
type Renewer struct {
	Clock clock.Clock
	// Tokens returns what requests tokens in Namespace authenticated by token, the current one
	// (TokensFor builds it from the agent's rest.Config).
	Tokens func(token string) (TokenRequester, error)
	// Path is the token file.
	Path string
	Log  logr.Logger

	mu       sync.Mutex
	err      error
	renewals int
	// written is the last token this renewer wrote and next when it renews it, timed by Clock
	// from when it was obtained: the token's own issue time is the API server's clock, and an
	// agent clock ahead of it must not renew again at once.
	written string
	next    time.Time
}

// Status is how many renewals succeeded and the last attempt's error (nil once one succeeded;
// ErrRevoked or ErrExpired wrap the ones only a new join fixes).
func (r *Renewer) Status() (renewals int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.renewals, r.err
}

// Current reads the token file's claims.
func (r *Renewer) Current() (string, Claims, error) {
	data, err := os.ReadFile(r.Path)
	if err != nil {
		return "", Claims{}, fmt.Errorf("reading the token: %w", err)
	}
	c, err := ParseClaims(string(data))
	if err != nil {
		return "", Claims{}, fmt.Errorf("the token in %s: %w", r.Path, err)
	}
	return string(data), c, nil
}

// Run renews the token until ctx ends. It returns early only if the token file cannot be read
// as a ServiceAccount token at the start.
func (r *Renewer) Run(ctx context.Context) error {
	if _, _, err := r.Current(); err != nil {
		return err
	}
	retry := time.Duration(0)
	for {
		token, claims, err := r.Current()
		renewAt := claims.RenewAt()
		if err == nil && token == r.written {
			renewAt = r.next
		}
		wait := time.Duration(0)
		switch {
		case err != nil:
			r.fail(err)
			wait = r.backoff(&retry)
		case r.Clock.Now().Before(renewAt):
			wait = renewAt.Sub(r.Clock.Now())
		default:
			if err := r.renew(ctx, token, claims); err != nil {
				r.fail(err)
				wait = r.backoff(&retry)
			} else {
				retry = 0
				continue // the new token's renewal time
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.Clock.After(wait):
		}
	}
}

// backoff returns the next wait after a failure: FirstRetry, doubling, at most MaxRetry.
func (r *Renewer) backoff(retry *time.Duration) time.Duration {
	*retry = min(max(*retry*2, FirstRetry), MaxRetry)
	return *retry
}

// renew requests a token like the current one, authenticated by it, and writes it.
func (r *Renewer) renew(ctx context.Context, token string, current Claims) error {
	lifetime := min(max(current.Lifetime().Round(time.Second), MinLifetime), MaxLifetime)
	tokens, err := r.Tokens(strings.TrimSpace(token))
	if err != nil {
		return err
	}
	tr, err := tokens.CreateToken(ctx, current.ServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(lifetime / time.Second))}}, metav1.CreateOptions{})
	now := r.Clock.Now()
	switch {
	case err == nil:
	case apierrors.IsUnauthorized(err) && now.Before(current.Expiry):
		return fmt.Errorf("%w: renewing the token of %s/%s: %w", ErrRevoked, current.Namespace, current.ServiceAccount, err)
	case !now.Before(current.Expiry):
		return fmt.Errorf("%w (at %s): renewing the token of %s/%s: %w", ErrExpired, current.Expiry.UTC().Format(time.RFC3339),
			current.Namespace, current.ServiceAccount, err)
	default:
		return fmt.Errorf("renewing the token of %s/%s (it expires at %s): %w", current.Namespace, current.ServiceAccount,
			current.Expiry.UTC().Format(time.RFC3339), err)
	}
	next, err := ParseClaims(tr.Status.Token)
	if err != nil {
		return fmt.Errorf("the renewed token: %w", err)
	}
	if err := writeFileAtomic(r.Path, []byte(tr.Status.Token)); err != nil {
		return err
	}
	r.written, r.next = tr.Status.Token, now.Add(next.Lifetime()*8/10)
	r.mu.Lock()
	r.err = nil
	r.renewals++
	r.mu.Unlock()
	r.Log.Info("renewed the node's token", "serviceAccount", current.ServiceAccount, "expires", next.Expiry.UTC().Format(time.RFC3339))
	return nil
}

// fail records a failed renewal, saying so in the log when it is a new kind of failure.
func (r *Renewer) fail(err error) {
	r.mu.Lock()
	same := r.err != nil && r.err.Error() == err.Error()
	r.err = err
	r.mu.Unlock()
	if !same {
		r.Log.Error(err, "cannot renew the node's token; retrying (a revoked or expired Mac must be joined again)")
	}
}
