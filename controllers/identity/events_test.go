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

package identity_test

import (
	"context"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/identity"
)

// A lane enqueues the identity it names only when it can change that identity's status, never
// for its own status writes.
func TestALaneEnqueuesOnlyTheIdentityItNamesWhenItMatters(t *testing.T) {
	lane := func(id string, mutate ...func(*v1.CatalogLane)) *v1.CatalogLane {
		l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns"}, Spec: v1.CatalogLaneSpec{IdentityRef: v1.LocalObjectReference{Name: id}}}
		for _, m := range mutate {
			m(l)
		}
		return l
	}
	for name, tc := range map[string]struct {
		old, cur *v1.CatalogLane
		want     []string
	}{
		"status written": {lane("a"), lane("a", func(l *v1.CatalogLane) { l.Status.ReadyReplicas = 1 }), nil},
		"replicas":       {lane("a"), lane("a", func(l *v1.CatalogLane) { l.Spec.Replicas = 3 }), nil},
		"renamed":        {lane("a"), lane("b"), []string{"a", "b"}},
		"being deleted":  {lane("a"), lane("a", func(l *v1.CatalogLane) { now := metav1.Now(); l.DeletionTimestamp = &now }), []string{"a"}},
	} {
		t.Run(name, func(t *testing.T) {
			q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
			defer q.ShutDown()
			identity.LaneEvents().Update(context.Background(), event.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.cur}, q)
			var got []string
			for q.Len() > 0 {
				r, _ := q.Get()
				got = append(got, r.Name)
				q.Done(r)
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("enqueued %v, want %v", got, tc.want)
			}
		})
	}
	// A new lane enqueues its identity after LanesInterval, once for a burst of them.
	clk := clocktesting.NewFakeClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Clock: clk})
	defer q.ShutDown()
	for range 100 {
		identity.LaneEvents().Create(context.Background(), event.CreateEvent{Object: lane("a")}, q)
	}
	if q.Len() != 0 {
		t.Fatalf("a new lane enqueued its identity at once: %d", q.Len())
	}
	clk.Step(identity.LanesInterval)
	if err := wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return q.Len() > 0, nil
	}); err != nil {
		t.Fatal("the identity was not enqueued after LanesInterval")
	}
	if r, _ := q.Get(); r.Name != "a" || q.Len() != 0 {
		t.Errorf("100 new lanes enqueued %v and %d more", r, q.Len())
	}
	// A lane deleted may be what the identity's deletion waits for: at once.
	identity.LaneEvents().Delete(context.Background(), event.DeleteEvent{Object: lane("b")}, q)
	if q.Len() != 1 {
		t.Errorf("a lane deleted enqueued %d", q.Len())
	}
}

// Only a placement that is gone enqueues the identity it ran (the last one may have kept the
// identity's deletion); its creation and its status writes do not.
func TestOnlyAPlacementGoneEnqueuesItsIdentity(t *testing.T) {
	p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: v1.LanePlacementSpec{Identity: "gte"}}
	written := p.DeepCopy()
	written.Status.Phase = v1.PhaseReady
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	h := identity.PlacementGone()
	h.Create(context.Background(), event.CreateEvent{Object: p}, q)
	h.Update(context.Background(), event.UpdateEvent{ObjectOld: p, ObjectNew: written}, q)
	if q.Len() != 0 {
		t.Fatalf("a placement created or written enqueued %d", q.Len())
	}
	h.Delete(context.Background(), event.DeleteEvent{Object: written}, q)
	if r, _ := q.Get(); r.Name != "gte" || q.Len() != 0 {
		t.Errorf("a placement gone enqueued %v and %d more", r, q.Len())
	}
}

func TestOnlyANodeChangeOfWorkerOrPlatformReconcilesTheIdentities(t *testing.T) {
	n := &v1.MacNode{Status: v1.MacNodeStatus{Platform: v1.Platform{MacOSBuild: "25B78"}, Worker: v1.NodeWorker{Backend: v1.BackendSim}}}
	for name, tc := range map[string]struct {
		change func(*v1.MacNode)
		want   bool
	}{
		"allocation":  {func(n *v1.MacNode) { n.Status.Allocated.LayerExecutables = 40 }, false},
		"queue":       {func(n *v1.MacNode) { n.Status.CompileQueue.Length = 2 }, false},
		"macOS build": {func(n *v1.MacNode) { n.Status.Platform.MacOSBuild = "25C56" }, true},
		"worker":      {func(n *v1.MacNode) { n.Status.Worker.BinaryDigest = "sha256:ab" }, true},
	} {
		cur := n.DeepCopy()
		tc.change(cur)
		if got := identity.NodeChanges.Update(event.UpdateEvent{ObjectOld: n, ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: %v, want %v", name, got, tc.want)
		}
	}
}
