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

// Package placement places CatalogLanes onto MacNodes: one LanePlacement per chosen node, as a
// Pod is bound to a node. A node qualifies when it is Ready, schedulable, not paused, matches
// the lane's nodeSelector, matches the lane's CertifiedIdentity exactly (worker signing
// identifier, binary digest, protocol version and macOS build) and has free layer executables
// for at least one of the lane's shapes. Among those, nodes whose aned already holds the
// lane's rungs come first (a cold compile avoided is minutes saved), then the least allocated.
package placement

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/enqueue"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
	"github.com/ck-synapse/synapse-fleet/controllers/prewarm"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=cataloglanes,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=cataloglanes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes;certifiedidentities;prewarmpolicies,verbs=get;list;watch

// Controller reconciles CatalogLanes into LanePlacements.
type Controller struct {
	clk      clock.PassiveClock
	kube     client.Client
	recorder events.EventRecorder
}

// NewController returns the placement controller.
func NewController(clk clock.PassiveClock, kube client.Client, recorder events.EventRecorder) *Controller {
	return &Controller{clk: clk, kube: kube, recorder: recorder}
}

// Name of the controller.
func (c *Controller) Name() string { return "lane.placement" }

// Register adds the controller to the manager: lanes, their placements, and the nodes and
// identities that decide where they go.
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	allLanes := enqueue.All(c.kube, func() client.ObjectList { return &v1.CatalogLaneList{} }, false)
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.CatalogLane{}).
		Owns(&v1.LanePlacement{}).
		Watches(&v1.MacNode{}, allLanes, builder.WithPredicates(nodeChanges)).
		Watches(&v1.CertifiedIdentity{}, allLanes).
		Watches(&v1.PrewarmPolicy{}, allLanes).
		Complete(c)
}

// nodeChanges passes a MacNode event only if it changes something placement reads: labels, the
// spec, the Ready condition, platform, worker, capacity, allocation or cached rungs. The
// agents' compile progress, queue summaries and addresses change often and move no lane, and
// every event here reconciles every lane.
var nodeChanges = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*v1.MacNode)
	cur, ok2 := e.ObjectNew.(*v1.MacNode)
	if !ok1 || !ok2 {
		return true
	}
	readyOf := func(n *v1.MacNode) metav1.ConditionStatus {
		if c := meta.FindStatusCondition(n.Status.Conditions, v1.ConditionReady); c != nil {
			return c.Status
		}
		return ""
	}
	return !equality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
		!equality.Semantic.DeepEqual(old.Spec, cur.Spec) ||
		readyOf(old) != readyOf(cur) ||
		!equality.Semantic.DeepEqual(old.Status.Platform, cur.Status.Platform) ||
		!equality.Semantic.DeepEqual(old.Status.Worker, cur.Status.Worker) ||
		!equality.Semantic.DeepEqual(old.Status.Capacity, cur.Status.Capacity) ||
		!equality.Semantic.DeepEqual(old.Status.Allocated, cur.Status.Allocated) ||
		!equality.Semantic.DeepEqual(old.Status.CachedRungs, cur.Status.CachedRungs) ||
		!old.DeletionTimestamp.Equal(cur.DeletionTimestamp)
}}

