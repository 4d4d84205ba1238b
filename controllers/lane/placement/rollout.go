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

package placement

import (
	"context"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/rollout"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
)

// A lane edit reaches its placements in one of three ways, as a Deployment's reaches its Pods:
//
//   - what only the agent's front door reads (requestDeadlineSeconds, prewarmRungs) is written
//     onto every placement at once; the agent applies it without touching the worker;
//   - what the lane is loaded with (ceiling, maxResidentShapes, admissionBoundSeconds, the
//     request limits) is
//     written onto the placements a node at a time within maxUnavailable (at least one): the
//     agent restarts the lane's worker for it;
//   - what changes the answers (identity, task, ladder) is never written onto a placement: new
//     placements of the latest spec replace the old (a rollout). Within one vector space they
//     replace them a node at a time within maxSurge and maxUnavailable, and both answer meanwhile.
//     Across vector spaces (blue/green) the new come up beside the old within maxSurge, and the
//     lane's vector space, which decides whose placements are its endpoints, switches once, when
//     enough of the new are Ready; only then do the old retire. Embeddings of two spaces are
//     never answered under one lane at once.
//
// The lane's observedGeneration is written only once no old placement is left and every
// placement's agent has reported the placement's latest generation.

// plan is what one reconcile found and decided for a lane.
type plan struct {
	// current are the placements of the lane's latest identity, task and ladder; old those of
	// an earlier one, being replaced; live both, for the status.
	current []*v1.LanePlacement
	old     []*oldPlacement
	live    []*v1.LanePlacement
	// space is the vector space the lane answers in.
	space string
	// strategy is the rollout under way (LaneReasonRollingUpdate or LaneReasonBlueGreen), or "".
	strategy string
	// newTarget is how many current placements the rollout allows now.
	newTarget int
	// switched: this reconcile switched the lane to the new vector space. The old placements
	// retire once the lane's EndpointSlices list the new space alone (awaitingEndpoints until
	// then) and SwitchDrain has passed since (drainWait is what is left).
	switched          bool
	awaitingEndpoints bool
	drainWait         time.Duration
	// editsPending: a placement has not been written the lane's latest in-place fields yet, or
	// its agent has not reported its latest generation.
	editsPending bool
	// reason and message are the Placed condition's; unplaceable says why the rollout could
	// not place a new placement; stalled why it cannot go on within its bounds.
	reason, message, unplaceable, stalled string
	// deadlineExceeded: the rollout has not moved for its progress deadline; deadlineWake is
	// how long until it will have, if it does not move before.
	deadlineExceeded bool
	deadlineWake     time.Duration
}

// oldPlacement is a placement of an earlier spec and the vector space it answers in.
type oldPlacement struct {
	p       *v1.LanePlacement
	space   string
	retired bool
}

func (pl *plan) oldLive() []*v1.LanePlacement {
	var out []*v1.LanePlacement
	for _, o := range pl.old {
		if !o.retired {
			out = append(out, o.p)
		}
	}
	return out
}

// target is how many placements of the latest spec the lane should have now.
func (pl *plan) target(want int) int {
	if pl.strategy == "" {
		return want
	}
	return pl.newTarget
}

// sameTemplate reports whether a placement computes what the lane asks now: same identity,
// task, device and ladder.
func sameTemplate(p *v1.LanePlacement, lane *v1.CatalogLane, identity *v1.CertifiedIdentity) bool {
	return p.Spec.Identity == identity.Name && p.Spec.Task == lane.Spec.Task && p.Spec.Device == lane.Spec.Device &&
		slices.Equal(p.Spec.Rungs, lane.Spec.Rungs)
}

// spaceOf is the vector space a placement answers in: as it was made, or, for one made before
// placements carried it, its identity's.
func spaceOf(p *v1.LanePlacement, id *v1.CertifiedIdentity) string {
	if p.Spec.VectorSpaceID != "" || id == nil {
		return p.Spec.VectorSpaceID
	}
	return id.Spec.VectorSpaceID
}

func ready(p *v1.LanePlacement) bool { return p.Status.Phase == v1.PhaseReady }

// serves: the placement is Ready on a node that is Ready, so it can be one of the lane's
// endpoints (one on a node whose Lease lapsed leaves the slices at once, whatever it last
// said). A rollout counts these: it switches spaces on them and keeps them over the others.
func (c *Controller) serves(p *v1.LanePlacement) bool {
	return ready(p) && !meta.IsStatusConditionFalse(p.Status.Conditions, v1.PlacementConditionNodeReady) && c.fleet.healthy(p.Spec.Node)
}

// available: the placement serves and its agent has acted on its latest spec.
func available(p *v1.LanePlacement) bool {
	return ready(p) && p.Status.ObservedGeneration == p.Generation
}

// reported: the placement's agent has acted on its latest spec, or on none yet (it will load
// the latest).
func reported(p *v1.LanePlacement) bool {
	return p.Status.Phase == "" || p.Status.ObservedGeneration >= p.Generation
}

// maxUnavailable and maxSurge are the lane's rollout bounds, clamped to its replicas.
func maxUnavailable(lane *v1.CatalogLane) int {
	return min(int(lane.Spec.Rollout.MaxUnavailable), int(lane.Spec.Replicas))
}

