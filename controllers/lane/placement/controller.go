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
	"cmp"
	"context"
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
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/enqueue"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/rollout"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
	"github.com/ck-synapse/synapse-fleet/controllers/prewarm"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=cataloglanes,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=cataloglanes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes;certifiedidentities;prewarmpolicies,verbs=get;list;watch

// StatusInterval is the least time between a write of a lane's status and one that turns its
// Ready condition: the phases an agent reports in quick succession become one write. What
// placement decided (the nodes, the Placed and Progressing conditions) is written at once.
const StatusInterval = time.Second

// ProgressInterval is the least time between a write of a lane's status and one that only
// reports its replicas' progress within the same Ready status (the ready, compiling and failed
// counts, the Ready condition's reason and message): a replica that loads in a few seconds is
// written twice, placed and Ready, rather than once more for each phase on its way.
const ProgressInterval = 5 * time.Second

// Controller reconciles CatalogLanes into LanePlacements.
type Controller struct {
	clk      clock.PassiveClock
	kube     client.Client
	recorder events.EventRecorder
	fleet    *fleet

	mu sync.Mutex
	// wrote is when each lane's status was last written.
	wrote map[types.NamespacedName]time.Time
	// followed is when this controller first saw each lane's EndpointSlices follow a switch
	// of its vector space (of that vectorSpaceGeneration): its old placements drain until
	// SwitchDrain after it.
	followed map[types.NamespacedName]followedSwitch
	// said is what this controller last wrote of each lane's status, which it alone writes
	// (its part of it: statusapply.ApplyLanePlacementStatus): a reconcile that reads the lane
	// from a cache a moment behind that write goes on from what was written. It never applies
	// the older vector space back (a space switched back while the old placements drain would
	// mix spaces), and it never skips a write because the stale copy happens to hold what it
	// would write: a lane whose placement went Pending and Ready again within a moment was left
	// at the Pending count, its own status events not reconciling it (LaneChanges).
	said map[types.NamespacedName]saidStatus
	// unsure are the lanes (of their incarnation uid) whose last status write failed: it may
	// have landed all the same (a timeout after the API server took it), so what the cache
	// shows says nothing of what the lane holds, and the next pass writes whatever it finds.
	unsure map[types.NamespacedName]types.UID
}

// saidStatus is what the controller last wrote of one lane (of its incarnation uid), and the
// lane's resourceVersion after that write.
type saidStatus struct {
	uid    types.UID
	rv     string
	status v1.CatalogLaneStatus
}

// followedSwitch is when the lane's EndpointSlices were first seen to follow its switch of
// vectorSpaceGeneration generation.
type followedSwitch struct {
	uid        types.UID
	generation int64
	at         time.Time
}

// NewController returns the placement controller.
func NewController(clk clock.PassiveClock, kube client.Client, recorder events.EventRecorder) *Controller {
	return &Controller{clk: clk, kube: kube, recorder: recorder, fleet: newFleet(clk), wrote: map[types.NamespacedName]time.Time{},
		followed: map[types.NamespacedName]followedSwitch{}, said: map[types.NamespacedName]saidStatus{},
		unsure: map[types.NamespacedName]types.UID{}}
}

// Name of the controller.
func (c *Controller) Name() string { return "lane.placement" }

// MaxConcurrentReconciles: a reconcile mostly waits on the API server (a create, a status
// patch), and lanes placed at once still see each other's placements through the fleet's
// assumed charges, so several run side by side.
const MaxConcurrentReconciles = 8

// Register adds the controller to the manager: lanes, their placements, and the nodes and
// identities that decide where they go. A lane's own status writes do not reconcile it again
// (LaneChanges); nodes, placements and identities enqueue only the lanes they can affect (see
// fleet), and a policy's status writes none (prewarm.PolicyChanges).
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	lanesInNamespace := enqueue.All(c.kube, func() client.ObjectList { return &v1.CatalogLaneList{} }, true)
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.CatalogLane{}, builder.WithPredicates(LaneChanges)).
		Watches(&v1.LanePlacement{}, c.feed()).
		Watches(&v1.MacNode{}, c.feed()).
		Watches(&v1.CertifiedIdentity{}, c.feed()).
		Watches(&v1.PrewarmPolicy{}, lanesInNamespace, builder.WithPredicates(prewarm.PolicyChanges)).
		WithOptions(controller.Options{MaxConcurrentReconciles: MaxConcurrentReconciles}).
		Complete(c)
}

