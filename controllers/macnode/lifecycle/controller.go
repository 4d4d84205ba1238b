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

// Package lifecycle watches each MacNode's heartbeat: agents renew a coordination.k8s.io Lease
// per node in namespace synapse-node-lease, as kubelets do. A Lease this controller has not
// seen renewed for the grace period turns the node's Ready condition Unknown; after the
// eviction timeout the node's placements are forced away (an event says so) and the placement
// controller re-places their lanes on nodes that are alive. A node that comes back is the same
// MacNode: its renewed Lease makes it Ready again and nothing is duplicated.
//
// The Lease decides Ready, and this controller is Ready's only writer: True while the Lease is
// seen renewed within the grace period, Unknown once it is not. The agent reports its own
// condition types beside it (AgentReady, ANEAvailable, Paused), and each writer applies only
// its own types (internal/statusapply): an agent whose Lease renewals fail while its status
// writes succeed cannot turn the node Ready again, so the node does not flap, lanes are not
// placed on it between flips, and nothing placed there is evicted by the next flip.
//
// As the kubelet's node lifecycle controller does, it times a heartbeat by its own clock, from
// when it saw the renewal, not by the renew time the agent wrote: a skewed agent clock cannot
// keep a dead node alive or kill a live one, a restarted controller gives every node a full
// grace period, and after the controller could not reach the API server it judges no
// heartbeat for one grace period, so the agents can renew before anything is evicted.
//
// Evictions have a brake, as the kubelet's node lifecycle controller's zone states do: they are
// rate limited, and when most of the fleet is unreachable at once, which is a partition between
// the Macs and the API server rather than Macs dying, none happens until the fleet is
// reachable again (eviction.go). What no agent will ever retire is released: the placements
// of a deleted MacNode, and placements being deleted on a node that is Unknown.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements,verbs=get;list;watch;update;patch;delete
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch,namespace=synapse-node-lease

const (
	// LeaseNamespace holds the agents' heartbeat Leases, one named after each MacNode.
	LeaseNamespace = "synapse-node-lease"
	// DefaultGracePeriod is how old a Lease may get before the node is Unknown.
	DefaultGracePeriod = 40 * time.Second
	// DefaultEvictionTimeout is how long a node may stay Unknown before its placements go.
	DefaultEvictionTimeout = 5 * time.Minute
	// DefaultEvictionRate is how many lost nodes a second may have their placements forced away
	// (the kubelet's node lifecycle controller defaults to the same 0.1: one every 10 s).
	DefaultEvictionRate = 0.1
	// DefaultUnhealthyThreshold is the share of unreachable nodes from which evictions stop
	// (the kubelet's node lifecycle controller's --unhealthy-zone-threshold is the same 0.55).
	DefaultUnhealthyThreshold = 0.55
	// minUnreachableForBrake: fewer unreachable nodes than this are Macs dying, whatever the
	// share (in a fleet of two, one lost Mac is half of it).
	minUnreachableForBrake = 3
)

// Controller is the node lifecycle controller.
type Controller struct {
	clk             clock.PassiveClock
	kube            client.Client
	recorder        events.EventRecorder
	grace, eviction time.Duration
	rate            float64
	threshold       float64
	limiter         flowcontrol.PassiveRateLimiter

	mu sync.Mutex
	// beats is, per node, the renewal last seen and when this controller first saw it.
	beats map[string]heartbeat
	// apiFailed is when a call to the API server last failed.
	apiFailed time.Time
	// held is whether evictions were held when last judged, by the judgement begun last of
	// those recorded (judged, its number among judgements; standing, the fleet's health it
	// found), and announced whether that partition's event was sent (see judge).
	held, announced    bool
	judgements, judged uint64
	standing           fleetHealth
	// released is, per node, the placements a pass released that the cache may still list
	// (see unreleased).
	released map[string]map[types.UID]struct{}
}

// heartbeat is one renewal as this controller saw it. changed: it is not the first this
// controller saw of the node (it saw the Lease renewed since it started, or the node is new).
type heartbeat struct {
	renewal string
	seen    time.Time
	changed bool
}

// NewController returns the controller with the default grace period, eviction timeout,
// eviction rate and unhealthy threshold.
func NewController(clk clock.PassiveClock, kube client.Client, recorder events.EventRecorder) *Controller {
	c := &Controller{clk: clk, kube: kube, recorder: recorder, grace: DefaultGracePeriod, eviction: DefaultEvictionTimeout,
		threshold: DefaultUnhealthyThreshold, beats: map[string]heartbeat{}, released: map[string]map[types.UID]struct{}{}}
	return c.WithEvictionRate(DefaultEvictionRate)
}