// Reconcile places one lane.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lane := &v1.CatalogLane{}
	if err := c.kube.Get(ctx, req.NamespacedName, lane); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !lane.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // the placements go with their owner
	}
	stored := lane.DeepCopy()

	var placements v1.LanePlacementList
	if err := c.kube.List(ctx, &placements, client.InNamespace(lane.Namespace), client.MatchingLabels{v1.LabelLane: lane.Name}); err != nil {
		return reconcile.Result{}, err
	}
	// The nodes are only read, never changed: with the manager's cache they are not copied,
	// which at a thousand nodes is most of a reconcile's cost.
	var nodes v1.MacNodeList
	if err := c.kube.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return reconcile.Result{}, err
	}
	identity := &v1.CertifiedIdentity{}
	err := c.kube.Get(ctx, client.ObjectKey{Name: lane.Spec.IdentityRef.Name}, identity)
	switch {
	case apierrors.IsNotFound(err):
		identity = nil
	case err != nil:
		return reconcile.Result{}, err
	}

	var policies v1.PrewarmPolicyList
	if err := c.kube.List(ctx, &policies, client.InNamespace(lane.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	prewarmRungs := prewarm.Resolve(lane, policies.Items).Rungs

	placed, reason, message, err := c.place(ctx, lane, identity, placements.Items, nodes.Items, prewarmRungs)
	if err != nil {
		return reconcile.Result{}, err
	}
	c.setStatus(lane, placed, reason, message)
	metrics.UnplaceableLanes.DeletePartialMatch(map[string]string{"namespace": lane.Namespace, "lane": lane.Name})
	if reason != v1.LaneReasonPlaced {
		metrics.UnplaceableLanes.WithLabelValues(lane.Namespace, lane.Name, reason).Set(1)
	}
	if !equality.Semantic.DeepEqual(stored.Status, lane.Status) {
		if stored.Status.Conditions == nil || meta.IsStatusConditionTrue(stored.Status.Conditions, v1.LaneConditionPlaced) != meta.IsStatusConditionTrue(lane.Status.Conditions, v1.LaneConditionPlaced) {
			if reason != v1.LaneReasonPlaced {
				c.recorder.Eventf(lane, nil, "Warning", reason, "Place", message)
			}
		}
		if err := c.kube.Status().Patch(ctx, lane, client.MergeFrom(stored)); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, nil
}

func schedulable(node *v1.MacNode) bool {
	return meta.IsStatusConditionTrue(node.Status.Conditions, v1.ConditionReady) && !node.Spec.Unschedulable && !node.Spec.Paused
}

// place creates and deletes placements so the lane has its replicas, and returns the live
// placements with the Placed reason and message.
func (c *Controller) place(ctx context.Context, lane *v1.CatalogLane, identity *v1.CertifiedIdentity, existing []v1.LanePlacement, nodes []v1.MacNode, prewarmRungs []v1.Rung) ([]v1.LanePlacement, string, string, error) {
	if identity == nil {
		return c.keep(existing), v1.LaneReasonIdentityNotFound,
			fmt.Sprintf("CertifiedIdentity %q does not exist; create it or fix spec.identityRef", lane.Spec.IdentityRef.Name), nil
	}
	byName := map[string]*v1.MacNode{}
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	// Placements on nodes that no longer run the identity exactly are retired: an approval is
	// never carried to another build or binary.
	var kept []v1.LanePlacement
	for _, p := range c.keep(existing) {
		if n := byName[p.Spec.Node]; n == nil || !identity.Matches(n) {
			if err := c.kube.Delete(ctx, &p); client.IgnoreNotFound(err) != nil {
				return nil, "", "", err
			}
			c.recorder.Eventf(lane, &p, "Warning", "IdentityMismatch", "Retire", "node %s no longer runs identity %s; placement retired", p.Spec.Node, identity.Name)
			metrics.PlacementDecisions.WithLabelValues("identity_mismatch").Inc()
			continue
		}
		if !slices.Equal(p.Spec.PrewarmRungs, prewarmRungs) {
			// The resolved prewarm rungs changed (a policy was added, edited or removed).
			stored := p.DeepCopy()
			p.Spec.PrewarmRungs = prewarmRungs
			if err := c.kube.Patch(ctx, &p, client.MergeFrom(stored)); client.IgnoreNotFound(err) != nil {
				return nil, "", "", err
			}
		}
		kept = append(kept, p)
	}

	want := int(lane.Spec.Replicas)
	if len(kept) > want {
		// Scale down: not-ready placements go first; the agent removes each one's finalizer once
		// its worker has exited and its reservations are refunded.
		slices.SortStableFunc(kept, func(a, b v1.LanePlacement) int {
			ra, rb := a.Status.Phase == v1.PhaseReady, b.Status.Phase == v1.PhaseReady
			if ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return strings.Compare(b.Name, a.Name)
		})
		for _, p := range kept[:len(kept)-want] {
			if err := c.kube.Delete(ctx, &p); client.IgnoreNotFound(err) != nil {
				return nil, "", "", err
			}
			metrics.PlacementDecisions.WithLabelValues("scaled_down").Inc()
		}
		kept = kept[len(kept)-want:]
	}
	if len(kept) == want {
		return kept, v1.LaneReasonPlaced, fmt.Sprintf("%d of %d replicas placed", len(kept), want), nil
	}

	// Scale up: find eligible nodes, saying why none is when none is.
	taken := map[string]bool{}
	for _, p := range kept {
		taken[p.Spec.Node] = true
	}
	selector := labels.SelectorFromSet(lane.Spec.NodeSelector)
	var matching, selected, eligible []*v1.MacNode
	short := 0 // usable but without free executables
	for _, n := range byName {
		if !identity.Matches(n) {
			continue
		}
		matching = append(matching, n)
		if !selector.Matches(labels.Set(n.Labels)) {
			continue
		}
		selected = append(selected, n)
		if !schedulable(n) || taken[n.Name] {
			continue
		}
		if free := n.Status.Capacity.LayerExecutables - n.Status.Allocated.LayerExecutables; free < identity.Spec.Model.Layers {
			short++
			continue
		}
		eligible = append(eligible, n)
	}
	slices.SortFunc(eligible, func(a, b *v1.MacNode) int {
		ca, cb := cachedRungs(a, identity.Name, lane.Spec.Rungs), cachedRungs(b, identity.Name, lane.Spec.Rungs)
		if ca != cb {
			return cb - ca
		}
		if d := a.Status.Allocated.LayerExecutables - b.Status.Allocated.LayerExecutables; d != 0 {
			return int(d)
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, n := range eligible[:min(len(eligible), want-len(kept))] {
		p := newPlacement(lane, identity, n.Name, prewarmRungs)
		if err := controllerutil.SetControllerReference(lane, p, c.kube.Scheme()); err != nil {
			return nil, "", "", err
		}
		if err := c.kube.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, "", "", err
		}
		c.recorder.Eventf(lane, p, "Normal", "Placed", "Place", "placed on node %s", n.Name)
		metrics.PlacementDecisions.WithLabelValues("placed").Inc()
		kept = append(kept, *p)
	}
	switch {
	case len(kept) == want:
		return kept, v1.LaneReasonPlaced, fmt.Sprintf("%d of %d replicas placed", len(kept), want), nil
	case len(matching) == 0:
		return kept, v1.LaneReasonNoMatchingNode, fmt.Sprintf("no MacNode runs worker %s (%s) on macOS %s, as identity %s requires",
			identity.Spec.Worker.SigningIdentifier, identity.Spec.Worker.BinaryDigest, identity.Spec.MacOSBuild, identity.Name), nil
	case len(selected) == 0:
		return kept, v1.LaneReasonSelectorMatchesNothing, fmt.Sprintf("%d MacNodes match the identity but none matches spec.nodeSelector", len(matching)), nil
	case short > 0:
		return kept, v1.LaneReasonBudgetFull, fmt.Sprintf("%d of %d replicas placed: %d matching nodes lack the %d free layer executables one shape needs",
			len(kept), want, short, identity.Spec.Model.Layers), nil
	default:
		return kept, v1.LaneReasonNotEnoughNodes, fmt.Sprintf("%d of %d replicas placed: %d nodes match identity %s and the selector; the others are not ready, cordoned or paused",
			len(kept), want, len(selected), identity.Name), nil
	}
}

// keep drops placements already being deleted.
func (c *Controller) keep(ps []v1.LanePlacement) []v1.LanePlacement {
	var out []v1.LanePlacement
	for _, p := range ps {
		if p.DeletionTimestamp.IsZero() {
			out = append(out, p)
		}
	}
	return out
}

func cachedRungs(n *v1.MacNode, identity string, rungs []v1.Rung) int {
	for _, c := range n.Status.CachedRungs {
		if c.Identity == identity {
			k := 0
			for _, r := range c.Rungs {
				if slices.Contains(rungs, r) {
					k++
				}
			}
			return k
		}
	}
	return 0
}

// placementName is <lane>-<node>, shortened with a hash when too long for a name.
func placementName(lane, node string) string {
	name := lane + "-" + node
	if len(name) <= 253 {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	return name[:240] + "-" + hex.EncodeToString(sum[:6])
}

func newPlacement(lane *v1.CatalogLane, identity *v1.CertifiedIdentity, node string, prewarmRungs []v1.Rung) *v1.LanePlacement {
	ceiling := int32(lane.Spec.Rungs[len(lane.Spec.Rungs)-1])
	if lane.Spec.Ceiling != nil {
		ceiling = *lane.Spec.Ceiling
	}
	maxShapes := int32(len(lane.Spec.Rungs))
	if lane.Spec.MaxResidentShapes != nil {
		maxShapes = *lane.Spec.MaxResidentShapes
	}
	return &v1.LanePlacement{
		ObjectMeta: metav1.ObjectMeta{
			Name: placementName(lane.Name, node), Namespace: lane.Namespace,
			Labels:     map[string]string{v1.LabelLane: lane.Name, v1.LabelNode: node},
			Finalizers: []string{v1.FinalizerRetirement},
		},
		Spec: v1.LanePlacementSpec{
			Lane: lane.Name, Node: node, Identity: identity.Name, Task: lane.Spec.Task, Device: lane.Spec.Device,
			Rungs: slices.Clone(lane.Spec.Rungs), Ceiling: ceiling, MaxResidentShapes: maxShapes,
			AdmissionBoundSeconds: lane.Spec.AdmissionBoundSeconds, RequestDeadlineSeconds: lane.Spec.RequestDeadlineSeconds,
			PrewarmRungs: prewarmRungs,
		},
	}
}

// setStatus aggregates the placements into the lane's status.
func (c *Controller) setStatus(lane *v1.CatalogLane, placed []v1.LanePlacement, reason, message string) {
	st := &lane.Status
	st.ObservedGeneration = lane.Generation
	st.Replicas, st.ReadyReplicas, st.CompilingReplicas, st.FailedReplicas = int32(len(placed)), 0, 0, 0
	st.Nodes = nil
	for _, p := range placed {
		st.Nodes = append(st.Nodes, p.Spec.Node)
		switch p.Status.Phase {
		case v1.PhaseReady:
			st.ReadyReplicas++
		case v1.PhaseCompiling:
			st.CompilingReplicas++
		case v1.PhaseFailed:
			st.FailedReplicas++
		}
	}
	slices.Sort(st.Nodes)
	now := metav1.NewTime(c.clk.Now())
	placedStatus := metav1.ConditionFalse
	if reason == v1.LaneReasonPlaced {
		placedStatus = metav1.ConditionTrue
	}
	setCondition(st, v1.LaneConditionPlaced, placedStatus, reason, message, lane.Generation, now)
	ready, readyReason, readyMessage := metav1.ConditionFalse, "NotReady", fmt.Sprintf("%d of %d replicas ready", st.ReadyReplicas, lane.Spec.Replicas)
	switch {
	case placedStatus == metav1.ConditionFalse:
		readyReason, readyMessage = reason, message
	case st.ReadyReplicas == lane.Spec.Replicas:
		ready, readyReason = metav1.ConditionTrue, "Ready"
	case st.CompilingReplicas > 0:
		readyReason = "Compiling"
	}
	setCondition(st, v1.ConditionReady, ready, readyReason, readyMessage, lane.Generation, now)
}

// setCondition sets a condition, keeping its transition time unless its status changes.
func setCondition(st *v1.CatalogLaneStatus, typ string, status metav1.ConditionStatus, reason, message string, gen int64, now metav1.Time) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message,
		ObservedGeneration: gen, LastTransitionTime: now})
}