// LaneChanges passes a lane's event if it changes what the lane asks (its generation) or what
// the endpoints controller says of it: the vector space generation its EndpointSlices follow,
// which a blue/green rollout waits for before its old placements drain, and which no other
// event follows (without it the rollout stood still once the new space's placements were
// Ready). The lane's other status writes, this controller's own, do not reconcile it again.
var LaneChanges = predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*v1.CatalogLane)
	cur, ok2 := e.ObjectNew.(*v1.CatalogLane)
	return ok1 && ok2 && (old.Status.EndpointsVectorSpaceGeneration != cur.Status.EndpointsVectorSpaceGeneration ||
		old.Status.EndpointsVectorSpaceID != cur.Status.EndpointsVectorSpaceID)
}})

// Reconcile places one lane.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lane := &v1.CatalogLane{}
	if err := c.kube.Get(ctx, req.NamespacedName, lane); err != nil {
		if apierrors.IsNotFound(err) {
			c.fleet.forgetLane(req.NamespacedName)
			c.mu.Lock()
			delete(c.wrote, req.NamespacedName)
			delete(c.followed, req.NamespacedName)
			delete(c.said, req.NamespacedName)
			delete(c.unsure, req.NamespacedName)
			c.mu.Unlock()
			metrics.UnplaceableLanes.DeletePartialMatch(map[string]string{"namespace": req.Namespace, "lane": req.Name})
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !lane.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil // the placements go with their owner
	}
	c.mu.Lock()
	if said, ok := c.said[req.NamespacedName]; ok && said.uid == lane.UID {
		if statusapply.CacheBehind(lane.ResourceVersion, said.rv) {
			statusapply.OverlayLanePlacementStatus(&lane.Status, &said.status)
		}
		lane.Status.VectorSpaceID = said.status.VectorSpaceID
		lane.Status.VectorSpaceGeneration = max(lane.Status.VectorSpaceGeneration, said.status.VectorSpaceGeneration)
		lane.Status.ObservedGeneration = max(lane.Status.ObservedGeneration, said.status.ObservedGeneration)
	}
	unsure := c.unsure[req.NamespacedName] == lane.UID
	c.mu.Unlock()
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

	epoch := c.fleet.nodeEpoch()
	pl, err := c.place(ctx, lane, identity, prewarmRungs)
	if err != nil {
		return reconcile.Result{}, err
	}
	missed := c.fleet.observeLane(lane, identity, identity != nil && len(pl.current) < int(lane.Spec.Replicas), epoch)
	c.setStatus(lane, identity, pl)
	metrics.UnplaceableLanes.DeletePartialMatch(map[string]string{"namespace": lane.Namespace, "lane": lane.Name})
	if pl.reason != v1.LaneReasonPlaced {
		metrics.UnplaceableLanes.WithLabelValues(lane.Namespace, lane.Name, pl.reason).Set(1)
	}
	var res reconcile.Result
	// After a switch, the endpoints controller's write of the lane's status brings the lane
	// back (LaneChanges); should that event be missed, the lane comes back after SwitchDrain
	// anyway. The drain then has its own wait.
	if pl.awaitingEndpoints {
		res.RequeueAfter = SwitchDrain
	}
	if pl.drainWait > 0 {
		res.RequeueAfter = pl.drainWait
	}
	if pl.deadlineWake > 0 && (res.RequeueAfter == 0 || res.RequeueAfter > pl.deadlineWake) {
		res.RequeueAfter = pl.deadlineWake // Progressing turns False then unless the rollout moves
	}
	if missed && (res.RequeueAfter == 0 || res.RequeueAfter > MissedNodeRetry) {
		// A node that may fit arrived while the lane was placed (see observeLane): one more
		// pass per such node event, sooner than any other wait (the pass works that out again).
		res.RequeueAfter = MissedNodeRetry
	}
	if unsure || !equality.Semantic.DeepEqual(stored.Status, lane.Status) {
		if wait := c.statusWait(req.NamespacedName, &stored.Status, &lane.Status); wait > 0 && !unsure {
			if res.RequeueAfter > 0 {
				wait = min(wait, res.RequeueAfter)
			}
			return reconcile.Result{RequeueAfter: wait}, nil
		}
		if stored.Status.Conditions == nil || meta.IsStatusConditionTrue(stored.Status.Conditions, v1.LaneConditionPlaced) != meta.IsStatusConditionTrue(lane.Status.Conditions, v1.LaneConditionPlaced) {
			if pl.reason != v1.LaneReasonPlaced {
				c.recorder.Eventf(lane, nil, "Warning", pl.reason, "Place", pl.message)
			}
		}
		if pl.switched {
			c.recorder.Eventf(lane, nil, "Normal", "VectorSpaceSwitched", "Rollout", "the lane answers in vector space %s from now on; the placements of %s retire",
				lane.Status.VectorSpaceID, stored.Status.VectorSpaceID)
		}
		rv, err := statusapply.ApplyLanePlacementStatus(ctx, c.kube, req.NamespacedName, lane.Status)
		c.mu.Lock()
		if err != nil {
			c.unsure[req.NamespacedName] = lane.UID
			c.mu.Unlock()
			return reconcile.Result{}, err
		}
		delete(c.unsure, req.NamespacedName)
		c.wrote[req.NamespacedName] = c.clk.Now()
		c.said[req.NamespacedName] = saidStatus{uid: lane.UID, rv: rv, status: *lane.Status.DeepCopy()}
		c.mu.Unlock()
	}
	return res, nil
}

