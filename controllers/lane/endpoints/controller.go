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

// Package endpoints keeps, per CatalogLane, a selector-less Service and EndpointSlices listing
// the lane's Ready placements' node addresses and serving ports, so in-cluster clients call
// http://<lane>.<namespace>.svc/v1/embeddings and reach only nodes that serve the lane.
//
// The Service is the ServiceController's, the EndpointSlices the Controller's: a ClusterIP
// Service's creation waits on the API server's cluster-wide allocator, and a burst of new lanes'
// Services must not hold the slices of lanes whose Services are there. A lane gets slices only
// once its own Service is in the cache.
//
// A node's address is the agent's word, so it is published only as AddressPolicy allows (a
// second controller here says on each MacNode whether, and why not). A Service of the lane's
// name that this controller did not create is never taken over: the lane's ServiceReady
// condition says the name is taken, and the lane gets no endpoints, which would otherwise
// attach to that Service.
package endpoints

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=cataloglanes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=certifiedidentities,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements/status,verbs=get;update;patch

const (
	// ServicePort is the lane Service's port, HTTPS's; it forwards to each node's serving port.
	ServicePort = 443
	// PortName names the port in the Service and its EndpointSlices, which kube-proxy matches
	// by name.
	PortName = "https"
	// ManagedBy marks the Services (label ServiceManagedByLabel) and EndpointSlices (label
	// discoveryv1.LabelManagedBy) this controller creates; the manager caches only those.
	ManagedBy = "synapse-controller.fleet.synapse.dev"
	// AppProtocol says the port speaks HTTP over TLS (the agents serve their API with a
	// certificate from the fleet's signer). An un-prefixed appProtocol is an IANA service name
	// (RFC 6335), and "https" is HTTP over TLS's: see the field's documentation in
	// kubernetes/api, core/v1/types.go (ServicePort.AppProtocol) and discovery/v1/types.go
	// (EndpointPort.AppProtocol).
	AppProtocol = "https"
	// ServiceManagedByLabel is the label that carries ManagedBy on a lane's Service.
	ServiceManagedByLabel = "app.kubernetes.io/managed-by"
)

// errNameTaken is a Service or EndpointSlice name of the lane held by an object this controller
// did not create.
var errNameTaken = errors.New("name taken")

// Controller keeps lanes' EndpointSlices (the ServiceController their Services).
type Controller struct {
	clk    clock.PassiveClock
	kube   client.Client
	policy AddressPolicy
	// reader reads the API server past the cache (the manager's, once registered; kube until
	// then): a create that finds a name taken may have met an object of ours the cache does
	// not show yet.
	reader client.Reader
	// own is the lanes' ServiceReady conditions as this controller last wrote them.
	own ownWrites
}

// NewController returns the endpoints controller; policy says which node addresses may be
// published.
func NewController(clk clock.PassiveClock, kube client.Client, policy AddressPolicy) *Controller {
	return &Controller{clk: clk, kube: kube, policy: policy, reader: kube}
}

// WithAPIReader has the controller read past its client's cache with r after a create finds a
// name taken (Register sets the manager's).
func (c *Controller) WithAPIReader(r client.Reader) *Controller {
	c.reader = r
	return c
}

// errNotCachedYet: a create found an object of ours that the cache does not show yet; the
// reconcile is retried, nothing is read as taken.
var errNotCachedYet = errors.New("an object of ours is not in the cache yet")

