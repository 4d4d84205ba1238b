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

// Package identity keeps each CertifiedIdentity's status (how many nodes match it, which lanes
// use it) and blocks its deletion while a lane references it or a placement runs it: a lane
// that moved to another identity keeps its old placements until the rollout retires them.
package identity

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/enqueue"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/names"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=certifiedidentities,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=certifiedidentities/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=certifiedidentities/finalizers,verbs=update
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements,verbs=get;list;watch

// LanesInterval is the least time between two status writes that only change which lanes use
// the identity: a burst of lanes applied at once is a write every LanesInterval rather than one
// per lane. A change of the matching nodes or of a condition is written at once.
const LanesInterval = 5 * time.Second

// Controller reconciles CertifiedIdentities.
type Controller struct {
	clk      clock.PassiveClock
	kube     client.Client
	recorder events.EventRecorder

	mu sync.Mutex
	// wrote is when each identity's status was last written.
	wrote map[string]time.Time
}

// NewController returns the identity controller.
func NewController(clk clock.PassiveClock, kube client.Client, recorder events.EventRecorder) *Controller {
	return &Controller{clk: clk, kube: kube, recorder: recorder, wrote: map[string]time.Time{}}
}

// Name of the controller.
func (c *Controller) Name() string { return "identity" }

// Register watches identities, the lanes that use them and the nodes that match them. A lane
// enqueues only the identity it names, and a node only when what identities match on changes:
// the lanes' status writes and the agents' progress reports, thousands a minute in a large
// fleet, change nothing here.
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	all := enqueue.All(c.kube, func() client.ObjectList { return &v1.CertifiedIdentityList{} }, false)
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.CertifiedIdentity{}).
		Watches(&v1.CatalogLane{}, LaneEvents()).
		Watches(&v1.MacNode{}, all, builder.WithPredicates(NodeChanges)).
		// A placement that goes may be the last one keeping a deleted identity.
		Watches(&v1.LanePlacement{}, PlacementGone()).
		Complete(c)
}

// LaneEvents enqueues the identity a lane names when the lane can change that identity's
// status: created, deleted, being deleted, or naming another identity (then both). A new lane
// enqueues it after LanesInterval: a pass lists the identity's lanes, and a burst of lanes
// applied at once made a pass per lane (a fifth of the controller's CPU while 1,500 lanes were
// placed), when the lanes it would write wait for LanesInterval anyway. A lane that goes, or
// leaves the identity, may be what the identity's deletion waits for: that is at once.
func LaneEvents() handler.TypedEventHandler[client.Object, reconcile.Request] {
	named := func(q workqueue.TypedRateLimitingInterface[reconcile.Request], objs ...client.Object) {
		for _, o := range objs {
			if l, ok := o.(*v1.CatalogLane); ok {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: l.Spec.IdentityRef.Name}})
			}
		}
	}
	type q = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[client.Object], q q) {
			if l, ok := e.Object.(*v1.CatalogLane); ok {
				q.AddAfter(reconcile.Request{NamespacedName: client.ObjectKey{Name: l.Spec.IdentityRef.Name}}, LanesInterval)
			}
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[client.Object], q q) { named(q, e.Object) },
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[client.Object], q q) {
			old, ok1 := e.ObjectOld.(*v1.CatalogLane)
			cur, ok2 := e.ObjectNew.(*v1.CatalogLane)
			if ok1 && ok2 && old.Spec.IdentityRef == cur.Spec.IdentityRef && old.DeletionTimestamp.IsZero() == cur.DeletionTimestamp.IsZero() {
				return
			}
			named(q, e.ObjectOld, e.ObjectNew)
		},
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[client.Object], q q) { named(q, e.Object) },
	}
}

// PlacementGone enqueues the identity a deleted placement ran: it may have been the last one
// keeping the identity's deletion. Nothing else a placement does changes the identity's status,
// and its status writes, thousands in a rollout, each made a pass that lists the identity's
// lanes (a fifth of the controller's CPU while 1,500 lanes were placed).
func PlacementGone() handler.TypedEventHandler[client.Object, reconcile.Request] {
	type q = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[client.Object], q q) {
			if p, ok := e.Object.(*v1.LanePlacement); ok && p.Spec.Identity != "" {
				q.Add(reconcile.Request{NamespacedName: client.ObjectKey{Name: p.Spec.Identity}})
			}
		},
	}
}

// NodeChanges passes a MacNode event only if it changes what identities are matched on.
var NodeChanges = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*v1.MacNode)
	cur, ok2 := e.ObjectNew.(*v1.MacNode)
	return !ok1 || !ok2 || !equality.Semantic.DeepEqual(old.Status.Worker, cur.Status.Worker) ||
		!equality.Semantic.DeepEqual(old.Status.Platform, cur.Status.Platform)
}}

