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

package lifecycle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// fleetHealth is how many nodes are unreachable, of how many, when evictions are judged.
type fleetHealth struct {
	unreachable, total int
}

// partitioned reports whether the share of unreachable nodes calls for the brake: at least
// minUnreachableForBrake of them and at least the threshold's share, or every node (as the
// kubelet's node lifecycle controller stops evicting in a zone whose nodes are all NotReady:
// the control plane, not the nodes, is the likelier fault).
func (c *Controller) partitioned(h fleetHealth) bool {
	if h.unreachable == 0 {
		return false
	}
	if h.unreachable == h.total {
		return true
	}
	return h.unreachable >= minUnreachableForBrake && float64(h.unreachable) >= c.threshold*float64(h.total)
}

// health counts the nodes whose Lease this controller has not seen renewed within the grace
// period, by the same clock and rule as each node's own judgement.
func (c *Controller) health(ctx context.Context, now time.Time) (fleetHealth, error) {
	var nodes v1.MacNodeList
	if err := c.kube.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return fleetHealth{}, err
	}
	var leases coordinationv1.LeaseList
	if err := c.kube.List(ctx, &leases, client.InNamespace(LeaseNamespace), client.UnsafeDisableDeepCopy); err != nil {
		return fleetHealth{}, err
	}
	byName := make(map[string]*coordinationv1.Lease, len(leases.Items))
	for i := range leases.Items {
		byName[leases.Items[i].Name] = &leases.Items[i]
	}
	h := fleetHealth{total: len(nodes.Items)}
	for _, n := range nodes.Items {
		if !now.Before(c.seenRenewal(n.Name, byName[n.Name], now).Add(c.grace)) {
			h.unreachable++
		}
	}
	return h, nil
}