// takenBy says, after a create of obj's name found it taken, whether the object that holds it
// is another's (errNameTaken) or ours, just created and not yet in the cache (errNotCachedYet):
// a reconcile right after our own create would otherwise take our Service or slice for
// another's, empty the lane's endpoints and turn ServiceReady False until the next pass.
func takenBy(ctx context.Context, reader client.Reader, lane *v1.CatalogLane, kind string, obj client.Object, managedBy string) error {
	if err := reader.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		if apierrors.IsNotFound(err) {
			return errNotCachedYet // gone since: the next pass creates it
		}
		return err
	}
	if obj.GetLabels()[managedBy] == ManagedBy && ownedByLaneNamed(obj, lane.Name) {
		return fmt.Errorf("%s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), errNotCachedYet)
	}
	return fmt.Errorf("%s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), errNameTaken)
}

// Name of the controller.
func (c *Controller) Name() string { return "lane.endpoints" }

// Register watches lanes, their placements (readiness) and nodes (addresses).
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	laneOf := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if lane := o.GetLabels()[v1.LabelLane]; lane != "" {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: lane}}}
		}
		return nil
	})
	lanesOnNode := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		// Through the cache's index of placements by node (controllers.IndexFields): a label
		// selector would walk every placement of the fleet on each node event.
		var ps v1.LanePlacementList
		if err := c.kube.List(ctx, &ps, client.MatchingFields{v1.FieldPlacementNode: o.GetName()}); err != nil {
			ctrl.LoggerFrom(ctx).Error(err, "listing the placements on a node whose addresses changed; its lanes' EndpointSlices follow at their next change", "node", o.GetName())
			return nil
		}
		var out []reconcile.Request
		for _, p := range ps.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: p.Namespace, Name: p.Spec.Lane}})
		}
		return out
	})
	c.reader = mgr.GetAPIReader()
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.CatalogLane{}, builder.WithPredicates(LaneServingChanges)).
		Owns(&corev1.Service{}).
		Owns(&discoveryv1.EndpointSlice{}, builder.WithPredicates(SliceChanges)).
		Watches(&v1.LanePlacement{}, laneOf, builder.WithPredicates(PlacementServingChanges)).
		Watches(&v1.MacNode{}, lanesOnNode, builder.WithPredicates(ServingChanges)).
		WithOptions(controller.Options{MaxConcurrentReconciles: MaxConcurrentReconciles}).
		Complete(c)
}

// NotCachedRetry is how soon a lane is reconciled again after a create met an object of ours
// the cache did not show yet.
const NotCachedRetry = 100 * time.Millisecond

// MaxConcurrentReconciles: a lane's reconcile waits on the API server (its EndpointSlice, its
// condition: a round trip or two in a row), and lanes are independent of each other.
const MaxConcurrentReconciles = 16

// ServingChanges passes a MacNode event only if it changes what the lanes' EndpointSlices are
// made of: the node's addresses, serving port or health (a lost node leaves at once). The
// agents' progress reports (every few seconds from every Mac) would otherwise reconcile every
// lane on the node each time.
var ServingChanges = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*v1.MacNode)
	cur, ok2 := e.ObjectNew.(*v1.MacNode)
	return !ok1 || !ok2 || old.Status.ServingPort != cur.Status.ServingPort ||
		!equality.Semantic.DeepEqual(old.Status.Addresses, cur.Status.Addresses) || lost(old) != lost(cur)
}}

// SliceChanges passes the lanes' EndpointSlices' changes and deletions, not their creation:
// only this controller creates them, and the pass a creation brought came right after the pass
// that made it, with nothing to do. A changed or deleted slice is mended.
var SliceChanges = predicate.Funcs{CreateFunc: func(event.CreateEvent) bool { return false }}

// LaneServingChanges passes a CatalogLane event only if it changes what this controller reads
// of the lane: its spec (the condition's observed generation), its deletion, the vector space it
// answers in, and this controller's own status fields. The placement controller writes the
// lane's status as its placements progress, and each write would otherwise reconcile it here.
var LaneServingChanges = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*v1.CatalogLane)
	cur, ok2 := e.ObjectNew.(*v1.CatalogLane)
	if !ok1 || !ok2 {
		return true
	}
	was := meta.FindStatusCondition(old.Status.Conditions, v1.LaneConditionServiceReady)
	is := meta.FindStatusCondition(cur.Status.Conditions, v1.LaneConditionServiceReady)
	return old.Generation != cur.Generation || old.DeletionTimestamp.IsZero() != cur.DeletionTimestamp.IsZero() ||
		old.Status.VectorSpaceID != cur.Status.VectorSpaceID || old.Status.VectorSpaceGeneration != cur.Status.VectorSpaceGeneration ||
		old.Status.EndpointsVectorSpaceID != cur.Status.EndpointsVectorSpaceID ||
		old.Status.EndpointsVectorSpaceGeneration != cur.Status.EndpointsVectorSpaceGeneration ||
		(was == nil) != (is == nil) || was != nil && (was.Status != is.Status || was.Reason != is.Reason || was.Message != is.Message || was.ObservedGeneration != is.ObservedGeneration)
}}