// SwitchDrain is how long the placements of a lane's old vector space keep answering after the
// lane's EndpointSlices list only the new one (status.endpointsVectorSpaceGeneration reached
// vectorSpaceGeneration): a client (kube-proxy, a mesh, a client-side balancer) acts on the
// slice it last saw for a moment longer, and a call it sends to an old placement then is
// answered in the old space, as it was sent, rather than refused lane_retired. It plays the
// part a Pod's termination grace and preStop delay play for a Deployment's rollout.
const SwitchDrain = 5 * time.Second

// drainLeft is what is left of the drain of the lane's old placements: ok is false while the
// lane's EndpointSlices have not followed its latest switch (they may still send clients to
// the old). The drain runs from when this controller first saw them follow that switch; a
// controller that restarted since drains from now.
func (c *Controller) drainLeft(lane *v1.CatalogLane) (left time.Duration, ok bool) {
	st := lane.Status
	if st.EndpointsVectorSpaceGeneration != st.VectorSpaceGeneration || st.VectorSpaceGeneration > 0 && st.EndpointsVectorSpaceID != st.VectorSpaceID {
		return 0, false
	}
	key := client.ObjectKeyFromObject(lane)
	c.mu.Lock()
	defer c.mu.Unlock()
	f, seen := c.followed[key]
	if !seen || f.uid != lane.UID || f.generation != st.VectorSpaceGeneration {
		f = followedSwitch{uid: lane.UID, generation: st.VectorSpaceGeneration, at: c.clk.Now()}
		c.followed[key] = f
	}
	return max(0, SwitchDrain-c.clk.Since(f.at)), true
}

// drained forgets a lane's switch once its old placements have retired.
func (c *Controller) drained(lane types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.followed, lane)
}

// MissedNodeRetry is how soon a lane found short is placed again when a node that may fit
// arrived while it was being placed.
const MissedNodeRetry = 100 * time.Millisecond

