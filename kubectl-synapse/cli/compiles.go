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

package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/duration"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// compiles prints, per Mac, its compile queue (what runs, how many wait, when it is predicted
// to drain) and every placement on it with a compile in progress: the rung, the layers done of
// the total, and when the rung is predicted ready. One Mac compiles one layer at a time for the
// whole machine, so the placements of a Mac are listed in the order they are predicted ready.
func compiles(ctx context.Context, s *session, _ []string) error {
	var nodes v1.MacNodeList
	if err := s.kube.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing Macs: %w", err)
	}
	var placements v1.LanePlacementList
	if err := s.kube.List(ctx, &placements); err != nil {
		return fmt.Errorf("listing placements: %w", err)
	}
	compiling := map[string][]v1.LanePlacement{}
	for _, p := range placements.Items {
		if p.Status.Compile != nil {
			compiling[p.Spec.Node] = append(compiling[p.Spec.Node], p)
		}
	}
	slices.SortFunc(nodes.Items, func(a, b v1.MacNode) int { return strings.Compare(a.Name, b.Name) })
	now := s.clock.Now()
	t := newTable(s.out, "MAC", "RUNNING", "QUEUED", "DRAINS", "PLACEMENT", "RUNG", "LAYERS", "ETA")
	for _, n := range nodes.Items {
		q := n.Status.CompileQueue
		drains := ""
		if q.PredictedDrainSeconds > 0 {
			drains = "in " + duration.HumanDuration(time.Duration(q.PredictedDrainSeconds)*time.Second)
		}
		ps := compiling[n.Name]
		slices.SortFunc(ps, func(a, b v1.LanePlacement) int {
			return readyTime(a).Compare(readyTime(b))
		})
		if len(ps) == 0 {
			t.row(n.Name, q.Running, fmt.Sprint(q.Length), drains, "", "", "", "")
			continue
		}
		for _, p := range ps {
			c := p.Status.Compile
			t.row(n.Name, q.Running, fmt.Sprint(q.Length), drains, p.Namespace+"/"+p.Name, fmt.Sprint(c.Rung),
				fmt.Sprintf("%d/%d", c.LayersDone, c.LayersTotal), in(now, c.PredictedReadyTime))
		}
	}
	return t.flush()
}

// readyTime is when the placement's compile is predicted done; the zero time (first) if unknown.
func readyTime(p v1.LanePlacement) time.Time {
	if c := p.Status.Compile; c != nil && c.PredictedReadyTime != nil {
		return c.PredictedReadyTime.Time
	}
	return time.Time{}
}