// PlacementServingChanges passes a LanePlacement event only if it changes what its lane's
// EndpointSlices list or whether it is drained: whether it is Ready, its node known lost,
// terminating or deleted, drained, and where and in which vector space it serves. An agent
// reports a placement's progress several times on its way to Ready (its phase, its shapes,
// its conditions' messages), and each report would otherwise reconcile the lane; with the
// lanes reconciled at once, a report arriving between this controller's write and the cache's
// sight of it also had the write made twice.
var PlacementServingChanges = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*v1.LanePlacement)
	cur, ok2 := e.ObjectNew.(*v1.LanePlacement)
	return !ok1 || !ok2 || servingState(old) != servingState(cur)
}}

// placementServing is what of a placement its lane's endpoints are made of.
type placementServing struct {
	lane, node, identity, space            string
	ready, nodeLost, terminating, deleting bool
	drained                                metav1.ConditionStatus
}

func servingState(p *v1.LanePlacement) placementServing {
	s := placementServing{lane: p.Labels[v1.LabelLane], node: p.Spec.Node, identity: p.Spec.Identity, space: p.Spec.VectorSpaceID,
		ready: p.Status.Phase == v1.PhaseReady, nodeLost: meta.IsStatusConditionFalse(p.Status.Conditions, v1.PlacementConditionNodeReady),
		terminating: meta.IsStatusConditionTrue(p.Status.Conditions, v1.PlacementConditionTerminating), deleting: !p.DeletionTimestamp.IsZero()}
	if d := meta.FindStatusCondition(p.Status.Conditions, v1.PlacementConditionDrained); d != nil {
		s.drained = d.Status
	}
	return s
}