// statusWait is how long a status write must wait to be coalesced with the next: zero when it
// says something placement decided, or when the lane's last write is StatusInterval old and it
// turns the Ready condition, or ProgressInterval old.
func (c *Controller) statusWait(lane types.NamespacedName, stored, desired *v1.CatalogLaneStatus) time.Duration {
	conditionOf := func(st *v1.CatalogLaneStatus, typ string) metav1.Condition {
		if cond := meta.FindStatusCondition(st.Conditions, typ); cond != nil {
			return metav1.Condition{Status: cond.Status, Reason: cond.Reason}
		}
		return metav1.Condition{}
	}
	if stored.ObservedGeneration != desired.ObservedGeneration || stored.Replicas != desired.Replicas ||
		stored.UpdatedReplicas != desired.UpdatedReplicas || stored.VectorSpaceID != desired.VectorSpaceID ||
		!slices.Equal(stored.Nodes, desired.Nodes) || conditionOf(stored, v1.LaneConditionPlaced) != conditionOf(desired, v1.LaneConditionPlaced) ||
		conditionOf(stored, v1.LaneConditionProgressing) != conditionOf(desired, v1.LaneConditionProgressing) {
		return 0
	}
	c.mu.Lock()
	last, ok := c.wrote[lane]
	c.mu.Unlock()
	if !ok {
		return 0
	}
	interval := ProgressInterval
	if meta.IsStatusConditionTrue(stored.Conditions, v1.ConditionReady) != meta.IsStatusConditionTrue(desired.Conditions, v1.ConditionReady) {
		interval = StatusInterval
	}
	return max(0, interval-c.clk.Since(last))
}

func schedulable(node *v1.MacNode) bool {
	return meta.IsStatusConditionTrue(node.Status.Conditions, v1.ConditionReady) && !node.Spec.Unschedulable && !node.Spec.Paused
}

// place creates, updates and deletes placements so the lane has its replicas at its latest
// spec (see rollout.go), and returns what it found.
func (c *Controller) place(ctx context.Context, lane *v1.CatalogLane, identity *v1.CertifiedIdentity, prewarmRungs []v1.Rung) (*plan, error) {
	laneKey := client.ObjectKeyFromObject(lane)
	existing, on := c.fleet.lanePlacements(laneKey)
	if identity == nil {
		return &plan{live: existing, space: lane.Status.VectorSpaceID, reason: v1.LaneReasonIdentityNotFound,
			message: fmt.Sprintf("CertifiedIdentity %q does not exist; create it or fix spec.identityRef", lane.Spec.IdentityRef.Name)}, nil
	}
	// Placements on nodes that no longer run their identity exactly are retired: an approval is
	// never carried to another build or binary.
	pl := &plan{}
	ids := map[string]*v1.CertifiedIdentity{identity.Name: identity}
	for _, p := range existing {
		pid, err := c.identityOf(ctx, p, ids)
		if err != nil {
			return nil, err
		}
		if pid == nil || !c.fleet.matches(p.Spec.Node, pid) {
			if err := c.delete(ctx, p); err != nil {
				return nil, err
			}
			name := p.Spec.Identity
			c.recorder.Eventf(lane, p, "Warning", "IdentityMismatch", "Retire", "node %s no longer runs identity %s; placement retired", p.Spec.Node, name)
			metrics.PlacementDecisions.WithLabelValues("identity_mismatch").Inc()
			continue
		}
		if sameTemplate(p, lane, identity) {
			pl.current = append(pl.current, p)
		} else {
			pl.old = append(pl.old, &oldPlacement{p: p, space: spaceOf(p, pid)})
		}
	}
	if err := c.applyEdits(ctx, lane, identity, prewarmRungs, pl); err != nil {
		return nil, err
	}
	if err := c.roll(ctx, lane, identity, len(on)-len(existing), pl); err != nil {
		return nil, err
	}
	if err := c.scale(ctx, lane, identity, prewarmRungs, on, pl); err != nil {
		return nil, err
	}
	pl.live = append(slices.Clone(pl.current), pl.oldLive()...)
	return pl, nil
}

