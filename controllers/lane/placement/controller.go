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
// identifier, binary digest, protocol version and macOS build) and its budget holds one more
// shape of the lane once every placement bound to it is counted, those made a moment ago and
// not yet reported included (see fleet). Among those the least charged for its budget comes
// first, so lanes applied together spread over the fleet, and among nodes as free as each other
// one whose aned already holds the lane's rungs (a cold compile avoided is minutes saved).
package placement

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
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

// StatusInterval is the least time between two writes of a lane's status that only report its
// replicas' progress (the Ready, compiling and failed counts and the Ready condition): the
// phases an agent reports in quick succession become one write. What placement decided (the
// nodes, the Placed condition) is written at once.
const StatusInterval = time.Second

// Controller reconciles CatalogLanes into LanePlacements.
type Controller struct {
	clk      clock.PassiveClock
	kube     client.Client
	recorder events.EventRecorder
	fleet    *fleet

	mu sync.Mutex
	// wrote is when each lane's status was last written.
	wrote map[types.NamespacedName]time.Time
}

// NewController returns the placement controller.
func NewController(clk clock.PassiveClock, kube client.Client, recorder events.EventRecorder) *Controller {
	return &Controller{clk: clk, kube: kube, recorder: recorder, fleet: newFleet(clk), wrote: map[types.NamespacedName]time.Time{}}
}

// Name of the controller.
func (c *Controller) Name() string { return "lane.placement" }

// MaxConcurrentReconciles: a reconcile mostly waits on the API server (a create, a status
// patch), and lanes placed at once still see each other's placements through the fleet's
// assumed charges, so several run side by side.
const MaxConcurrentReconciles = 8

// Register adds the controller to the manager: lanes, their placements, and the nodes and
// identities that decide where they go. A lane's own status writes do not reconcile it again;
// nodes, placements and identities enqueue only the lanes they can affect (see fleet).
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	lanesInNamespace := enqueue.All(c.kube, func() client.ObjectList { return &v1.CatalogLaneList{} }, true)
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.CatalogLane{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1.LanePlacement{}, c.feed()).
		Watches(&v1.MacNode{}, c.feed()).
		Watches(&v1.CertifiedIdentity{}, c.feed()).
		Watches(&v1.PrewarmPolicy{}, lanesInNamespace).
		WithOptions(controller.Options{MaxConcurrentReconciles: MaxConcurrentReconciles}).
		Complete(c)
}