// WithTimeouts sets the grace period and the eviction timeout; a zero keeps the default.
func (c *Controller) WithTimeouts(grace, eviction time.Duration) *Controller {
	if grace > 0 {
		c.grace = grace
	}
	if eviction > 0 {
		c.eviction = eviction
	}
	return c
}

// WithEvictionRate sets how many lost nodes a second may be evicted (a burst of one); zero
// keeps the default.
func (c *Controller) WithEvictionRate(perSecond float64) *Controller {
	if perSecond > 0 {
		c.rate = perSecond
		c.limiter = flowcontrol.NewTokenBucketPassiveRateLimiterWithClock(float32(perSecond), 1, c.clk)
	}
	return c
}

// WithUnhealthyThreshold sets the share of unreachable nodes (0 to 1) from which evictions
// stop; zero keeps the default.
func (c *Controller) WithUnhealthyThreshold(share float64) *Controller {
	if share > 0 {
		c.threshold = share
	}
	return c
}

// Name of the controller.
func (c *Controller) Name() string { return "macnode.lifecycle" }

// Register watches MacNodes, their Leases, and placements (whose node may be gone).
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.MacNode{}).
		Watches(&coordinationv1.Lease{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if o.GetNamespace() != LeaseNamespace {
				return nil
			}
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: o.GetName()}}}
		})).
		// A placement's node may have been deleted while this controller was away.
		Watches(&v1.LanePlacement{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			if p, ok := o.(*v1.LanePlacement); ok && p.Spec.Node != "" {
				return []reconcile.Request{{NamespacedName: client.ObjectKey{Name: p.Spec.Node}}}
			}
			return nil
		})).
		WithOptions(controller.Options{MaxConcurrentReconciles: MaxConcurrentReconciles}).
		Complete(c)
}

// MaxConcurrentReconciles: an eviction mostly waits on the API server (a node's placements
// released, a finalizer's removal and a delete each), and with one worker lost nodes were
// evicted one after the other. A tenth of a thousand Macs lost at once were evicted at half a
// node a second, not at the eviction rate of 5 (the scale harness's kill storm: 595
// placements deleted over 198 s), while every other node's Lease renewal waited behind them
// in the same queue. The eviction rate (limiter) and the brake are judged by every worker
// alike; a node is never reconciled by two at once (the workqueue).
const MaxConcurrentReconciles = 8

// Reconcile checks one node's heartbeat.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (res reconcile.Result, err error) {
	defer func() {
		if unreachable(err) {
			c.mu.Lock()
			c.apiFailed = c.clk.Now()
			c.mu.Unlock()
		}
	}()
	node := &v1.MacNode{}
	if err := c.kube.Get(ctx, req.NamespacedName, node); err != nil {
		if apierrors.IsNotFound(err) {
			metrics.NodeReady.DeleteLabelValues(req.Name)
			c.mu.Lock()
			delete(c.beats, req.Name)
			c.mu.Unlock()
			return reconcile.Result{}, c.releaseAll(ctx, req.Name)
		}
		return reconcile.Result{}, err
	}
	now := c.clk.Now()
	renewed, renewal, changed, err := c.lastRenewal(ctx, node.Name, now)
	if err != nil {
		return reconcile.Result{}, err
	}
	expiresAt := renewed.Add(c.grace)
	// A node this controller finds not Ready, whose Lease it has not seen renewed since it
	// started (a restart, a new leader), stays as it is: the renewal it counts from now is the
	// one that made the node Unknown, not a new one. It neither turns Ready for a grace period
	// (a dead Mac flapping on every controller restart) nor is written again; its eviction
	// counts from now (a restart delays it, never hastens it).
	if cond := meta.FindStatusCondition(node.Status.Conditions, v1.ConditionReady); !changed && cond != nil && cond.Status != metav1.ConditionTrue {
		metrics.NodeReady.WithLabelValues(node.Name).Set(0)
		return c.releaseAndEvict(ctx, node, renewed, now)
	}
	if now.Before(expiresAt) {
		metrics.NodeReady.WithLabelValues(node.Name).Set(1)
		c.forgetReleases(node.Name)
		if err := c.healed(ctx); err != nil {
			return reconcile.Result{}, err
		}
		if renewal != noLease {
			if err := c.setReady(ctx, node, metav1.ConditionTrue, v1.NodeReasonLeaseRenewed, fmt.Sprintf(
				"the agent's Lease is renewed within the %s grace period", c.grace)); err != nil {
				return reconcile.Result{}, err
			}
		}
		if err := c.markPlacements(ctx, node, true, "the node's Lease is renewed"); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: expiresAt.Sub(now)}, c.lift(ctx, node, "the node's Lease is renewed again")
	}
	c.mu.Lock()
	judgeAt := c.apiFailed.Add(c.grace)
	c.mu.Unlock()
	if now.Before(judgeAt) {
		// The API server was unreachable lately: the agents may not have been able to renew
		// either. They get a grace period from then before this node is judged.
		return reconcile.Result{RequeueAfter: judgeAt.Sub(now)}, nil
	}
	metrics.NodeReady.WithLabelValues(node.Name).Set(0)

	// The message names the renewal last seen, not the time now: it changes only with the
	// Lease, so an Unknown node is written once, not on every look.
	if err := c.setReady(ctx, node, metav1.ConditionUnknown, v1.NodeReasonLeaseExpired, fmt.Sprintf(
		"the agent's Lease (%s) has not been seen renewed since %s", renewal, renewed.UTC().Format(time.RFC3339))); err != nil {
		return reconcile.Result{}, err
	}
	// Its placements are marked not ready at once, so the lanes' endpoints drop them now, not
	// at the eviction minutes later.
	if err := c.markPlacements(ctx, node, false, fmt.Sprintf("node %s is Unknown: its agent's Lease has not been seen renewed since %s",
		node.Name, renewed.UTC().Format(time.RFC3339))); err != nil {
		return reconcile.Result{}, err
	}
	return c.releaseAndEvict(ctx, node, renewed, now)
}

