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
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sync/singleflight"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/utils/clock"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// Access is what a caller asks to do: call a lane's endpoint (Namespace, Lane and Subresource,
// embeddings or rerank: verb create on cataloglanes/<subresource>), or, when Path is set, get a
// path that is no resource (/metrics), as the API server's own paths are authorized.
type Access struct {
	Namespace, Lane, Subresource string
	Path                         string
}

// accessCache holds decisions by the caller and the access, one review at a time per key.
// Allowed and denied decisions are kept in caches of their own, each bounded, so that no number
// of denied asks evicts an allowed decision.
type accessCache struct {
	allowed, denied *cache.LRUExpireCache
	flight          singleflight.Group
}

type accessVerdict struct {
	allowed bool
	reason  string
}

func newAccessCache(size int, clk clock.PassiveClock) *accessCache {
	return &accessCache{allowed: cache.NewLRUExpireCacheWithClock(size, clk), denied: cache.NewLRUExpireCacheWithClock(size, clk)}
}

// get is the cached decision for key, if any.
func (c *accessCache) get(key string) (accessVerdict, bool) {
	if v, ok := c.allowed.Get(key); ok {
		return v.(accessVerdict), true
	}
	if v, ok := c.denied.Get(key); ok {
		return v.(accessVerdict), true
	}
	return accessVerdict{}, false
}

// Authorize says whether u may do a. reason is the API server's, for the log and the caller's
// 403. err is set when no decision could be made: the caller answers 503 and nothing is cached.
func (d *Delegating) Authorize(ctx context.Context, u user.Info, a Access) (allowed bool, reason string, err error) {
	key := accessKey(u, a)
	if v, ok := d.access.get(key); ok {
		d.metrics.authz.WithLabelValues(verdict(v.allowed)).Inc()
		return v.allowed, v.reason, nil
	}
	res, err := wait(ctx, &d.access.flight, key, func() (any, error) {
		// Only an authenticated caller asks: any free slot will do.
		release, err := d.acquire(false)
		if err != nil {
			return nil, err
		}
		defer release()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ReviewTimeout)
		defer cancel()
		sar, err := d.cfg.SubjectAccessReviews.SubjectAccessReviews().Create(ctx, subjectAccessReview(u, a), metav1.CreateOptions{})
		d.metrics.reviewed("SubjectAccessReview", err)
		if err != nil {
			return nil, fmt.Errorf("reviewing %s's access: %w", u.GetName(), err)
		}
		// Denied, or no opinion: either way not allowed.
		v := accessVerdict{allowed: sar.Status.Allowed && !sar.Status.Denied, reason: sar.Status.Reason}
		if v.allowed {
			d.access.denied.Remove(key)
			d.access.allowed.Add(key, v, d.cfg.AllowedTTL)
		} else {
			d.access.allowed.Remove(key)
			d.access.denied.Add(key, v, d.cfg.DeniedTTL)
		}
		return v, nil
	})
	if err != nil {
		d.metrics.authz.WithLabelValues("error").Inc()
		return false, "", err
	}
	v := res.(accessVerdict)
	d.metrics.authz.WithLabelValues(verdict(v.allowed)).Inc()
	return v.allowed, v.reason, nil
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// subjectAccessReview asks whether u may do a, as the apiserver's webhook authorizer asks.
func subjectAccessReview(u user.Info, a Access) *authorizationv1.SubjectAccessReview {
	spec := authorizationv1.SubjectAccessReviewSpec{User: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups()}
	if extra := u.GetExtra(); len(extra) > 0 {
		spec.Extra = make(map[string]authorizationv1.ExtraValue, len(extra))
		for k, v := range extra {
			spec.Extra[k] = v
		}
	}
	if a.Path != "" {
		spec.NonResourceAttributes = &authorizationv1.NonResourceAttributes{Path: a.Path, Verb: "get"}
	} else {
		spec.ResourceAttributes = &authorizationv1.ResourceAttributes{Namespace: a.Namespace, Verb: "create",
			Group: v1.GroupVersion.Group, Resource: "cataloglanes", Subresource: a.Subresource, Name: a.Lane}
	}
	return &authorizationv1.SubjectAccessReview{Spec: spec}
}

// accessKey is every part of the review that can change its answer, each field ended by a
// byte no Kubernetes name holds.
func accessKey(u user.Info, a Access) string {
	var b strings.Builder
	for _, s := range []string{u.GetName(), u.GetUID(), a.Namespace, a.Lane, a.Subresource, a.Path} {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, g := range u.GetGroups() {
		b.WriteString(g)
		b.WriteByte(1)
	}
	if extra := u.GetExtra(); len(extra) > 0 {
		keys := make([]string, 0, len(extra))
		for k := range extra {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			b.WriteByte(2)
			b.WriteString(k)
			for _, v := range extra[k] {
				b.WriteByte(3)
				b.WriteString(v)
			}
		}
	}
	return b.String()
}
