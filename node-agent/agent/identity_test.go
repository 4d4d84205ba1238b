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

package agent

import (
	"context"
	"sync/atomic"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// countIdentityReads has the agent's client count its reads of CertifiedIdentities, and fail
// the test on a list or a watch of them (the agent's role grants neither: a watch of them would
// not start under the node identity the e2e suite runs agents as).
func countIdentityReads(t *testing.T, a *Agent) *atomic.Int64 {
	t.Helper()
	var reads atomic.Int64
	a.kube = interceptor.NewClient(a.kube.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*v1.CertifiedIdentity); ok {
				reads.Add(1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*v1.CertifiedIdentityList); ok {
				t.Error("the agent listed CertifiedIdentities")
			}
			return c.List(ctx, list, opts...)
		},
		Watch: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) (watch.Interface, error) {
			if _, ok := list.(*v1.CertifiedIdentityList); ok {
				t.Error("the agent watched CertifiedIdentities")
			}
			return c.Watch(ctx, list, opts...)
		},
	})
	return &reads
}

func TestAnIdentityIsReadOncePerLaneAndItsStatusWritesReachNoAgent(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	ctx := context.Background()
	id := testIdentity.DeepCopy()
	if err := a.kube.Create(ctx, id); err != nil {
		t.Fatal(err)
	}
	reads := countIdentityReads(t, a)
	r := &reconciler{a: a}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, a.entry(p), laneReady)

	// The identity's status changes as lanes come and go (its lane count, every few seconds
	// while a fleet's lanes are applied); the spec it loaded with cannot.
	id.Status.LaneCount = 7
	if err := a.kube.Update(ctx, id); err != nil { // the fake keeps no status subresource for identities
		t.Fatal(err)
	}
	for range 3 {
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if got := reads.Load(); got != 1 {
		t.Fatalf("the identity was read %d times for one lane, want once", got)
	}

	// The lane placed here again under the same name (the agent missed the placement's
	// deletion): another placement, whose identity is read afresh.
	again := &v1.LanePlacement{}
	if err := a.kube.Get(ctx, req.NamespacedName, again); err != nil {
		t.Fatal(err)
	}
	if err := a.kube.Delete(ctx, again); err != nil {
		t.Fatal(err)
	}
	again = p.DeepCopy()
	again.UID, again.ResourceVersion = "placed-again", ""
	if err := a.kube.Create(ctx, again); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := reads.Load(); got != 2 {
		t.Fatalf("the identity was read %d times for two placements of one name, want twice", got)
	}
}

func TestALaneItsNodeDoesNotRunReadsItsIdentityOnce(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	ctx := context.Background()
	other := testIdentity.DeepCopy()
	other.Spec.MacOSBuild = "25C56" // the node runs 25B78
	if err := a.kube.Create(ctx, other); err != nil {
		t.Fatal(err)
	}
	reads := countIdentityReads(t, a)
	r := &reconciler{a: a}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}}
	// Every change of the node's MacNode reconciles each of its placements.
	for range 3 {
		if _, err := r.Reconcile(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if got := reads.Load(); got != 1 {
		t.Fatalf("the identity of a lane that does not load was read %d times, want once", got)
	}
	l := a.entry(p)
	a.mu.Lock()
	defer a.mu.Unlock()
	if l.failure == nil || l.failure.Code != "IdentityMismatch" {
		t.Fatalf("the lane's failure is %+v, want IdentityMismatch", l.failure)
	}
}

func TestALaneWhoseIdentityIsMissingIsLookedAtAgainWithoutAWatch(t *testing.T) {
	p := testPlacement("gte")
	p.Spec.Identity = "absent"
	a, _, _ := newTestAgent(t, p)
	reads := countIdentityReads(t, a)
	r := &reconciler{a: a}
	req := reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}}
	for i := range 2 {
		res, err := r.Reconcile(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if res.RequeueAfter != RetryInterval {
			t.Fatalf("a lane whose identity is missing comes back after %s, want %s: no watch brings the identity", res.RequeueAfter, RetryInterval)
		}
		// Each look reads the identity afresh: a copy is kept only once one was found.
		if got := reads.Load(); got != int64(i+1) {
			t.Fatalf("look %d read the identity %d times", i+1, got)
		}
	}
	l := a.entry(p)
	a.mu.Lock()
	defer a.mu.Unlock()
	if l.failure == nil || l.failure.Code != "IdentityNotFound" {
		t.Fatalf("the lane's failure is %+v, want IdentityNotFound", l.failure)
	}
}