// identityOf is the placement's own CertifiedIdentity, read once per reconcile; nil if it is
// gone.
func (c *Controller) identityOf(ctx context.Context, p *v1.LanePlacement, ids map[string]*v1.CertifiedIdentity) (*v1.CertifiedIdentity, error) {
	if id, ok := ids[p.Spec.Identity]; ok {
		return id, nil
	}
	id := &v1.CertifiedIdentity{}
	err := c.kube.Get(ctx, client.ObjectKey{Name: p.Spec.Identity}, id)
	switch {
	case apierrors.IsNotFound(err):
		id = nil
	case err != nil:
		return nil, err
	}
	ids[p.Spec.Identity] = id
	return id, nil
}

// scale brings the lane's placements of its latest spec to the number the rollout allows
// (pl.target): up by reserving nodes, down by deleting placements on unhealthy nodes first.
func (c *Controller) scale(ctx context.Context, lane *v1.CatalogLane, identity *v1.CertifiedIdentity, prewarmRungs []v1.Rung, on map[string]struct{}, pl *plan) error {
	want := int(lane.Spec.Replicas)
	target := pl.target(want)
	if len(pl.current) > target {
		// Scale down: placements on unhealthy nodes go first, then not-ready ones; the agent
		// removes each one's finalizer once its worker has exited and its reservations are
		// refunded.
		slices.SortStableFunc(pl.current, func(a, b *v1.LanePlacement) int {
			if ha, hb := c.fleet.healthy(a.Spec.Node), c.fleet.healthy(b.Spec.Node); ha != hb {
				if ha {
					return 1
				}
				return -1
			}
			ra, rb := a.Status.Phase == v1.PhaseReady, b.Status.Phase == v1.PhaseReady
			if ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return strings.Compare(b.Name, a.Name)
		})
		for _, p := range pl.current[:len(pl.current)-target] {
			if err := c.delete(ctx, p); err != nil {
				return err
			}
			metrics.PlacementDecisions.WithLabelValues("scaled_down").Inc()
		}
		pl.current = pl.current[len(pl.current)-target:]
	}
	pl.reason, pl.message = v1.LaneReasonPlaced, fmt.Sprintf("%d of %d replicas placed", len(pl.current), want)
	if len(pl.current) >= target {
		if len(pl.current) < want {
			pl.message = fmt.Sprintf("%d of %d replicas of the latest spec placed; the rollout places the rest", len(pl.current), want)
		}
		return nil
	}

	// Scale up: reserve nodes (charged at once, so the next lane sees them), then create.
	laneKey := client.ObjectKeyFromObject(lane)
	res := c.fleet.reserve(request{lane: laneKey, id: identity, selector: lane.Spec.NodeSelector, rungs: lane.Spec.Rungs,
		want: target - len(pl.current), taken: on}, func(node string) *v1.LanePlacement { return newPlacement(lane, identity, node, prewarmRungs) })
	for i, node := range res.chosen {
		p := newPlacement(lane, identity, node, prewarmRungs)
		made, err := c.create(ctx, lane, p)
		if err != nil {
			for _, rest := range res.chosen[i:] {
				c.fleet.forget(lane.Namespace, placementName(lane.Name, rest))
			}
			return err
		}
		if !made {
			continue
		}
		// No event per placement: the placement itself and the lane's status say where it went,
		// and at a burst of thousands an event each would be a third of the writes.
		metrics.PlacementDecisions.WithLabelValues("placed").Inc()
		pl.current = append(pl.current, p)
	}
	placed := len(pl.current) + len(pl.oldLive())
	switch {
	case len(pl.current) >= target:
		pl.message = fmt.Sprintf("%d of %d replicas placed", min(placed, want), want)
		if len(pl.current) < want {
			pl.message = fmt.Sprintf("%d of %d replicas of the latest spec placed; the rollout places the rest", len(pl.current), want)
		}
		return nil
	case len(pl.old) > 0 && placed >= want:
		// The old spec's placements still serve: the lane is placed, the rollout is stuck.
		pl.unplaceable = fmt.Sprintf("no node can take a placement of identity %s beside the old ones: %s", identity.Name, c.shortMessage(res, identity, len(pl.current), target))
		return nil
	}
	pl.unplaceable = c.shortMessage(res, identity, len(pl.current), target)
	switch {
	case res.matching == 0:
		pl.reason = v1.LaneReasonNoMatchingNode
	case res.selected == 0:
		pl.reason = v1.LaneReasonSelectorMatchesNothing
	case res.short > 0:
		pl.reason = v1.LaneReasonBudgetFull
	default:
		pl.reason = v1.LaneReasonNotEnoughNodes
	}
	pl.message = pl.unplaceable
	return nil
}

