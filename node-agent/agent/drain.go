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
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// drainPoll is how often a stopping agent reads whether its placements have left the
// endpoints.
const drainPoll = 250 * time.Millisecond

// drain marks every placement Terminating and waits, the server still answering, until the
// endpoints controller says each one that served is no longer a ready endpoint (its Drained
// condition), or is gone, or DrainTimeout has passed on the agent's clock: a stopping Mac is
// taken out of its lanes' Services before it stops answering, as a Pod's endpoints go
// terminating before its containers stop. It reads through reader (the API server), not the
// cache. It returns the placements still waiting when it gave up.
func (a *Agent) drain(ctx context.Context, reader client.Reader) []types.NamespacedName {
	a.mu.Lock()
	a.stopping = true
	a.mu.Unlock()
	var waiting []types.NamespacedName
	for _, key := range a.placementKeys() {
		a.mu.Lock()
		l := a.lanes[key]
		served := l != nil && l.state == laneReady
		a.mu.Unlock()
		if _, err := a.writePlacementStatus(ctx, key, true); err != nil {
			a.cfg.Log.Info("could not mark a placement terminating; not waiting for it", "placement", key.String(), "error", err.Error())
			continue
		}
		if served {
			waiting = append(waiting, key)
		}
	}
	deadline := a.cfg.Clock.Now().Add(a.cfg.DrainTimeout)
	for {
		waiting = slices.DeleteFunc(waiting, func(key types.NamespacedName) bool {
			p := &v1.LanePlacement{}
			if err := reader.Get(ctx, key, p); err != nil {
				return apierrors.IsNotFound(err)
			}
			return meta.IsStatusConditionTrue(p.Status.Conditions, v1.PlacementConditionDrained)
		})
		now := a.cfg.Clock.Now()
		if len(waiting) == 0 {
			return nil
		}
		if !now.Before(deadline) {
			a.cfg.Log.Info("the lanes' endpoints did not confirm the drain in time; closing the server anyway",
				"waiting", len(waiting), "drainTimeout", a.cfg.DrainTimeout.String())
			return waiting
		}
		select {
		case <-ctx.Done():
			return waiting
		case <-a.cfg.Clock.After(min(drainPoll, deadline.Sub(now))):
		}
	}
}