// evictWithBrake forces a lost node's placements away, unless most of the fleet is unreachable
// (then the node's EvictionHeld condition and an event say so, and it is judged again after a
// grace period) or the eviction rate is spent (then it waits its turn). A node whose
// placements are all released already takes no turn: each release's delete brings the node
// back here, and had those passes taken the limiter's tokens, the other lost nodes would have
// waited behind them for nothing.
func (c *Controller) evictWithBrake(ctx context.Context, node *v1.MacNode, now time.Time) (reconcile.Result, error) {
	h, held, err := c.judge(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	if held {
		if err := c.hold(ctx, node, h, now); err != nil {
			return reconcile.Result{}, err
		}
		return reconcile.Result{RequeueAfter: c.grace}, nil
	}
	why := fmt.Sprintf("%d of %d nodes are unreachable; evictions resume", h.unreachable, h.total)
	placements, err := c.unreleased(ctx, node.Name, unretired)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(placements) == 0 {
		return reconcile.Result{}, c.lift(ctx, node, why)
	}
	if !c.limiter.TryAccept() {
		return reconcile.Result{RequeueAfter: time.Duration(float64(time.Second) / c.rate)}, nil
	}
	if err := c.lift(ctx, node, why); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, c.evict(ctx, node, placements)
}

// healed judges the fleet again while evictions are held, when a node is seen alive: the hold
// (and synapse_evictions_held) ends once few enough nodes are unreachable, even if no lost node
// is left to evict.
func (c *Controller) healed(ctx context.Context) error {
	c.mu.Lock()
	held := c.held
	c.mu.Unlock()
	if !held {
		return nil
	}
	_, _, err := c.judge(ctx)
	return err
}

// judge judges the fleet's health now and returns the verdict that stands: the fleet's health
// and whether evictions are held. The lifecycle workers judge the fleet side by side, each from
// its own lists; a judgement is numbered, and its time read, as it begins, and one begun
// before the last one recorded is older news and dropped: a hold judged from an older list
// could otherwise land after a newer "healed" and flip synapse_evictions_held back on (and
// every message would carry its stale counts).
func (c *Controller) judge(ctx context.Context) (fleetHealth, bool, error) {
	c.mu.Lock()
	c.judgements++
	seq, now := c.judgements, c.clk.Now()
	c.mu.Unlock()
	h, err := c.health(ctx, now)
	if err != nil {
		return fleetHealth{}, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if seq > c.judged {
		c.judged, c.standing, c.held = seq, h, c.partitioned(h)
		if !c.held {
			c.announced = false
		}
		metrics.UnreachableNodes.Set(float64(h.unreachable))
		metrics.EvictionsHeld.Set(0)
		if c.held {
			metrics.EvictionsHeld.Set(1)
		}
	}
	return c.standing, c.held, nil
}

// announce reports whether the partition that holds evictions is yet to be announced (an
// event), once per partition, whichever judgement began the hold.
func (c *Controller) announce() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.held && !c.announced
	c.announced = c.announced || c.held
	return first
}

// hold sets the node's EvictionHeld condition; the first hold of a partition is an event too.
func (c *Controller) hold(ctx context.Context, node *v1.MacNode, h fleetHealth, now time.Time) error {
	msg := fmt.Sprintf("%d of %d MacNodes (%.0f%%) are unreachable at once, which looks like a partition between the Macs and the API server "+
		"rather than Macs dying: evictions are held until the fleet is reachable again", h.unreachable, h.total, 100*float64(h.unreachable)/float64(h.total))
	if _, err := c.setEvictionHeld(ctx, node, metav1.ConditionTrue, v1.NodeReasonFleetPartitioned, msg, now); err != nil {
		return err // not announced: the next hold announces it
	}
	if c.announce() {
		c.recorder.Eventf(node, nil, "Warning", v1.NodeReasonFleetPartitioned, "Evict", msg)
	}
	return nil
}

// lift turns a held node's EvictionHeld condition False, saying why.
func (c *Controller) lift(ctx context.Context, node *v1.MacNode, why string) error {
	if !meta.IsStatusConditionTrue(node.Status.Conditions, v1.NodeConditionEvictionHeld) {
		return nil
	}
	if _, err := c.setEvictionHeld(ctx, node, metav1.ConditionFalse, v1.NodeReasonEvictionResumed, why, c.clk.Now()); err != nil {
		return err
	}
	c.recorder.Eventf(node, nil, "Normal", v1.NodeReasonEvictionResumed, "Evict", why)
	return nil
}

// setEvictionHeld applies the node's EvictionHeld condition, on its own (see setReady), when it
// changes; it reports whether it wrote.
func (c *Controller) setEvictionHeld(ctx context.Context, node *v1.MacNode, status metav1.ConditionStatus, reason, message string, now time.Time) (bool, error) {
	cond := metav1.Condition{Type: v1.NodeConditionEvictionHeld, Status: status, Reason: reason, Message: message,
		ObservedGeneration: node.Generation, LastTransitionTime: metav1.NewTime(now)}
	if !statusapply.Changed(node.Status.Conditions, cond) {
		return false, nil
	}
	cond = statusapply.Next(node.Status.Conditions, cond)
	if err := statusapply.ApplyCondition(ctx, c.kube, node.Name, statusapply.Manager(statusapply.LifecycleManager, v1.NodeConditionEvictionHeld), cond); err != nil {
		return false, fmt.Errorf("writing the EvictionHeld condition of MacNode %s: %w", node.Name, err)
	}
	meta.SetStatusCondition(&node.Status.Conditions, cond)
	return true, nil
}

// evict forces the dead node's placements away: the agent that would remove their retirement
// finalizers is gone, so the finalizer goes with the placement.
func (c *Controller) evict(ctx context.Context, node *v1.MacNode, placements []*v1.LanePlacement) error {
	return c.releaseEach(ctx, node.Name, placements, func(p *v1.LanePlacement) {
		metrics.PlacementDecisions.WithLabelValues("node_lost").Inc()
		c.recorder.Eventf(p, node, "Warning", "NodeLost", "Evict",
			"node %s has been Unknown for %s; placement forced away to be re-placed", node.Name, c.eviction)
	})
}

// releaseAll releases every placement of a node whose MacNode is gone: no agent of that name
// will retire them (a Mac joined again under the name starts from its new placements).
func (c *Controller) releaseAll(ctx context.Context, node string) error {
	placements, err := c.unreleased(ctx, node, unretired)
	if err != nil {
		return err
	}
	return c.releaseEach(ctx, node, placements, func(p *v1.LanePlacement) {
		metrics.PlacementDecisions.WithLabelValues("node_deleted").Inc()
		c.recorder.Eventf(p, nil, "Warning", "NodeDeleted", "Release", "MacNode %s was deleted; placement released", node)
	})
}

// releaseDeleted releases the node's placements that are already being deleted (their lane
// or namespace was deleted, they were scaled down, or an eviction's delete went through and
// its finalizer's removal did not) while the node is Unknown.
func (c *Controller) releaseDeleted(ctx context.Context, node string) error {
	placements, err := c.unreleased(ctx, node, func(p *v1.LanePlacement) bool {
		return !p.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(p, v1.FinalizerRetirement)
	})
	if err != nil {
		return err
	}
	return c.releaseEach(ctx, node, placements, func(p *v1.LanePlacement) {
		c.recorder.Eventf(p, nil, "Warning", "NodeLost", "Release", "node %s is Unknown; the deleted placement is released without its retirement", node)
	})
}

// unretired picks the placements that are yet to go: not being deleted, or held by their
// retirement finalizer (one being deleted with it gone needs nothing more of this controller).
func unretired(p *v1.LanePlacement) bool {
	return p.DeletionTimestamp.IsZero() || controllerutil.ContainsFinalizer(p, v1.FinalizerRetirement)
}

// unreleased lists the node's placements that which picks and that no pass of this
// controller has released yet. The list comes from the manager's cache, which shows a release
// only when its events arrive: until then every pass over the node (each release's delete
// brings one) would release the same placements again, with writes the API server refuses as
// not found (256 in a thousand Macs' kill storm before this record). What the cache no longer
// lists is forgotten (a UID is never reused: a placement made again is a new one).
func (c *Controller) unreleased(ctx context.Context, node string, which func(*v1.LanePlacement) bool) ([]*v1.LanePlacement, error) {
	var placements v1.LanePlacementList
	if err := c.kube.List(ctx, &placements, client.MatchingFields{v1.FieldPlacementNode: node}); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	done := c.released[node]
	listed := make(map[types.UID]struct{}, len(done))
	var picked []*v1.LanePlacement
	for i := range placements.Items {
		p := &placements.Items[i]
		if _, ok := done[p.UID]; ok {
			listed[p.UID] = struct{}{}
			continue
		}
		if which(p) {
			picked = append(picked, p)
		}
	}
	if len(listed) == 0 {
		delete(c.released, node)
	} else {
		c.released[node] = listed
	}
	return picked, nil
}

// releasedOne records that placement p of the node is released (see unreleased).
func (c *Controller) releasedOne(node string, p *v1.LanePlacement) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released[node] == nil {
		c.released[node] = map[types.UID]struct{}{}
	}
	c.released[node][p.UID] = struct{}{}
}