// shortMessage says why fewer placements were made than wanted.
func (c *Controller) shortMessage(res outcome, identity *v1.CertifiedIdentity, placed, want int) string {
	switch {
	case res.matching == 0:
		return fmt.Sprintf("no MacNode runs worker %s (%s) on the %s backend on macOS %s, as identity %s requires",
			identity.Spec.Worker.SigningIdentifier, identity.Spec.Worker.BinaryDigest, identity.Spec.Worker.Backend, identity.Spec.MacOSBuild, identity.Name)
	case res.selected == 0:
		return fmt.Sprintf("%d MacNodes match the identity but none matches spec.nodeSelector", res.matching)
	case res.short > 0:
		return fmt.Sprintf("%d of %d replicas placed: %d matching nodes lack the %d free layer executables one shape needs",
			placed, want, res.short, identity.Spec.Model.Layers)
	default:
		return fmt.Sprintf("%d of %d replicas placed: %d nodes match identity %s and the selector; the others are not ready, cordoned or paused, or hold the lane already",
			placed, want, res.selected, identity.Name)
	}
}

// create creates a reserved placement and reports whether the lane now has it. One that exists
// already (made before a restart, not yet in the informer's list) is taken as made if it is
// this lane's, of the same identity and not being deleted; one being deleted (its agent still
// retiring it) is not a placement: the reservation is dropped, and the lane is reconciled
// again when it is gone.
func (c *Controller) create(ctx context.Context, lane *v1.CatalogLane, p *v1.LanePlacement) (bool, error) {
	if err := controllerutil.SetControllerReference(lane, p, c.kube.Scheme()); err != nil {
		return false, err
	}
	err := c.kube.Create(ctx, p)
	if apierrors.IsAlreadyExists(err) {
		there := &v1.LanePlacement{}
		if err := c.kube.Get(ctx, client.ObjectKeyFromObject(p), there); client.IgnoreNotFound(err) != nil {
			return false, err
		} else if err != nil || !there.DeletionTimestamp.IsZero() || !metav1.IsControlledBy(there, lane) || there.Spec.Identity != p.Spec.Identity {
			c.fleet.forget(p.Namespace, p.Name)
			return false, nil
		}
		*p = *there
		err = nil
	}
	if err != nil {
		return false, err
	}
	c.fleet.assumed(p)
	return true, nil
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
			PrewarmRungs:          ofLadder(prewarmRungs, lane.Spec.Rungs),
			VectorSpaceID:         identity.Spec.VectorSpaceID,
			MaxBatchTokens:        ptr.Deref(lane.Spec.MaxBatchTokens, v1.DefaultMaxBatchTokens),
			MaxConcurrentRequests: ptr.Deref(lane.Spec.MaxConcurrentRequests, v1.DefaultMaxConcurrentRequests),
			MaxQueuedRequests:     ptr.To(ptr.Deref(lane.Spec.MaxQueuedRequests, v1.DefaultMaxQueuedRequests)),
		},
	}
}

