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

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// LeaseNamespace holds the agents' heartbeat Leases, one named after each MacNode (as the node
// lifecycle controller reads them).
const LeaseNamespace = "synapse-node-lease"

// macs prints each Mac's Ready (from its Lease) and the agent's own report, the layer
// executables in use of its budget (resident and pending shapes, as its agent reports them), its
// lanes, how long ago its Lease was renewed, and its compile queue.
func macs(ctx context.Context, s *session, _ []string) error {
	var nodes v1.MacNodeList
	if err := s.kube.List(ctx, &nodes); err != nil {
		return fmt.Errorf("listing Macs: %w", err)
	}
	var leases coordinationv1.LeaseList
	if err := s.kube.List(ctx, &leases, client.InNamespace(LeaseNamespace)); err != nil {
		return fmt.Errorf("listing the Macs' Leases in %s: %w", LeaseNamespace, err)
	}
	renewed := map[string]metav1.Time{}
	for _, l := range leases.Items {
		if l.Spec.RenewTime != nil {
			renewed[l.Name] = metav1.Time{Time: l.Spec.RenewTime.Time}
		}
	}
	var placements v1.LanePlacementList
	if err := s.kube.List(ctx, &placements); err != nil {
		return fmt.Errorf("listing placements: %w", err)
	}
	lanesOn := map[string][]string{}
	for _, p := range placements.Items {
		lanesOn[p.Spec.Node] = append(lanesOn[p.Spec.Node], p.Namespace+"/"+p.Spec.Lane)
	}
	slices.SortFunc(nodes.Items, func(a, b v1.MacNode) int { return strings.Compare(a.Name, b.Name) })
	now := s.clock.Now()
	t := newTable(s.out, "MAC", "READY", "AGENT", "EXECUTABLES", "LANES", "LAST HEARTBEAT", "COMPILE QUEUE", "MACOS", "BACKEND")
	for _, n := range nodes.Items {
		lanes := lanesOn[n.Name]
		slices.Sort(lanes)
		queue := fmt.Sprint(n.Status.CompileQueue.Length)
		if d := n.Status.CompileQueue.PredictedDrainSeconds; d > 0 {
			queue += fmt.Sprintf(" (drains in %ds)", d)
		}
		t.row(n.Name, condition(n.Status.Conditions, v1.ConditionReady), condition(n.Status.Conditions, v1.NodeConditionAgentReady),
			fmt.Sprintf("%d/%d", n.Status.Allocated.LayerExecutables, n.Status.Capacity.LayerExecutables),
			strings.Join(lanes, ","), ago(now, renewed[n.Name]), queue, string(n.Status.Platform.MacOSBuild), string(n.Status.Worker.Backend))
	}
	return t.flush()
}