// unreachable reports whether err says the API server could not be reached or could not
// serve: no answer (a refused connection, a timeout), or 429, 500, 503 or 504. Then the agents'
// renewals may have failed as well, and no heartbeat is judged for a grace period. An answer
// about the request (422 from a JSON patch's test, 409, 404, 403) says the server is there:
// judging every node of the fleet stopped for it, a failed write of one node's kept a dead Mac
// Ready, in the endpoints, for as long as that write went on failing.
func unreachable(err error) bool {
	if err == nil {
		return false
	}
	var netErr net.Error // a *url.Error among them: the request never got its answer
	if errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) || utilnet.IsProbableEOF(err) ||
		utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) {
		return true
	}
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsTooManyRequests(err) ||
		apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err)
}

// releaseAndEvict is what becomes of a node that is not Ready: placements already being
// deleted there will not be retired by an agent that is gone, and releasing them re-places
// nothing, so neither the timeout nor the brake applies to them; the others are evicted once
// the eviction timeout has passed since the renewal last seen, within the brake.
func (c *Controller) releaseAndEvict(ctx context.Context, node *v1.MacNode, renewed, now time.Time) (reconcile.Result, error) {
	if err := c.releaseDeleted(ctx, node.Name); err != nil {
		return reconcile.Result{}, err
	}
	evictAt := renewed.Add(c.grace + c.eviction)
	if now.Before(evictAt) {
		return reconcile.Result{RequeueAfter: evictAt.Sub(now)}, nil
	}
	return c.evictWithBrake(ctx, node, now)
}

// setReady writes the node's Ready condition when it differs from what the node holds. This
// controller is its only writer: the Lease decides Ready, and the agent reports its own
// conditions (AgentReady and the rest) beside it. The condition is applied on its own (see
// internal/statusapply), so neither the agent's status writes nor this one's touch the other's.
func (c *Controller) setReady(ctx context.Context, node *v1.MacNode, status metav1.ConditionStatus, reason, message string) error {
	cond := metav1.Condition{Type: v1.ConditionReady, Status: status, Reason: reason, Message: message,
		ObservedGeneration: node.Generation, LastTransitionTime: metav1.NewTime(c.clk.Now())}
	if !statusapply.Changed(node.Status.Conditions, cond) {
		return nil
	}
	var was metav1.ConditionStatus // "" when the node has none yet
	if c := meta.FindStatusCondition(node.Status.Conditions, v1.ConditionReady); c != nil {
		was = c.Status
	}
	cond = statusapply.Next(node.Status.Conditions, cond)
	if err := statusapply.ApplyCondition(ctx, c.kube, node.Name, statusapply.Manager(statusapply.LifecycleManager, v1.ConditionReady), cond); err != nil {
		return fmt.Errorf("writing the Ready condition of MacNode %s: %w", node.Name, err)
	}
	meta.SetStatusCondition(&node.Status.Conditions, cond)
	switch {
	case status == metav1.ConditionUnknown && was != metav1.ConditionUnknown:
		c.recorder.Eventf(node, nil, "Warning", v1.NodeReasonLeaseExpired, "Heartbeat", "the agent's Lease expired; the node is Unknown")
	case status == metav1.ConditionTrue && was != "" && was != metav1.ConditionTrue:
		c.recorder.Eventf(node, nil, "Normal", v1.NodeReasonLeaseRenewed, "Heartbeat", "the agent's Lease is renewed again; the node is Ready")
	}
	return nil
}