// setStatus aggregates the placements into the lane's status. Ready counts the placements
// of the vector space the lane answers in that serve (see serves); observedGeneration moves only once the placements
// reflect the lane's generation.
func (c *Controller) setStatus(lane *v1.CatalogLane, identity *v1.CertifiedIdentity, pl *plan) {
	st := &lane.Status
	want := lane.Spec.Replicas
	if identity != nil && len(pl.oldLive()) == 0 && !pl.editsPending {
		st.ObservedGeneration = lane.Generation
	}
	if st.VectorSpaceID != "" && pl.space != st.VectorSpaceID {
		// Past any generation either controller wrote: a count read from a cache a moment
		// behind never repeats one the endpoints controller has already followed.
		st.VectorSpaceGeneration = max(st.VectorSpaceGeneration, st.EndpointsVectorSpaceGeneration) + 1
	}
	c.progressed(lane, pl)
	st.VectorSpaceID = pl.space
	st.Replicas, st.UpdatedReplicas, st.ReadyReplicas, st.CompilingReplicas, st.FailedReplicas = int32(len(pl.live)), int32(len(pl.current)), 0, 0, 0
	st.UpdatedReadyReplicas = int32(c.servingNew(pl))
	st.Nodes = nil
	for _, p := range pl.live {
		st.Nodes = append(st.Nodes, p.Spec.Node)
		switch p.Status.Phase {
		case v1.PhaseReady:
			// Ready counts what serves: a placement on a node whose Lease lapsed is out of
			// the lane's endpoints, whatever its agent last said.
			if c.serves(p) && inSpace(p, pl, identity) {
				st.ReadyReplicas++
			}
		case v1.PhaseCompiling:
			st.CompilingReplicas++
		case v1.PhaseFailed:
			st.FailedReplicas++
		}
	}
	slices.Sort(st.Nodes)
	st.Nodes = st.Nodes[:min(len(st.Nodes), v1.MaxStatusNodes)] // more would fail every write of the status
	now := metav1.NewTime(c.clk.Now())
	placedStatus := metav1.ConditionFalse
	if pl.reason == v1.LaneReasonPlaced {
		placedStatus = metav1.ConditionTrue
	}
	setCondition(st, v1.LaneConditionPlaced, placedStatus, pl.reason, pl.message, lane.Generation, now)
	ready, readyReason, readyMessage := metav1.ConditionFalse, "NotReady", fmt.Sprintf("%d of %d replicas ready", st.ReadyReplicas, want)
	switch {
	case placedStatus == metav1.ConditionFalse:
		readyReason, readyMessage = pl.reason, pl.message
	case st.ReadyReplicas >= want:
		ready, readyReason = metav1.ConditionTrue, "Ready"
	case st.CompilingReplicas > 0:
		readyReason = "Compiling"
	}
	setCondition(st, v1.ConditionReady, ready, readyReason, readyMessage, lane.Generation, now)
	status, reason, message := progress(lane, identity, pl)
	setCondition(st, v1.LaneConditionProgressing, status, reason, message, lane.Generation, now)
}

// servingNew counts the placements of the lane's latest spec that serve.
func (c *Controller) servingNew(pl *plan) int {
	n := 0
	for _, p := range pl.current {
		if c.serves(p) {
			n++
		}
	}
	return n
}

// progressed judges the rollout's progress deadline from where the lane's stored status says it
// stood (before this pass writes it) and where it stands now, and stamps lastProgressTime.
func (c *Controller) progressed(lane *v1.CatalogLane, pl *plan) {
	st := &lane.Status
	if pl.strategy == "" {
		st.LastProgressTime = nil
		return
	}
	prev := rollout.Mark{Updated: int(st.UpdatedReplicas), UpdatedReady: int(st.UpdatedReadyReplicas), Old: int(st.Replicas - st.UpdatedReplicas), Space: st.VectorSpaceID}
	if cond := meta.FindStatusCondition(st.Conditions, v1.LaneConditionProgressing); cond != nil {
		prev.Generation = cond.ObservedGeneration
	}
	var since *time.Time
	if st.LastProgressTime != nil {
		since = &st.LastProgressTime.Time
	}
	cur := rollout.Mark{Generation: lane.Generation, Updated: len(pl.current), UpdatedReady: c.servingNew(pl), Old: len(pl.oldLive()), Space: pl.space}
	deadline := time.Duration(cmp.Or(lane.Spec.Rollout.ProgressDeadlineSeconds, v1.DefaultProgressDeadlineSeconds)) * time.Second
	at, exceeded, wake := rollout.Progress(prev, cur, since, c.clk.Now(), deadline)
	st.LastProgressTime = &metav1.Time{Time: at}
	pl.deadlineExceeded, pl.deadlineWake = exceeded, wake
}