// Reconcile places one lane.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lane := &v1.CatalogLane{}
	if err := c.kube.Get(ctx, req.NamespacedName, lane); err != nil {
		if apierrors.IsNotFound(err) {
			c.fleet.forgetLane(req.NamespacedName)
			c.mu.Lock()
			delete(c.wrote, req.NamespacedName)
			c.mu.Unlock()
			metrics.UnplaceableLanes.DeletePartialMatch(map[string]string{"namespace": req.Namespace, "lane": req.Name})
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !lane.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // the placements go with their owner
	}
	stored := lane.DeepCopy()

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

	placed, reason, message, err := c.place(ctx, lane, identity, prewarmRungs)
	if err != nil {
		return reconcile.Result{}, err
	}
	c.fleet.observeLane(lane, identity, len(placed) < int(lane.Spec.Replicas))
	c.setStatus(lane, placed, reason, message)
	metrics.UnplaceableLanes.DeletePartialMatch(map[string]string{"namespace": lane.Namespace, "lane": lane.Name})
	if reason != v1.LaneReasonPlaced {
		metrics.UnplaceableLanes.WithLabelValues(lane.Namespace, lane.Name, reason).Set(1)
	}
	if !equality.Semantic.DeepEqual(stored.Status, lane.Status) {
		if wait := c.statusWait(req.NamespacedName, &stored.Status, &lane.Status); wait > 0 {
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		if stored.Status.Conditions == nil || meta.IsStatusConditionTrue(stored.Status.Conditions, v1.LaneConditionPlaced) != meta.IsStatusConditionTrue(lane.Status.Conditions, v1.LaneConditionPlaced) {
			if reason != v1.LaneReasonPlaced {
				c.recorder.Eventf(lane, nil, "Warning", reason, "Place", message)
			}
		}
		if err := c.kube.Status().Patch(ctx, lane, client.MergeFrom(stored)); err != nil {
			return reconcile.Result{}, err
		}
		c.mu.Lock()
		c.wrote[req.NamespacedName] = c.clk.Now()
		c.mu.Unlock()
	}
	return reconcile.Result{}, nil
}

// statusWait is how long a status write must wait to be coalesced with the next: zero when it
// says something placement decided, or the lane's last write is StatusInterval old.
func (c *Controller) statusWait(lane types.NamespacedName, stored, desired *v1.CatalogLaneStatus) time.Duration {
	placedOf := func(st *v1.CatalogLaneStatus) metav1.Condition {
		if cond := meta.FindStatusCondition(st.Conditions, v1.LaneConditionPlaced); cond != nil {
			return metav1.Condition{Status: cond.Status, Reason: cond.Reason, Message: cond.Message}
		}
		return metav1.Condition{}
	}
	if stored.ObservedGeneration != desired.ObservedGeneration || stored.Replicas != desired.Replicas ||
		!slices.Equal(stored.Nodes, desired.Nodes) || placedOf(stored) != placedOf(desired) {
		return 0
	}
	c.mu.Lock()
	last, ok := c.wrote[lane]
	c.mu.Unlock()
	if !ok {
		return 0
	}
	return max(0, StatusInterval-c.clk.Since(last))
}

func schedulable(node *v1.MacNode) bool {
	return meta.IsStatusConditionTrue(node.Status.Conditions, v1.ConditionReady) && !node.Spec.Unschedulable && !node.Spec.Paused
}

// place creates and deletes placements so the lane has its replicas, and returns the live
// placements with the Placed reason and message.
func (c *Controller) place(ctx context.Context, lane *v1.CatalogLane, identity *v1.CertifiedIdentity, prewarmRungs []v1.Rung) ([]*v1.LanePlacement, string, string, error) {
	laneKey := client.ObjectKeyFromObject(lane)
	existing, on := c.fleet.lanePlacements(laneKey)
	if identity == nil {
		return existing, v1.LaneReasonIdentityNotFound,
			fmt.Sprintf("CertifiedIdentity %q does not exist; create it or fix spec.identityRef", lane.Spec.IdentityRef.Name), nil
	}
	// Placements on nodes that no longer run the identity exactly are retired: an approval is
	// never carried to another build or binary.
	var kept []*v1.LanePlacement
	for _, p := range existing {
		if !c.fleet.matches(p.Spec.Node, identity) {
			if err := c.delete(ctx, p); err != nil {
				return nil, "", "", err
			}
			c.recorder.Eventf(lane, p, "Warning", "IdentityMismatch", "Retire", "node %s no longer runs identity %s; placement retired", p.Spec.Node, identity.Name)
			metrics.PlacementDecisions.WithLabelValues("identity_mismatch").Inc()
			continue
		}
		if !slices.Equal(p.Spec.PrewarmRungs, prewarmRungs) {
			// The resolved prewarm rungs changed (a policy was added, edited or removed).
			patched := p.DeepCopy()
			patched.Spec.PrewarmRungs = prewarmRungs
			if err := c.kube.Patch(ctx, patched, client.MergeFrom(p)); client.IgnoreNotFound(err) != nil {
				return nil, "", "", err
			}
			p = patched
		}
		kept = append(kept, p)
	}

	want := int(lane.Spec.Replicas)
	if len(kept) > want {
		// Scale down: not-ready placements go first; the agent removes each one's finalizer once
		// its worker has exited and its reservations are refunded.
		slices.SortStableFunc(kept, func(a, b *v1.LanePlacement) int {
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
			if err := c.delete(ctx, p); err != nil {
				return nil, "", "", err
			}
			metrics.PlacementDecisions.WithLabelValues("scaled_down").Inc()
		}
		kept = kept[len(kept)-want:]
	}
	if len(kept) == want {
		return kept, v1.LaneReasonPlaced, fmt.Sprintf("%d of %d replicas placed", len(kept), want), nil
	}

	// Scale up: reserve nodes (charged at once, so the next lane sees them), then create.
	res := c.fleet.reserve(request{lane: laneKey, id: identity, selector: lane.Spec.NodeSelector, rungs: lane.Spec.Rungs,
		want: want - len(kept), taken: on}, func(node string) *v1.LanePlacement { return newPlacement(lane, identity, node, prewarmRungs) })
	for i, node := range res.chosen {
		p := newPlacement(lane, identity, node, prewarmRungs)
		if err := c.create(ctx, lane, p); err != nil {
			for _, rest := range res.chosen[i:] {
				c.fleet.forget(lane.Namespace, placementName(lane.Name, rest))
			}
			return nil, "", "", err
		}
		// No event per placement: the placement itself and the lane's status say where it went,
		// and at a burst of thousands an event each would be a third of the writes.
		metrics.PlacementDecisions.WithLabelValues("placed").Inc()
		kept = append(kept, p)
	}
	switch {
	case len(kept) == want:
		return kept, v1.LaneReasonPlaced, fmt.Sprintf("%d of %d replicas placed", len(kept), want), nil
	case res.matching == 0:
		return kept, v1.LaneReasonNoMatchingNode, fmt.Sprintf("no MacNode runs worker %s (%s) on the %s backend on macOS %s, as identity %s requires",
			identity.Spec.Worker.SigningIdentifier, identity.Spec.Worker.BinaryDigest, identity.Spec.Worker.Backend, identity.Spec.MacOSBuild, identity.Name), nil
	case res.selected == 0:
		return kept, v1.LaneReasonSelectorMatchesNothing, fmt.Sprintf("%d MacNodes match the identity but none matches spec.nodeSelector", res.matching), nil
	case res.short > 0:
		return kept, v1.LaneReasonBudgetFull, fmt.Sprintf("%d of %d replicas placed: %d matching nodes lack the %d free layer executables one shape needs",
			len(kept), want, res.short, identity.Spec.Model.Layers), nil
	default:
		return kept, v1.LaneReasonNotEnoughNodes, fmt.Sprintf("%d of %d replicas placed: %d nodes match identity %s and the selector; the others are not ready, cordoned or paused",
			len(kept), want, res.selected, identity.Name), nil
	}
}

// create creates a reserved placement. One that exists already (made before a restart, not
// yet in the informer's list) is taken as made; the informer shows it as it is.
func (c *Controller) create(ctx context.Context, lane *v1.CatalogLane, p *v1.LanePlacement) error {
	if err := controllerutil.SetControllerReference(lane, p, c.kube.Scheme()); err != nil {
		return err
	}
	if err := c.kube.Create(ctx, p); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	c.fleet.assumed(p)
	return nil
}

// delete deletes a placement; it stops counting as a replica at once and keeps its node's
// budget until the agent has retired it.
func (c *Controller) delete(ctx context.Context, p *v1.LanePlacement) error {
	if err := c.kube.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
		return err
	}
	c.fleet.deleted(p)
	return nil
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
			PrewarmRungs:          prewarmRungs,
			MaxBatchTokens:        ptr.Deref(lane.Spec.MaxBatchTokens, v1.DefaultMaxBatchTokens),
			MaxConcurrentRequests: ptr.Deref(lane.Spec.MaxConcurrentRequests, v1.DefaultMaxConcurrentRequests),
			MaxQueuedRequests:     ptr.To(ptr.Deref(lane.Spec.MaxQueuedRequests, v1.DefaultMaxQueuedRequests)),
		},
	}
}

// setStatus aggregates the placements into the lane's status.
func (c *Controller) setStatus(lane *v1.CatalogLane, placed []*v1.LanePlacement, reason, message string) {
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