// forgetReleases forgets what was released of a node that is Ready again: its agent retires
// its own placements, and what it does not is released again should the node be lost again.
func (c *Controller) forgetReleases(node string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.released, node)
}

// ReleaseParallelism is how many of one node's placements are released at once. A release is
// up to two writes (the delete, the finalizer's removal); one after the other, a node's five
// to eleven placements took seconds on a busy API server, and a tenth of a thousand Macs lost
// at once were evicted at that pace rather than at the eviction rate.
const ReleaseParallelism = 8

// releaseEach releases the node's placements, up to ReleaseParallelism at a time, calling
// released after each. A release under way when another fails is finished; those not yet
// begun are given up, for the next reconcile to list again. It returns every failure.
func (c *Controller) releaseEach(ctx context.Context, node string, placements []*v1.LanePlacement, released func(*v1.LanePlacement)) error {
	var (
		g      errgroup.Group
		mu     sync.Mutex
		failed []error
	)
	g.SetLimit(ReleaseParallelism)
	for _, p := range placements {
		mu.Lock()
		stop := len(failed) > 0
		mu.Unlock()
		if stop {
			break
		}
		g.Go(func() error {
			if err := c.release(ctx, p); err != nil {
				mu.Lock()
				failed = append(failed, fmt.Errorf("releasing placement %s/%s: %w", p.Namespace, p.Name, err))
				mu.Unlock()
				return nil
			}
			c.releasedOne(node, p)
			released(p)
			return nil
		})
	}
	_ = g.Wait() // every failure is in failed
	return errors.Join(failed...)
}

// release deletes the placement, then removes its retirement finalizer, which lets the API
// server remove it. The delete comes first: from then on the placement no longer counts as a
// replica, and should the finalizer's removal fail, what is left is a placement being deleted
// on an Unknown node, which the node's next pass releases (releaseDeleted) whatever became of
// its eviction. The finalizer goes by a JSON patch that tests that the placement is the one
// read (its UID) and the finalizer still where the copy read shows it: no resourceVersion is
// sent, so a status write in between (this controller marks the placements NodeReady False
// just before; the agent's writer may have written last) is no conflict, as it was to an
// update from the cache's copy, and no other finalizer is removed with it.
func (c *Controller) release(ctx context.Context, p *v1.LanePlacement) error {
	if p.DeletionTimestamp.IsZero() {
		// Preconditioned on its UID: a placement made again under the name since is not
		// this one (the conflict says this one is gone).
		err := c.kube.Delete(ctx, p, client.Preconditions{UID: &p.UID})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil
		}
		if err != nil {
			return err
		}
	}
	at := slices.Index(p.Finalizers, v1.FinalizerRetirement)
	if at < 0 {
		return nil
	}
	patch, err := json.Marshal([]jsonPatchOp{
		{Op: "test", Path: "/metadata/uid", Value: string(p.UID)},
		{Op: "test", Path: fmt.Sprintf("/metadata/finalizers/%d", at), Value: v1.FinalizerRetirement},
		{Op: "remove", Path: fmt.Sprintf("/metadata/finalizers/%d", at)},
	})
	if err != nil {
		return err
	}
	return client.IgnoreNotFound(c.kube.Patch(ctx, p.DeepCopy(), client.RawPatch(types.JSONPatchType, patch)))
}

// jsonPatchOp is one operation of a JSON patch (RFC 6902).
type jsonPatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value string `json:"value,omitempty"`
}