// markPlacements writes the NodeReady condition of the node's placements: False on every one
// while the node is Unknown; back to True, on those marked, once it is renewed again.
func (c *Controller) markPlacements(ctx context.Context, node *v1.MacNode, ready bool, message string) error {
	// Every Lease renewal of every node comes here: the cache's objects are read as they are,
	// and only one to be written is copied (client.UnsafeDisableDeepCopy: never mutate them).
	var placements v1.LanePlacementList
	if err := c.kube.List(ctx, &placements, client.MatchingFields{v1.FieldPlacementNode: node.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return err
	}
	status, reason := metav1.ConditionFalse, v1.PlacementReasonNodeUnknown
	if ready {
		status, reason = metav1.ConditionTrue, v1.PlacementReasonNodeReady
	}
	for i := range placements.Items {
		cond := meta.FindStatusCondition(placements.Items[i].Status.Conditions, v1.PlacementConditionNodeReady)
		if (ready && (cond == nil || cond.Status == metav1.ConditionTrue)) || (!ready && cond != nil && cond.Status == metav1.ConditionFalse) {
			continue
		}
		stored := placements.Items[i].DeepCopy()
		p := stored.DeepCopy()
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionNodeReady, Status: status, Reason: reason,
			Message: message, ObservedGeneration: p.Generation, LastTransitionTime: metav1.NewTime(c.clk.Now())})
		// Optimistic: a write of the agent's in between is retried, never overwritten.
		if err := c.kube.Status().Patch(ctx, p, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("marking placement %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return nil
}

// noLease is how a node's renewal reads while its agent has created no Lease: it is not
// Ready (the Lease decides), and after a grace period from when it was first seen, Unknown.
const noLease = "none yet"

// lastRenewal is when this controller first saw the node's current renewal: the Lease's renew
// time as the agent wrote it, or, with no Lease yet, the node's existence. A renewal seen for
// the first time (a new node, a renewed Lease, a restarted controller) counts from now. It
// returns the renewal as written, for the status message, and whether it is one this
// controller saw change (false for the first it saw of the node).
func (c *Controller) lastRenewal(ctx context.Context, name string, now time.Time) (time.Time, string, bool, error) {
	// Read only (sawRenewal), as the cache holds it: every renewal of every node is read here.
	lease := &coordinationv1.Lease{}
	err := c.kube.Get(ctx, client.ObjectKey{Namespace: LeaseNamespace, Name: name}, lease, client.UnsafeDisableDeepCopy)
	switch {
	case apierrors.IsNotFound(err):
		lease = nil
	case err != nil:
		return time.Time{}, "", false, err
	}
	return c.sawRenewal(name, lease, now)
}

// sawRenewal records the lease's renewal of node name as seen now if it is new, and returns
// when it was first seen and how it reads.
func (c *Controller) sawRenewal(name string, lease *coordinationv1.Lease, now time.Time) (time.Time, string, bool, error) {
	renewal := renewalOf(lease)
	c.mu.Lock()
	defer c.mu.Unlock()
	b, ok := c.beats[name]
	if !ok || b.renewal != renewal {
		b = heartbeat{renewal: renewal, seen: now, changed: ok}
		c.beats[name] = b
	}
	return b.seen, renewal, b.changed, nil
}

// seenRenewal is when this controller first saw the lease's renewal of node name, or now if it
// has not seen it yet. Unlike sawRenewal it records nothing: the fleet's health is judged from
// a cached list of nodes, which may still hold a node whose deletion has already removed its
// entry, and that entry must not come back. The node's own pass records the renewal.
func (c *Controller) seenRenewal(name string, lease *coordinationv1.Lease, now time.Time) time.Time {
	renewal := renewalOf(lease)
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.beats[name]; ok && b.renewal == renewal {
		return b.seen
	}
	return now
}

// renewalOf is how the lease's last renewal reads: its renew time as the agent wrote it, its
// creation if it was never renewed, or noLease.
func renewalOf(lease *coordinationv1.Lease) string {
	switch {
	case lease == nil:
		return noLease
	case lease.Spec.RenewTime != nil:
		return "renewed at " + lease.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	default:
		return "created at " + lease.CreationTimestamp.UTC().Format(time.RFC3339)
	}
}
