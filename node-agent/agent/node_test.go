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
	"errors"
	"testing"
	"time"

	"github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// A renewal is one request: the Lease the heartbeat last wrote is updated without reading it
// first. A failed update says the copy is stale only when the API server answers conflict or
// not found; a renewal that was throttled, refused, timed out or cancelled keeps its copy, and
// the next one is again a single update.
func TestALeaseRenewalReadsItsLeaseAgainOnlyAfterAConflictOrNotFound(t *testing.T) {
	scheme := k8sruntime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	calls := map[string]int{}
	var failNext error // the next Update's answer, after it did (landed) or did not write
	landed := false
	base := fake.NewClientBuilder().WithScheme(scheme).Build()
	kube := interceptor.NewClient(base, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			calls["get"]++
			return c.Get(ctx, key, obj, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			calls["create"]++
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			calls["update"]++
			if err := failNext; err != nil {
				failNext = nil
				if landed {
					landed = false
					if uerr := c.Update(ctx, obj.DeepCopyObject().(client.Object), opts...); uerr != nil {
						t.Fatalf("the landing update failed: %v", uerr)
					}
				}
				return err
			}
			return c.Update(ctx, obj, opts...)
		},
	})
	clk := clocktesting.NewFakeClock(epoch)
	a := &Agent{cfg: Config{NodeName: "mac-1", LeaseDuration: 30 * time.Second, Clock: clk}, kube: kube}
	renew := func() error { clk.Step(10 * time.Second); return a.renew(context.Background()) }
	expect := func(step string, want map[string]int) {
		t.Helper()
		for k, v := range want {
			if calls[k] != v {
				t.Fatalf("%s: calls %v, want %v", step, calls, want)
			}
		}
	}
	stored := func() *coordinationv1.Lease {
		t.Helper()
		l := &coordinationv1.Lease{}
		if err := base.Get(context.Background(), client.ObjectKey{Namespace: LeaseNamespace, Name: "mac-1"}, l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	// renewedNow checks that the stored Lease is held by the agent and was renewed now.
	renewedNow := func(what string) {
		t.Helper()
		if got := stored(); *got.Spec.HolderIdentity != "mac-1" || !got.Spec.RenewTime.Time.Equal(clk.Now()) {
			t.Fatalf("%s: the Lease is %+v, want held by mac-1 and renewed now", what, got.Spec)
		}
	}

	if err := renew(); err != nil {
		t.Fatal(err)
	}
	expect("the first renewal", map[string]int{"get": 1, "create": 1, "update": 0})
	for range 3 {
		if err := renew(); err != nil {
			t.Fatal(err)
		}
	}
	expect("renewals", map[string]int{"get": 1, "create": 1, "update": 3})

	for _, failure := range []error{
		apierrors.NewTooManyRequests("the API server is throttling", 1),
		apierrors.NewTimeoutError("the request did not complete", 1),
		apierrors.NewServiceUnavailable("the API server is unavailable"),
		context.Canceled,
		ErrLeaseRenewTimeout,
	} {
		before := calls["update"]
		failNext = failure
		if err := renew(); !errors.Is(err, failure) {
			t.Fatalf("a renewal answered %v returned %v", failure, err)
		}
		if err := renew(); err != nil {
			t.Fatalf("the renewal after one answered %v: %v", failure, err)
		}
		expect("after "+failure.Error(), map[string]int{"get": 1, "update": before + 2})
	}
	// A run of failures, as a whole renewal's attempts against a saturated API server: still
	// one update each, never a read.
	before := calls["update"]
	for range renewAttempts {
		failNext = apierrors.NewTimeoutError("the API server is saturated", 1)
		if err := renew(); !apierrors.IsTimeout(err) {
			t.Fatalf("a renewal that timed out returned %v", err)
		}
	}
	if err := renew(); err != nil {
		t.Fatal(err)
	}
	expect("after a run of timeouts", map[string]int{"get": 1, "update": before + renewAttempts + 1})
	renewedNow("after the failures")

	// An update that landed but whose answer was lost (a timeout): the copy is stale, the next
	// renewal conflicts and the one after reads the Lease afresh.
	failNext, landed = apierrors.NewTimeoutError("the answer was lost", 1), true
	if err := renew(); err == nil {
		t.Fatal("a renewal whose answer was lost succeeded")
	}
	if err := renew(); !apierrors.IsConflict(err) {
		t.Fatalf("the renewal after a landed update returned %v, want a conflict", err)
	}
	expect("after a conflict", map[string]int{"get": 1})
	if err := renew(); err != nil {
		t.Fatal(err)
	}
	expect("the renewal after a conflict", map[string]int{"get": 2})

	// Someone else writes the Lease: the same, a conflict then a read.
	other := stored()
	other.Spec.HolderIdentity = ptr.To("intruder")
	if err := base.Update(context.Background(), other); err != nil {
		t.Fatal(err)
	}
	if err := renew(); !apierrors.IsConflict(err) {
		t.Fatalf("a renewal over a Lease written meanwhile returned %v, want a conflict", err)
	}
	if err := renew(); err != nil {
		t.Fatal(err)
	}
	expect("after an intruder", map[string]int{"get": 3})
	renewedNow("after an intruder")

	// The Lease is deleted: not found, then read (not found) and created again.
	if err := base.Delete(context.Background(), stored()); err != nil {
		t.Fatal(err)
	}
	if err := renew(); !apierrors.IsNotFound(err) {
		t.Fatalf("a renewal of a deleted Lease returned %v, want not found", err)
	}
	creates := calls["create"]
	if err := renew(); err != nil {
		t.Fatal(err)
	}
	expect("after a deletion", map[string]int{"get": 4, "create": creates + 1})
	renewedNow("after a deletion")
}

// The node's progress (allocation, lanes, queue) is written at most every NodeProgressInterval;
// a change of what placement reads, within StatusInterval.
func TestTheNodesProgressIsCoalescedLongerThanItsConditions(t *testing.T) {
	first, second := testPlacement("gte"), testPlacement("bge")
	a, clk, _ := newTestAgent(t, first, second)
	ctx := context.Background()
	book := newStatusBook()
	loadReady(t, a, first)
	a.statusPass(ctx, book)
	node := func() *v1.MacNode {
		t.Helper()
		n := &v1.MacNode{}
		if err := a.kube.Get(ctx, client.ObjectKey{Name: "mac-1"}, n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := node().Status.Lanes; got != 1 {
		t.Fatalf("the node reports %d lanes, want 1", got)
	}

	loadReady(t, a, second) // progress: a lane more, more executables allocated
	clk.Step(a.cfg.StatusInterval)
	a.statusPass(ctx, book)
	if got := node().Status.Lanes; got != 1 {
		t.Fatalf("progress was written within %s: %d lanes", NodeProgressInterval, got)
	}
	clk.Step(NodeProgressInterval)
	a.statusPass(ctx, book)
	if got := node().Status.Lanes; got != 2 {
		t.Fatalf("progress was not written after %s: %d lanes", NodeProgressInterval, got)
	}

	a.mu.Lock()
	a.paused = true // a condition placement reads
	a.mu.Unlock()
	clk.Step(a.cfg.StatusInterval)
	a.statusPass(ctx, book)
	if !meta.IsStatusConditionTrue(node().Status.Conditions, v1.NodeConditionPaused) {
		t.Fatalf("a pause was not written within %s", a.cfg.StatusInterval)
	}
}

// The agent reads its MacNode from the informer's cache, which may not yet show a condition a
// controller has just written (AddressAllowed, Ready). It applies only its own fields and
// condition types, so a pass on the stale copy writes at once and neither erases nor reverts
// the controllers' conditions, nor writes a Ready of its own.
func TestTheNodeStatusNeverErasesAConditionWrittenSinceTheCachedCopy(t *testing.T) {
	a, clk, _ := newTestAgent(t)
	ctx := context.Background()
	book := newStatusBook()
	a.statusPass(ctx, book)
	stale := &v1.MacNode{}
	if err := a.kube.Get(ctx, client.ObjectKey{Name: "mac-1"}, stale); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(stale.Status.Conditions, v1.ConditionReady); c != nil {
		t.Fatalf("the agent wrote the node's Ready condition, which the Lease decides: %+v", c)
	}
	if !meta.IsStatusConditionTrue(stale.Status.Conditions, v1.NodeConditionAgentReady) {
		t.Fatalf("the agent did not report AgentReady: %+v", stale.Status.Conditions)
	}
	for _, c := range []metav1.Condition{
		{Type: v1.NodeConditionAddressAllowed, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAddressAllowed, Message: "written by the controller"},
		{Type: v1.ConditionReady, Status: metav1.ConditionUnknown, Reason: v1.NodeReasonLeaseExpired, Message: "written by the controller"},
	} {
		c.LastTransitionTime = metav1.NewTime(clk.Now())
		if err := statusapply.ApplyCondition(ctx, a.kube, "mac-1", statusapply.Manager("controller", c.Type), c); err != nil {
			t.Fatal(err)
		}
	}

	real := a.kube
	staleReads := 1
	a.kube = interceptor.NewClient(real.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if n, ok := obj.(*v1.MacNode); ok && staleReads > 0 {
				staleReads--
				stale.DeepCopyInto(n)
				return nil
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	a.mu.Lock()
	a.paused = true
	a.mu.Unlock()
	clk.Step(a.cfg.StatusInterval)
	if n := a.statusPass(ctx, book); n != 1 {
		t.Errorf("a pass on a stale copy wrote %d objects, want the node", n)
	}
	got := &v1.MacNode{}
	if err := real.Get(ctx, client.ObjectKey{Name: "mac-1"}, got); err != nil {
		t.Fatal(err)
	}
	if meta.FindStatusCondition(got.Status.Conditions, v1.NodeConditionAddressAllowed) == nil {
		t.Errorf("the agent erased the controller's AddressAllowed condition: %+v", got.Status.Conditions)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady); c == nil || c.Status != metav1.ConditionUnknown {
		t.Errorf("the agent changed the controller's Ready condition: %+v", got.Status.Conditions)
	}
	if !meta.IsStatusConditionTrue(got.Status.Conditions, v1.NodeConditionPaused) {
		t.Errorf("the pause was not written from the stale copy: %+v", got.Status.Conditions)
	}
}

// A placement's status has three writers: the agent, the lifecycle controller (NodeReady) and
// the endpoints controller (Drained). The agent applies only its own fields and condition
// types, so a pass on a cached copy that does not show the controller's NodeReady=False yet
// neither reverts nor erases it; a condition the agent stops reporting (Terminating, once it
// is no longer stopping) is removed.
func TestThePlacementStatusNeverRevertsTheControllersConditions(t *testing.T) {
	p := testPlacement("gte")
	a, clk, _ := newTestAgent(t, p)
	ctx := context.Background()
	loadReady(t, a, p)
	book := newStatusBook()
	a.statusPass(ctx, book)
	key := client.ObjectKeyFromObject(p)
	stale := &v1.LanePlacement{}
	if err := a.kube.Get(ctx, key, stale); err != nil {
		t.Fatal(err)
	}
	if !meta.IsStatusConditionTrue(stale.Status.Conditions, v1.ConditionReady) {
		t.Fatalf("the placement is not Ready to begin with: %+v", stale.Status.Conditions)
	}
	// The lifecycle controller marks it, as it does, on a fresh copy with an optimistic lock.
	fresh := stale.DeepCopy()
	meta.SetStatusCondition(&fresh.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionNodeReady, Status: metav1.ConditionFalse,
		Reason: v1.PlacementReasonNodeUnknown, Message: "the node is Unknown", LastTransitionTime: metav1.NewTime(clk.Now())})
	if err := a.kube.Status().Patch(ctx, fresh, client.MergeFromWithOptions(stale, client.MergeFromWithOptimisticLock{})); err != nil {
		t.Fatal(err)
	}

	real := a.kube
	staleReads := 1
	a.kube = interceptor.NewClient(real.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if lp, ok := obj.(*v1.LanePlacement); ok && staleReads > 0 {
				staleReads--
				stale.DeepCopyInto(lp)
				return nil
			}
			return c.Get(ctx, k, obj, opts...)
		},
	})
	stopping := func(on bool) {
		a.mu.Lock()
		a.stopping = on
		a.mu.Unlock()
	}
	stopping(true)
	clk.Step(a.cfg.StatusInterval)
	a.statusPass(ctx, book)
	got := &v1.LanePlacement{}
	if err := real.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1.PlacementConditionNodeReady); c == nil || c.Status != metav1.ConditionFalse {
		t.Errorf("the agent's write from a stale copy reverted the controller's NodeReady: %+v", got.Status.Conditions)
	}
	if !meta.IsStatusConditionTrue(got.Status.Conditions, v1.PlacementConditionTerminating) {
		t.Errorf("the agent's Terminating was not written: %+v", got.Status.Conditions)
	}

	stopping(false)
	clk.Step(a.cfg.StatusInterval)
	a.statusPass(ctx, book)
	if err := real.Get(ctx, key, got); err != nil {
		t.Fatal(err)
	}
	if meta.FindStatusCondition(got.Status.Conditions, v1.PlacementConditionTerminating) != nil {
		t.Errorf("the Terminating condition the agent no longer reports is still there: %+v", got.Status.Conditions)
	}
	if meta.FindStatusCondition(got.Status.Conditions, v1.PlacementConditionNodeReady) == nil {
		t.Errorf("the controller's NodeReady is gone: %+v", got.Status.Conditions)
	}
}

// A placement's progress (the layers compiled, the prewarm's counts, the conditions' messages)
// is written at most every DefaultPlacementProgressInterval; a change of phase, condition, shapes or
// of the shape being compiled, within StatusInterval.
func TestAPlacementsProgressIsCoalescedLongerThanItsPhase(t *testing.T) {
	base := v1.LanePlacementStatus{Phase: v1.PhaseCompiling, ResidentShapes: []v1.Rung{128},
		Compile:    &v1.CompileProgress{Rung: 256, LayersDone: 3, LayersTotal: 12},
		Prewarm:    &v1.PrewarmSummary{State: "Running", Compiled: 1},
		Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: "Compiling", Message: "compiling rung 256: 3 of 12 layers"}}}
	for name, tc := range map[string]struct {
		change   func(*v1.LanePlacementStatus)
		progress bool
	}{
		"layers done":    {func(st *v1.LanePlacementStatus) { st.Compile.LayersDone = 4 }, true},
		"predicted time": {func(st *v1.LanePlacementStatus) { st.Compile.PredictedReadyTime = &metav1.Time{Time: epoch} }, true},
		"prewarm counts": {func(st *v1.LanePlacementStatus) { st.Prewarm.Compiled, st.Prewarm.Loaded = 2, []v1.Rung{128} }, true},
		"layers message": {func(st *v1.LanePlacementStatus) { st.Conditions[0].Message = "compiling rung 256: 4 of 12 layers" }, true},
		"another message": {func(st *v1.LanePlacementStatus) {
			st.Conditions[0].Reason, st.Conditions[0].Message = v1.PlacementReasonAwaitingServingCertificate, "the certificate does not name the Service"
		}, false},
		"another rung":    {func(st *v1.LanePlacementStatus) { st.Compile.Rung = 512 }, false},
		"compile done":    {func(st *v1.LanePlacementStatus) { st.Compile = nil }, false},
		"resident shapes": {func(st *v1.LanePlacementStatus) { st.ResidentShapes = []v1.Rung{128, 256} }, false},
		"phase":           {func(st *v1.LanePlacementStatus) { st.Phase = v1.PhaseReady }, false},
		"prewarm state":   {func(st *v1.LanePlacementStatus) { st.Prewarm.State = "Finished" }, false},
		"condition":       {func(st *v1.LanePlacementStatus) { st.Conditions[0].Status = metav1.ConditionTrue }, false},
		"fault": {func(st *v1.LanePlacementStatus) {
			st.LastFault = &v1.Fault{Code: "engine_crashed", Message: "the worker exited"}
		}, false},
	} {
		cur := *base.DeepCopy()
		tc.change(&cur)
		if got := placementProgressOnly(base, cur); got != tc.progress {
			t.Errorf("%s: progress only %v, want %v", name, got, tc.progress)
		}
	}

	// Through the status writer: a stored status that differs from the agent's in progress
	// alone (here a prewarm count) waits for the progress interval.
	p := testPlacement("gte")
	p.Spec.PrewarmRungs = []v1.Rung{128}
	a, clk, _ := newTestAgent(t, p)
	loadReady(t, a, p)
	ctx := context.Background()
	key := client.ObjectKeyFromObject(p)
	got := &v1.LanePlacement{}
	book := newStatusBook()
	// Every pass due; the one that writes the finished prewarm is the book's last write, now.
	gomega.NewWithT(t).Eventually(func() string {
		clk.Step(a.cfg.PlacementProgressInterval)
		a.statusPass(ctx, book)
		if err := a.kube.Get(ctx, key, got); err != nil || got.Status.Prewarm == nil {
			return ""
		}
		return got.Status.Prewarm.State
	}).WithTimeout(10 * time.Second).Should(gomega.Equal("Finished"))
	// The smallest rung is resident for the self-check: the prewarm found it so. (A count the
	// agent reports as zero is left out of its apply, so a changed one would stay changed.)
	want := got.Status.Prewarm.AlreadyResident
	if want == 0 {
		t.Fatalf("the prewarm of the resident rung reports %+v", got.Status.Prewarm)
	}
	got.Status.Prewarm.AlreadyResident = want + 5
	if err := a.kube.Status().Update(ctx, got); err != nil {
		t.Fatal(err)
	}
	resident := func() int32 {
		t.Helper()
		if err := a.kube.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		return got.Status.Prewarm.AlreadyResident
	}
	clk.Step(a.cfg.StatusInterval)
	a.statusPass(ctx, book)
	if n := resident(); n != want+5 {
		t.Fatalf("progress was written within %s: %d already resident", a.cfg.PlacementProgressInterval, n)
	}
	clk.Step(a.cfg.PlacementProgressInterval)
	a.statusPass(ctx, book)
	if n := resident(); n != want {
		t.Fatalf("progress was not written after %s: %d already resident, want %d", a.cfg.PlacementProgressInterval, n, want)
	}
}
