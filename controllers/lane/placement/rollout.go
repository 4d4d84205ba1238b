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
	// not place a new placement.
	reason, message, unplaceable string
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

// roll decides the rollout's step: the vector space the lane answers in, how many placements
// of the latest spec it may have (newTarget), and which old placements retire now.
func (c *Controller) roll(ctx context.Context, lane *v1.CatalogLane, identity *v1.CertifiedIdentity, deleting int, pl *plan) error {
	newSpace := identity.Spec.VectorSpaceID
	pl.space = lane.Status.VectorSpaceID
	if len(pl.old) == 0 {
		pl.space = newSpace
		return nil
	}
	want := int(lane.Spec.Replicas)
	unavail, surge := maxUnavailable(lane), maxSurge(lane)
	blueGreen := false
	for _, o := range pl.old {
		if o.space != newSpace {
			blueGreen = true
		}
	}
	if pl.space == "" {
		pl.space = newSpace
		if blueGreen {
			pl.space = pl.old[0].space
		}
	}
	pl.strategy = v1.LaneReasonRollingUpdate
	if blueGreen {
		pl.strategy = v1.LaneReasonBlueGreen
	}
	// Old placements of a space the lane no longer answers in (an earlier rollout's, the lane
	// edited again since) serve nothing once the lane's EndpointSlices have followed its switch
	// and they have drained: then they go. Once the lane answers in the new space, the old
	// space's go the same way (below).
	// Until then no step of the rollout retires them: the slices may still list them.
	othersMayGo := true
	if pl.space != newSpace && slices.ContainsFunc(pl.old, func(o *oldPlacement) bool { return o.space != pl.space }) {
		othersMayGo = false
		switch left, followed := c.drainLeft(lane); {
		case !followed:
			pl.awaitingEndpoints = true
		case left > 0:
			pl.drainWait = left
		default:
			othersMayGo = true
			for _, o := range pl.old {
				if o.space != pl.space {
					if err := c.retire(ctx, o); err != nil {
						return err
					}
				}
			}
		}
	}
	// The lane switches to the new space only on placements that can be its endpoints.
	readyNew := 0
	for _, p := range pl.current {
		if c.serves(p) {
			readyNew++
		}
	}
	need := max(want-unavail, 1)
	if want == 0 {
		need = 0
	}

	if pl.space != newSpace {
		// Blue/green, before the switch: the old answer; the new come up beside them.
		if readyNew >= need {
			pl.space, pl.switched, pl.newTarget = newSpace, true, want
			return nil
		}
		// Within maxSurge; maxUnavailable lets old ones go to make room (not-ready first):
		// those of the space the lane answers in (another space's serve no call, and go once
		// they drained, above).
		serving := 0
		for _, o := range pl.old {
			if !o.retired && o.space == pl.space {
				serving++
			}
		}
		excess := serving - surge
		canGo := serving - (want - unavail)
		for _, o := range retirementOrder(pl.old, c.serves) {
			if excess <= 0 || canGo <= 0 {
				break
			}
			if o.space != pl.space && !othersMayGo {
				continue
			}
			if err := c.retire(ctx, o); err != nil {
				return err
			}
			excess--
			canGo--
		}
		pl.newTarget = min(want, len(pl.current)+max(0, want+surge-len(pl.oldLive())-len(pl.current)))
		return nil
	}

	if blueGreen {
		// After the switch: the old leave the endpoints once the endpoints controller has
		// followed the lane's status (it says so in endpointsVectorSpaceGeneration, which
		// counts switches: a rollback is never mistaken for the switch before it). They retire
		// only then, and once they have drained: however long the endpoints controller takes,
		// no client is sent by a slice to a placement that is gone.
		pl.newTarget = want
		if lane.Status.VectorSpaceID != newSpace {
			return nil
		}
		left, followed := c.drainLeft(lane)
		if !followed {
			pl.awaitingEndpoints = true
			return nil
		}
		if left > 0 {
			pl.drainWait = left
			return nil
		}
		key := client.ObjectKeyFromObject(lane)
		// Only the other space's: placements of the new space made old by a later edit within
		// it (the lane edited again during the drain) are the rolling update's to replace, a
		// node at a time, not retired here before their replacements serve.
		for _, o := range pl.old {
			if o.space == newSpace {
				continue
			}
			if err := c.retire(ctx, o); err != nil {
				return err
			}
		}
		c.drained(key)
		return nil
	}

	// Rolling, within one vector space: old and new both answer. Not-ready old placements go
	// at once; a ready one goes only while the lane keeps want-maxUnavailable ready, and only
	// when no placement of the lane is still being retired: a node at a time.
	readyOld := 0
	for _, o := range pl.old {
		if o.retired {
			continue
		}
		if c.serves(o.p) {
			readyOld++
			continue
		}
		if err := c.retire(ctx, o); err != nil {
			return err
		}
	}
	if canGo := readyOld + readyNew - (want - unavail); canGo > 0 && deleting == 0 {
		for _, o := range pl.old {
			if !o.retired {
				if err := c.retire(ctx, o); err != nil {
					return err
				}
				break
			}
		}
	}
	total := len(pl.oldLive()) + len(pl.current)
	pl.newTarget = min(want, len(pl.current)+max(0, want+surge-total))
	return nil
}

// retirementOrder lists the live old placements, those that do not serve first.
func retirementOrder(old []*oldPlacement, serves func(*v1.LanePlacement) bool) []*oldPlacement {
	var out []*oldPlacement
	for _, o := range old {
		if !o.retired {
			out = append(out, o)
		}
	}
	slices.SortStableFunc(out, func(a, b *oldPlacement) int {
		if serves(a.p) == serves(b.p) {
			return 0
		}
		if serves(a.p) {
			return 1
		}
		return -1
	})
	return out
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
