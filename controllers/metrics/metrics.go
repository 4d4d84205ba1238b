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

// Package metrics holds the controller's Prometheus metrics, registered with
// controller-runtime's registry so the manager's /metrics serves them beside its own
// (reconcile counts, errors and latencies per controller).
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	// PlacementDecisions counts placements created, retired for an identity mismatch, removed
	// by a scale down, or forced away from a lost node.
	PlacementDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "synapse_placement_decisions_total",
		Help: "Placement decisions, by decision (placed, identity_mismatch, scaled_down, node_lost).",
	}, []string{"decision"})

	// UnplaceableLanes is 1 for each lane that is not fully placed, with the reason.
	UnplaceableLanes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "synapse_unplaceable_lanes",
		Help: "1 for each lane not fully placed, labelled with its namespace, name and reason.",
	}, []string{"namespace", "lane", "reason"})

	// NodeReady is 1 for a Ready MacNode, 0 for one whose Lease expired.
	NodeReady = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "synapse_macnode_ready",
		Help: "1 when the MacNode's agent heartbeats, 0 when its Lease expired.",
	}, []string{"node"})

	// EvictionsHeld is 1 while the node lifecycle holds evictions because too much of the fleet
	// is unreachable at once, with the number of unreachable nodes in UnreachableNodes.
	EvictionsHeld = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "synapse_evictions_held",
		Help: "1 while evictions are held because most of the fleet is unreachable at once (a partition), else 0.",
	})
	// UnreachableNodes is how many MacNodes' Leases were stale when evictions were last judged.
	UnreachableNodes = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "synapse_unreachable_macnodes",
		Help: "MacNodes whose Lease had not been seen renewed within the grace period when evictions were last judged.",
	})
)

func init() {
	ctrlmetrics.Registry.MustRegister(PlacementDecisions, UnplaceableLanes, NodeReady, EvictionsHeld, UnreachableNodes)
}