// inSpace reports whether a placement answers in the lane's vector space.
func inSpace(p *v1.LanePlacement, pl *plan, identity *v1.CertifiedIdentity) bool {
	space := p.Spec.VectorSpaceID
	if space == "" && identity != nil && p.Spec.Identity == identity.Name {
		space = identity.Spec.VectorSpaceID
	}
	return space == "" || pl.space == "" || space == pl.space
}

// progress is the Progressing condition: True while placements move to the lane's latest
// spec, False once they all reflect it or when the rollout cannot go on.
func progress(lane *v1.CatalogLane, identity *v1.CertifiedIdentity, pl *plan) (metav1.ConditionStatus, string, string) {
	want := int(lane.Spec.Replicas)
	if identity == nil {
		return metav1.ConditionFalse, v1.LaneReasonIdentityNotFound, pl.message
	}
	if pl.strategy == "" {
		if pl.editsPending {
			return metav1.ConditionTrue, v1.LaneReasonApplyingEdits, "the lane's edits are being written onto its placements and picked up by their agents"
		}
		return metav1.ConditionFalse, v1.LaneReasonRolloutComplete, fmt.Sprintf("every placement runs identity %s in vector space %s", identity.Name, pl.space)
	}
	readyNew := 0
	for _, p := range pl.current {
		switch {
		case p.Status.Phase == v1.PhaseFailed:
			msg := fmt.Sprintf("placement %s of identity %s failed", p.Name, identity.Name)
			if p.Status.LastFault != nil {
				msg += ": " + p.Status.LastFault.Code + ": " + p.Status.LastFault.Message
			}
			return metav1.ConditionFalse, v1.LaneReasonNewPlacementsFailed, msg + fmt.Sprintf("; the placements of the old spec keep answering in vector space %s", pl.space)
		case ready(p):
			readyNew++
		}
	}
	if pl.unplaceable != "" && len(pl.current) < pl.newTarget {
		return metav1.ConditionFalse, v1.LaneReasonNewPlacementsUnplaceable, pl.unplaceable + fmt.Sprintf("; the placements of the old spec keep answering in vector space %s", pl.space)
	}
	if pl.stalled != "" {
		return metav1.ConditionFalse, v1.LaneReasonBoundsTooTight, pl.stalled + fmt.Sprintf("; the placements of the old spec keep answering in vector space %s", pl.space)
	}
	msg := fmt.Sprintf("%d of %d placements of identity %s made, %d ready, %d of the old spec left; answering in vector space %s",
		len(pl.current), want, identity.Name, readyNew, len(pl.oldLive()), pl.space)
	switch {
	case pl.awaitingEndpoints:
		msg += "; the old retire once the lane's EndpointSlices list that space alone (status.endpointsVectorSpaceGeneration reaching vectorSpaceGeneration, the endpoints controller's)"
	case pl.drainWait > 0:
		msg += fmt.Sprintf("; the old drain for %s after the lane's EndpointSlices left them, then retire", SwitchDrain)
	}
	if pl.deadlineExceeded {
		return metav1.ConditionFalse, v1.LaneReasonProgressDeadlineExceeded, fmt.Sprintf("the rollout has not moved for rollout.progressDeadlineSeconds (%d s): %s",
			cmp.Or(lane.Spec.Rollout.ProgressDeadlineSeconds, v1.DefaultProgressDeadlineSeconds), msg)
	}
	return metav1.ConditionTrue, pl.strategy, msg
}

// setCondition sets a condition, keeping its transition time unless its status changes.
func setCondition(st *v1.CatalogLaneStatus, typ string, status metav1.ConditionStatus, reason, message string, gen int64, now metav1.Time) {
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message,
		ObservedGeneration: gen, LastTransitionTime: now})
}