// Reconcile updates one identity.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	id := &v1.CertifiedIdentity{}
	if err := c.kube.Get(ctx, req.NamespacedName, id); err != nil {
		if apierrors.IsNotFound(err) {
			c.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	lanes, err := c.lanesUsing(ctx, id.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !id.DeletionTimestamp.IsZero() {
		placements, err := c.placementsUsing(ctx, id.Name)
		if err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{}, c.finalize(ctx, id, lanes, placements)
	}
	if controllerutil.AddFinalizer(id, v1.FinalizerInUse) {
		return reconcile.Result{}, c.kube.Update(ctx, id)
	}

	var nodes v1.MacNodeList
	if err := c.kube.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil { // only read
		return reconcile.Result{}, err
	}
	stored := id.DeepCopy()
	matching := int32(0)
	for i := range nodes.Items {
		if id.Matches(&nodes.Items[i]) {
			matching++
		}
	}
	id.Status.ObservedGeneration, id.Status.MatchingNodes = id.Generation, matching
	setLanes(&id.Status, lanes)
	now := metav1.NewTime(c.clk.Now())
	matched := metav1.Condition{Type: v1.IdentityConditionMatched, Status: metav1.ConditionTrue, Reason: v1.IdentityReasonNodesMatch,
		Message: fmt.Sprintf("%d MacNodes run this worker on macOS %s", matching, id.Spec.MacOSBuild), ObservedGeneration: id.Generation, LastTransitionTime: now}
	if matching == 0 {
		matched.Status, matched.Reason = metav1.ConditionFalse, v1.IdentityReasonNoMatchingNode
		matched.Message = fmt.Sprintf("no MacNode runs worker %s (%s) on the %s backend on macOS %s", id.Spec.Worker.SigningIdentifier, id.Spec.Worker.BinaryDigest, id.Spec.Worker.Backend, id.Spec.MacOSBuild)
	}
	meta.SetStatusCondition(&id.Status.Conditions, matched)
	ready := matched
	ready.Type = v1.ConditionReady
	meta.SetStatusCondition(&id.Status.Conditions, ready)
	if equality.Semantic.DeepEqual(stored.Status, id.Status) {
		return reconcile.Result{}, nil
	}
	if wait := c.lanesWait(id.Name, &stored.Status, &id.Status); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	if err := c.kube.Status().Patch(ctx, id, client.MergeFrom(stored)); err != nil {
		return reconcile.Result{}, err
	}
	c.mu.Lock()
	c.wrote[id.Name] = c.clk.Now()
	c.mu.Unlock()
	return reconcile.Result{}, nil
}

// forget drops a deleted identity's last write, so the map holds only identities that exist.
func (c *Controller) forget(name string) {
	c.mu.Lock()
	delete(c.wrote, name)
	c.mu.Unlock()
}

// lanesWait is how long a status write that only changes the lanes must wait to be coalesced
// with the next; zero for any other change, or when the last write is LanesInterval old.
func (c *Controller) lanesWait(name string, stored, desired *v1.CertifiedIdentityStatus) time.Duration {
	a, b := stored.DeepCopy(), desired.DeepCopy()
	a.Lanes, a.LaneCount, b.Lanes, b.LaneCount = nil, 0, nil, 0
	if !equality.Semantic.DeepEqual(a, b) {
		return 0
	}
	c.mu.Lock()
	last, ok := c.wrote[name]
	c.mu.Unlock()
	if !ok {
		return 0
	}
	return max(0, LanesInterval-c.clk.Since(last))
}

// ListedLanes is how many of the lanes that use an identity its status lists (laneCount counts
// them all): the list is rewritten whole on every change, and a fleet may have thousands.
const ListedLanes = 100

// setLanes records the lanes (sorted) that use the identity.
func setLanes(st *v1.CertifiedIdentityStatus, lanes []string) {
	st.LaneCount = int32(len(lanes))
	st.Lanes = lanes[:min(len(lanes), ListedLanes)]
}

// lanesUsing lists the lanes (namespace/name) that reference the identity.
func (c *Controller) lanesUsing(ctx context.Context, name string) ([]string, error) {
	var lanes v1.CatalogLaneList
	if err := c.kube.List(ctx, &lanes, client.MatchingFields{v1.FieldLaneIdentity: name}, client.UnsafeDisableDeepCopy); err != nil { // only read
		return nil, err
	}
	var out []string
	for _, l := range lanes.Items {
		if l.Spec.IdentityRef.Name == name && l.DeletionTimestamp.IsZero() {
			out = append(out, l.Namespace+"/"+l.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// placementsUsing lists the placements (namespace/name) that run the identity, those being
// retired included: their workers run until their agents let go.
func (c *Controller) placementsUsing(ctx context.Context, name string) ([]string, error) {
	var placements v1.LanePlacementList
	if err := c.kube.List(ctx, &placements, client.MatchingFields{v1.FieldPlacementIdentity: name}); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range placements.Items {
		if p.Spec.Identity == name {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// finalize lets the identity go once no lane references it and no placement runs it.
func (c *Controller) finalize(ctx context.Context, id *v1.CertifiedIdentity, lanes, placements []string) error {
	if len(lanes) > 0 || len(placements) > 0 {
		stored := id.DeepCopy()
		setLanes(&id.Status, lanes)
		msg := "deletion waits until no lane references it and no placement runs it"
		if len(lanes) > 0 {
			msg += fmt.Sprintf("; used by %d lanes: %s", len(lanes), names.Some(lanes))
		}
		if len(placements) > 0 {
			msg += fmt.Sprintf("; run by %d placements: %s", len(placements), names.Some(placements))
		}
		meta.SetStatusCondition(&id.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse,
			Reason: v1.IdentityReasonInUse, Message: msg,
			ObservedGeneration: id.Generation, LastTransitionTime: metav1.NewTime(c.clk.Now())})
		if equality.Semantic.DeepEqual(stored.Status, id.Status) {
			return nil
		}
		c.recorder.Eventf(id, nil, "Warning", v1.IdentityReasonInUse, "Delete", "deletion blocked: %s", msg)
		return c.kube.Status().Patch(ctx, id, client.MergeFrom(stored))
	}
	if controllerutil.RemoveFinalizer(id, v1.FinalizerInUse) {
		c.forget(id.Name)
		return c.kube.Update(ctx, id)
	}
	return nil
}