func maxSurge(lane *v1.CatalogLane) int {
	if lane.Spec.Rollout.MaxSurge == nil {
		return int(lane.Spec.Replicas)
	}
	return int(*lane.Spec.Rollout.MaxSurge)
}

// applyEdits writes the lane's in-place fields onto its current placements: the front door's
// at once, the worker's a node at a time within maxUnavailable.
func (c *Controller) applyEdits(ctx context.Context, lane *v1.CatalogLane, identity *v1.CertifiedIdentity, prewarmRungs []v1.Rung, pl *plan) error {
	unavailable := 0
	for _, p := range pl.current {
		if !available(p) {
			unavailable++
		}
	}
	budget := max(1, maxUnavailable(lane))
	for i, p := range pl.current {
		desired := newPlacement(lane, identity, p.Spec.Node, ofLadder(prewarmRungs, p.Spec.Rungs)).Spec
		spec := p.Spec
		spec.RequestDeadlineSeconds, spec.PrewarmRungs = desired.RequestDeadlineSeconds, desired.PrewarmRungs
		worker := func() {
			spec.Ceiling, spec.MaxResidentShapes, spec.AdmissionBoundSeconds = desired.Ceiling, desired.MaxResidentShapes, desired.AdmissionBoundSeconds
			spec.MaxBatchTokens, spec.MaxConcurrentRequests, spec.MaxQueuedRequests = desired.MaxBatchTokens, desired.MaxConcurrentRequests, desired.MaxQueuedRequests
		}
		if spec.Ceiling != desired.Ceiling || spec.MaxResidentShapes != desired.MaxResidentShapes || spec.AdmissionBoundSeconds != desired.AdmissionBoundSeconds ||
			spec.MaxBatchTokens != desired.MaxBatchTokens || spec.MaxConcurrentRequests != desired.MaxConcurrentRequests ||
			!equality.Semantic.DeepEqual(spec.MaxQueuedRequests, desired.MaxQueuedRequests) {
			switch {
			case !available(p):
				worker()
			case unavailable < budget:
				worker()
				unavailable++ // its agent restarts the lane's worker for it
			default:
				pl.editsPending = true // its turn comes when another is back
			}
		}
		if !equalSpec(spec, p.Spec) {
			patched := p.DeepCopy()
			patched.Spec = spec
			if err := c.kube.Patch(ctx, patched, client.MergeFrom(p)); client.IgnoreNotFound(err) != nil {
				return fmt.Errorf("writing lane %s's edits onto placement %s: %w", lane.Name, p.Name, err)
			}
			pl.current[i] = patched
		}
		if !reported(pl.current[i]) {
			pl.editsPending = true
		}
	}
	return nil
}

// equalSpec: nil and empty rung lists are the same (the API server drops an empty one).
func equalSpec(a, b v1.LanePlacementSpec) bool { return equality.Semantic.DeepEqual(a, b) }

// ofLadder keeps the rungs of the ladder: a placement's prewarm rungs must be its own rungs (its
// validation refuses others), even while a lane's new ladder rolls out.
func ofLadder(rungs, ladder []v1.Rung) []v1.Rung {
	var out []v1.Rung
	for _, r := range rungs {
		if slices.Contains(ladder, r) {
			out = append(out, r)
		}
	}
	return out
}

// roll carries out the rollout's step that rollout.Decide takes from what this pass found:
// the vector space the lane answers in, how many placements of the latest spec it may have
// (newTarget), and which old placements retire now.
func (c *Controller) roll(ctx context.Context, lane *v1.CatalogLane, identity *v1.CertifiedIdentity, deleting int, pl *plan) error {
	s := rollout.Snapshot{Replicas: int(lane.Spec.Replicas), MaxSurge: maxSurge(lane), MaxUnavailable: maxUnavailable(lane),
		NewSpace: identity.Spec.VectorSpaceID, Space: lane.Status.VectorSpaceID, Retiring: deleting}
	for _, p := range pl.current {
		s.Current = append(s.Current, rollout.Placement{Space: s.NewSpace, Serves: c.serves(p)})
	}
	for _, o := range pl.old {
		s.Old = append(s.Old, rollout.Placement{Space: o.space, Serves: c.serves(o.p)})
	}
	// Only a lane whose placements answer in more than one space drains (drainLeft remembers
	// when its EndpointSlices followed).
	if slices.ContainsFunc(s.Old, func(o rollout.Placement) bool { return o.Space != s.NewSpace || o.Space != s.Space }) {
		s.Endpoints.DrainLeft, s.Endpoints.Followed = c.drainLeft(lane)
	}
	d := rollout.Decide(s)
	for _, i := range d.Retire {
		if err := c.retire(ctx, pl.old[i]); err != nil {
			return err
		}
	}
	if d.Drained {
		c.drained(client.ObjectKeyFromObject(lane))
	}
	pl.space, pl.switched, pl.strategy, pl.newTarget = d.Space, d.Switched, d.Strategy, d.NewTarget
	pl.awaitingEndpoints, pl.drainWait, pl.stalled = d.AwaitingEndpoints, d.DrainWait, d.Stalled
	return nil
}

func (c *Controller) retire(ctx context.Context, o *oldPlacement) error {
	if o.retired {
		return nil
	}
	if err := c.delete(ctx, o.p); err != nil {
		return err
	}
	o.retired = true
	metrics.PlacementDecisions.WithLabelValues("rolled_out").Inc()
	return nil
}