// Reconcile writes one lane's EndpointSlices, and its ServiceReady condition, once the lane's
// Service (the ServiceController's) is in the cache.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lane := &v1.CatalogLane{}
	if err := c.kube.Get(ctx, req.NamespacedName, lane); err != nil {
		if apierrors.IsNotFound(err) {
			c.own.forget(req.NamespacedName)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !lane.DeletionTimestamp.IsZero() {
		c.own.forget(req.NamespacedName)
		return reconcile.Result{}, nil
	}
	ours, err := c.hasService(ctx, lane)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !ours {
		// Not created yet, gone, or its name another's (the ServiceController says so on
		// ServiceReady): slices of the lane's name would feed whatever Service holds the name,
		// so the lane has none until its own is there; its creation brings the lane back. No
		// slice lists a stopping placement, so it is drained.
		if err := c.slices(ctx, lane, nil); err != nil {
			return reconcile.Result{}, err
		}
		if err := c.confirmDrained(ctx, lane); err != nil {
			return reconcile.Result{}, err
		}
		if err := c.followedSpace(ctx, lane); err != nil {
			return reconcile.Result{}, err
		}
		// A lane that had its Service says that it is gone; a new lane, still waiting for its
		// first, costs no write.
		if meta.IsStatusConditionTrue(c.own.conditions(lane), v1.LaneConditionServiceReady) {
			missing := fmt.Errorf("Service %s/%s is gone", lane.Namespace, lane.Name)
			return reconcile.Result{}, setServiceCondition(ctx, c.kube, lane, serviceCondition(c.clk, lane, v1.LaneReasonServiceMissing, missing), &c.own)
		}
		return reconcile.Result{}, nil
	}
	byPort, err := c.readyEndpoints(ctx, lane)
	if err != nil {
		return reconcile.Result{}, err
	}
	err = c.slices(ctx, lane, byPort)
	if err == nil {
		err = c.confirmDrained(ctx, lane)
	}
	if errors.Is(err, errNotCachedYet) {
		// Ours, just created: the next pass, once the cache shows it, goes on from there.
		return reconcile.Result{RequeueAfter: NotCachedRetry}, nil
	}
	if errors.Is(err, errNameTaken) {
		// An EndpointSlice of the lane's name is another's: none of ours may feed the Service
		// beside it.
		if err := c.slices(ctx, lane, nil); err != nil {
			return reconcile.Result{}, err
		}
		if err := c.followedSpace(ctx, lane); err != nil {
			return reconcile.Result{}, err
		}
		// Tried again: no event of ours says when the other's slice goes.
		return reconcile.Result{RequeueAfter: TakenRetry}, setServiceCondition(ctx, c.kube, lane, serviceCondition(c.clk, lane, v1.LaneReasonServiceNameTaken, err), &c.own)
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if err := c.followedSpace(ctx, lane); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, setServiceCondition(ctx, c.kube, lane, serviceCondition(c.clk, lane, "", nil), &c.own)
}

// hasService reports whether the lane's Service is there and the controller's.
func (c *Controller) hasService(ctx context.Context, lane *v1.CatalogLane) (bool, error) {
	svc := &corev1.Service{}
	if err := c.kube.Get(ctx, client.ObjectKeyFromObject(lane), svc); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	return LaneService(svc, lane.Name), nil
}

// followedSpace records, once the lane's EndpointSlices are written, the vector space they were
// written for and the lane's vectorSpaceGeneration with it (one switch, or its rollback, from
// the next): a blue/green rollout's old placements drain from then, not from the switch of the
// lane's space, which this controller may follow seconds later under load. A lane that never
// switched (generation 0) costs no write.
func (c *Controller) followedSpace(ctx context.Context, lane *v1.CatalogLane) error {
	st := lane.Status
	if st.VectorSpaceGeneration == 0 || st.EndpointsVectorSpaceGeneration == st.VectorSpaceGeneration && st.EndpointsVectorSpaceID == st.VectorSpaceID {
		return nil
	}
	if err := statusapply.ApplyLaneEndpointsSpace(ctx, c.kube, client.ObjectKeyFromObject(lane), st.VectorSpaceID, st.VectorSpaceGeneration); err != nil {
		return fmt.Errorf("recording the vector space of lane %s's endpoints: %w", client.ObjectKeyFromObject(lane), err)
	}
	return nil
}

// serviceCondition is the lane's ServiceReady condition: True with no error; False with
// reason, the error saying why.
func serviceCondition(clk clock.PassiveClock, lane *v1.CatalogLane, reason string, err error) metav1.Condition {
	cond := metav1.Condition{Type: v1.LaneConditionServiceReady, Status: metav1.ConditionTrue, Reason: v1.LaneReasonServiceReady,
		Message:            fmt.Sprintf("Service %s and its EndpointSlices are the controller's", lane.Name),
		ObservedGeneration: lane.Generation, LastTransitionTime: metav1.NewTime(clk.Now())}
	if err == nil {
		return cond
	}
	cond.Status, cond.Reason = metav1.ConditionFalse, reason
	switch reason {
	case v1.LaneReasonServiceNameTaken:
		cond.Message = fmt.Sprintf("%v: an object of the lane's name exists that this controller did not create; it is never taken over. "+
			"Rename the lane or remove that object; meanwhile the lane has no Service endpoints", err)
	case v1.LaneReasonServiceMissing:
		cond.Message = fmt.Sprintf("%v; the controller creates it again, and the lane has no Service endpoints meanwhile", err)
	default:
		cond.Message = fmt.Sprintf("creating Service %s: %v; it is tried again, and the lane has no Service endpoints meanwhile", lane.Name, err)
	}
	return cond
}

// setServiceCondition writes the lane's ServiceReady condition if cond changes it. Both
// controllers of a lane's Service write it, under one field manager: the Service controller when
// the Service's name is taken or its creation fails, this one otherwise. own, if not nil,
// remembers the writes made through it and is believed over a cache that does not show them
// yet.
func setServiceCondition(ctx context.Context, kube client.Client, lane *v1.CatalogLane, cond metav1.Condition, own *ownWrites) error {
	current := lane.Status.Conditions
	if own != nil {
		current = own.conditions(lane)
	}
	if !statusapply.Changed(current, cond) {
		return nil
	}
	cond = statusapply.Next(current, cond)
	// Applied, its own type alone: the placement controller writes the lane's other conditions.
	rv, err := statusapply.ApplyLaneCondition(ctx, kube, client.ObjectKeyFromObject(lane),
		statusapply.Manager(statusapply.LaneEndpointsManager, v1.LaneConditionServiceReady), cond)
	if err != nil {
		return err
	}
	if own != nil {
		own.wrote(lane, rv, cond)
	}
	return nil
}

// endpoint is one node's address and its EndpointSlice conditions.
type endpoint struct {
	address              string
	ready, serving, term bool
}

// readyEndpoints groups the allowed addresses of the nodes whose placement of lane serves, by
// their serving port (one EndpointSlice carries one set of ports). A placement is listed when
// it is Ready, of the lane's vector space, and its node is not known lost (its MacNode's Ready
// condition or the placement's NodeReady condition not True): a lost node leaves at once, not at
// its eviction. A placement that is being deleted, or whose agent says it is stopping, is
// listed as terminating: not ready, still serving what reaches it.
func (c *Controller) readyEndpoints(ctx context.Context, lane *v1.CatalogLane) (map[int32][]endpoint, error) {
	var ps v1.LanePlacementList
	if err := c.kube.List(ctx, &ps, client.InNamespace(lane.Namespace), client.MatchingLabels{v1.LabelLane: lane.Name}); err != nil {
		return nil, err
	}
	var cluster []ClusterRange
	out := map[int32][]endpoint{}
	for _, p := range ps.Items {
		if p.Status.Phase != v1.PhaseReady || meta.IsStatusConditionFalse(p.Status.Conditions, v1.PlacementConditionNodeReady) {
			continue
		}
		// Only placements of the vector space the lane answers in: during a blue/green rollout
		// the new space's placements are Ready beside the old before the lane switches.
		if space := lane.Status.VectorSpaceID; space != "" {
			ps, err := c.spaceOf(ctx, &p)
			if err != nil {
				return nil, err
			}
			if ps != space {
				continue
			}
		}
		node := &v1.MacNode{}
		if err := c.kube.Get(ctx, client.ObjectKey{Name: p.Spec.Node}, node); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		if node.Status.ServingPort == 0 || lost(node) {
			continue
		}
		if cluster == nil {
			var err error
			if cluster, err = ClusterRanges(ctx, c.kube); err != nil {
				return nil, err
			}
		}
		// A refused address leaves the node out; its MacNode's AddressAllowed condition says why.
		ip, err := c.policy.nodeAddress(node, cluster)
		if err != nil {
			continue
		}
		term := !p.DeletionTimestamp.IsZero() || meta.IsStatusConditionTrue(p.Status.Conditions, v1.PlacementConditionTerminating)
		out[node.Status.ServingPort] = append(out[node.Status.ServingPort], endpoint{address: ip.String(), ready: !term, serving: true, term: term})
	}
	for port := range out {
		slices.SortFunc(out[port], func(a, b endpoint) int { return strings.Compare(a.address, b.address) })
	}
	return out, nil
}

// spaceOf is the vector space a placement answers in: its own, or, for a placement made before
// placements carried it, its identity's ("" if the identity is gone: such a placement is no
// endpoint of any space).
func (c *Controller) spaceOf(ctx context.Context, p *v1.LanePlacement) (string, error) {
	if p.Spec.VectorSpaceID != "" {
		return p.Spec.VectorSpaceID, nil
	}
	id := &v1.CertifiedIdentity{}
	if err := c.kube.Get(ctx, client.ObjectKey{Name: p.Spec.Identity}, id); err != nil {
		return "", client.IgnoreNotFound(err)
	}
	return id.Spec.VectorSpaceID, nil
}

// confirmDrained tells the agents of the lane's Terminating placements, once the EndpointSlices
// just written list them as not ready, that they may close their servers (the Drained
// condition), and clears it from placements no longer terminating (an agent that runs again).
func (c *Controller) confirmDrained(ctx context.Context, lane *v1.CatalogLane) error {
	var ps v1.LanePlacementList
	if err := c.kube.List(ctx, &ps, client.InNamespace(lane.Namespace), client.MatchingLabels{v1.LabelLane: lane.Name}); err != nil {
		return err
	}
	for i := range ps.Items {
		p := &ps.Items[i]
		terminating := meta.IsStatusConditionTrue(p.Status.Conditions, v1.PlacementConditionTerminating)
		drained := meta.FindStatusCondition(p.Status.Conditions, v1.PlacementConditionDrained)
		if (terminating && drained != nil && drained.Status == metav1.ConditionTrue) || (!terminating && drained == nil) {
			continue
		}
		stored := p.DeepCopy()
		if terminating {
			meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionDrained, Status: metav1.ConditionTrue,
				Reason: v1.PlacementReasonNotAnEndpoint, ObservedGeneration: p.Generation, LastTransitionTime: metav1.NewTime(c.clk.Now()),
				Message: fmt.Sprintf("lane %s's EndpointSlices no longer list this placement as ready; its agent may stop answering", lane.Name)})
		} else {
			meta.RemoveStatusCondition(&p.Status.Conditions, v1.PlacementConditionDrained)
		}
		// Optimistic: an agent's write in between is retried, never overwritten.
		if err := c.kube.Status().Patch(ctx, p, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("confirming placement %s/%s drained: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

// lost reports whether the node's Ready condition says it is not: the lifecycle controller
// turns it Unknown when the Lease expires. A node that has none yet is not judged.
func lost(node *v1.MacNode) bool {
	c := meta.FindStatusCondition(node.Status.Conditions, v1.ConditionReady)
	return c != nil && c.Status != metav1.ConditionTrue
}

// slices writes one EndpointSlice per serving port and deletes the ones no longer needed. The
// ones no longer needed go first: when a lane's vector space switches from placements serving
// on one port to placements serving on another (Macs that do not share a port), a client
// reading the slices between the two writes then sees no endpoint for a moment, never the old
// space's beside the new one's. Where the Macs share a port (a fleet's usual setup) the switch
// is one update of one slice.
func (c *Controller) slices(ctx context.Context, lane *v1.CatalogLane, byPort map[int32][]endpoint) error {
	var existing discoveryv1.EndpointSliceList
	if err := c.kube.List(ctx, &existing, client.InNamespace(lane.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: lane.Name, discoveryv1.LabelManagedBy: ManagedBy}); err != nil {
		return err
	}
	// Only slices this controller wrote for the lane: a label is anyone's to set.
	existing.Items = slices.DeleteFunc(existing.Items, func(s discoveryv1.EndpointSlice) bool { return !ownedByLaneNamed(&s, lane.Name) })
	sliceName := func(port int32) string { return fmt.Sprintf("%s-%d", lane.Name, port) }
	wanted := map[string]map[string]bool{} // slice name: the addresses it is to list
	for port, addrs := range byPort {
		set := map[string]bool{}
		for _, a := range addrs {
			set[a.address] = true
		}
		wanted[sliceName(port)] = set
	}
	ours := 0
	for _, s := range existing.Items {
		if strings.HasPrefix(s.Name, lane.Name+"-") {
			ours++
		}
	}
	for _, s := range existing.Items {
		if wanted[s.Name] == nil && strings.HasPrefix(s.Name, lane.Name+"-") {
			if err := c.kube.Delete(ctx, &s); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	// With several slices no single write moves the endpoints from one set to another: the
	// slices that stay first lose the endpoints that go, then all gain the ones that come, so
	// between the writes a client sees fewer endpoints, never the old beside the new (a
	// vector-space switch over Macs whose ports differ). With one slice the one write does it.
	if ours > 1 || len(wanted) > 1 {
		for i := range existing.Items {
			s := &existing.Items[i]
			keep := wanted[s.Name]
			if keep == nil {
				continue
			}
			kept := slices.DeleteFunc(slices.Clone(s.Endpoints), func(e discoveryv1.Endpoint) bool { return len(e.Addresses) == 0 || !keep[e.Addresses[0]] })
			if len(kept) == len(s.Endpoints) {
				continue
			}
			patched := s.DeepCopy()
			patched.Endpoints = kept
			if err := c.kube.Patch(ctx, patched, client.MergeFrom(s)); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	for port, addrs := range byPort {
		name := sliceName(port)
		slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lane.Namespace}}
		_, err := controllerutil.CreateOrPatch(ctx, c.kube, slice, func() error {
			if slice.ResourceVersion != "" && (slice.Labels[discoveryv1.LabelManagedBy] != ManagedBy || !ownedByLaneNamed(slice, lane.Name)) {
				// Another's, seen where the cache holds more than this controller's own.
				return fmt.Errorf("EndpointSlice %s/%s: %w", slice.Namespace, slice.Name, errNameTaken)
			}
			slice.Labels = map[string]string{discoveryv1.LabelServiceName: lane.Name, discoveryv1.LabelManagedBy: ManagedBy, v1.LabelLane: lane.Name}
			slice.AddressType = discoveryv1.AddressTypeIPv4
			slice.Ports = []discoveryv1.EndpointPort{{Name: ptr.To(PortName), Protocol: ptr.To(corev1.ProtocolTCP), AppProtocol: ptr.To(AppProtocol), Port: ptr.To(port)}}
			var eps []discoveryv1.Endpoint
			for _, a := range addrs {
				eps = append(eps, discoveryv1.Endpoint{Addresses: []string{a.address},
					Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(a.ready), Serving: ptr.To(a.serving), Terminating: ptr.To(a.term)}})
			}
			slice.Endpoints = eps
			return controllerutil.SetControllerReference(lane, slice, c.kube.Scheme())
		})
		if apierrors.IsAlreadyExists(err) {
			// The cache holds only ours: an EndpointSlice of that name is another's, or ours
			// just created.
			return takenBy(ctx, c.reader, lane, "EndpointSlice", &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lane.Namespace}}, discoveryv1.LabelManagedBy)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
