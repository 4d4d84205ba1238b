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

// Package statusapply writes the status of MacNodes, LanePlacements and CatalogLanes by
// server-side apply, so that each fact has one writer and no writer erases another's. A
// MacNode's conditions are written by three: the node's agent (AgentReady, ANEAvailable,
// TempSpaceLow, Paused, and the rest of the status), the node lifecycle controller (Ready, from
// the Lease, and EvictionHeld) and the endpoints controller (AddressAllowed); a
// LanePlacement's by the agent (its phase, shapes and most conditions), the lifecycle
// controller (NodeReady) and the endpoints controller (Drained); a CatalogLane's by the
// placement controller and the endpoints controller (ServiceReady). A merge patch replaces a list whole, so a writer that patched the
// conditions from a stale copy erased or reverted the others' (the agent's Ready=True and the
// controller's Unknown overwrote each other on every pass).
//
// status.conditions is `+listType=map` keyed by `type`: the API server merges an applied
// configuration into it entry by entry, and an entry belongs to the field manager that applied
// it (kubernetes/website content/en/docs/reference/using-api/server-side-apply.md, "Merge
// strategy"; kubernetes/community contributors/devel/sig-architecture/api-conventions.md,
// "Lists of named subobjects preferred over maps"). A manager's apply leaves the entries it
// does not name alone, unless it applied them itself before: then they are removed. That is
// why each condition the controllers write has a field manager of its own (Manager): a
// controller that writes two types at different moments, from a cache that may not yet show
// the other, never drops one by applying the other.
package statusapply

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// Field managers of the MacNode's status writers.
const (
	// AgentManager owns what the node's agent reports: the status fields and the conditions
	// of AgentConditions.
	AgentManager = "synapse-agent"
	// LifecycleManager prefixes the node lifecycle controller's condition managers.
	LifecycleManager = "synapse-node-lifecycle"
	// AddressManager prefixes the endpoints controller's condition manager.
	AddressManager = "synapse-node-address"
)

// AgentConditions are the condition types the node's agent writes; the others are the
// controllers'. The node-restriction policy refuses an agent's write that changes any other
// (config/policies/node_restriction.yaml, rule macnode-conditions).
var AgentConditions = []string{v1.NodeConditionAgentReady, v1.NodeConditionANEAvailable, v1.NodeConditionTempSpaceLow, v1.NodeConditionPaused}

// AgentPlacementConditions are the placement condition types the node's agent writes;
// NodeReady is the lifecycle controller's, Drained the endpoints controller's.
var AgentPlacementConditions = []string{v1.ConditionReady, v1.PlacementConditionArtifactVerified, v1.PlacementConditionWorkerRunning,
	v1.PlacementConditionSelfChecked, v1.PlacementConditionTerminating}

// Manager is the field manager of one controller's condition type: the controller's prefix and
// the type, so that each type a controller writes is applied, and kept, on its own.
func Manager(prefix, conditionType string) string { return prefix + "-" + conditionType }

// Next is cond as it should be applied over the conditions the node has now: its
// lastTransitionTime stays the stored one when its status does not change, as
// meta.SetStatusCondition keeps it.
func Next(current []metav1.Condition, cond metav1.Condition) metav1.Condition {
	conds := slices.Clone(current)
	meta.SetStatusCondition(&conds, cond)
	return *meta.FindStatusCondition(conds, cond.Type)
}

// Changed reports whether applying cond would change what the node holds of its type (its
// status, reason, message or observed generation).
func Changed(current []metav1.Condition, cond metav1.Condition) bool {
	c := meta.FindStatusCondition(current, cond.Type)
	return c == nil || c.Status != cond.Status || c.Reason != cond.Reason || c.Message != cond.Message ||
		c.ObservedGeneration != cond.ObservedGeneration
}

// ApplyCondition writes one condition of the node named node under manager, leaving every
// other condition as it is. Ownership is forced: the type is this writer's alone, and a node
// written before the writers were split has it owned by an older manager.
func ApplyCondition(ctx context.Context, c client.Client, node, manager string, cond metav1.Condition) error {
	return apply(ctx, c, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: node}}, "MacNode", manager, struct {
		Conditions []metav1.Condition `json:"conditions"`
	}{Conditions: []metav1.Condition{cond}})
}

// ApplyAgentStatus writes the status the node's agent reports: every field of st, and of its
// conditions only AgentConditions; whatever else st holds (a controller's condition read from
// the cache) is left out, so it is neither written nor taken over.
func ApplyAgentStatus(ctx context.Context, c client.Client, node string, st v1.MacNodeStatus) error {
	st.Conditions = only(st.Conditions, AgentConditions)
	return apply(ctx, c, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: node}}, "MacNode", AgentManager, st)
}

// ApplyAgentPlacementStatus writes a placement's status as its node's agent reports it: every
// field of st, and of its conditions only AgentPlacementConditions. A condition the agent
// applied before and leaves out now (Terminating, once the agent runs again) is removed.
// It returns the placement as the API server answered the write: the object written (its UID)
// and its resourceVersion after it.
func ApplyAgentPlacementStatus(ctx context.Context, c client.Client, key types.NamespacedName, st v1.LanePlacementStatus) (*v1.LanePlacement, error) {
	st.Conditions = only(st.Conditions, AgentPlacementConditions)
	p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	err := apply(ctx, c, p, "LanePlacement", AgentManager, st)
	return p, err
}

// OverlayAgentPlacementStatus sets in dst what ApplyAgentPlacementStatus writes of src (every
// field, and the conditions of AgentPlacementConditions), and leaves the controllers'
// conditions of dst as they are.
func OverlayAgentPlacementStatus(dst *v1.LanePlacementStatus, src *v1.LanePlacementStatus) {
	theirs := slices.DeleteFunc(slices.Clone(dst.Conditions), func(c metav1.Condition) bool { return slices.Contains(AgentPlacementConditions, c.Type) })
	*dst = *src.DeepCopy()
	dst.Conditions = append(only(dst.Conditions, AgentPlacementConditions), theirs...)
}

// CacheBehind reports whether an object read from a cache at resourceVersion cached predates a
// write of the reader's own, which left it at wrote. Resource versions are ordered
// (apimachinery pkg/util/resourceversion, CompareResourceVersion); one that is not well formed
// (a storage that does not promise the order) is taken as not behind.
func CacheBehind(cached, wrote string) bool {
	cmp, err := resourceversion.CompareResourceVersion(cached, wrote)
	return err == nil && cmp < 0
}

// Field managers of the CatalogLane's status writers: the placement controller owns what it
// decides and counts (the replicas, nodes, vector space and the Placed, Ready and Progressing
// conditions), the endpoints controller the ServiceReady condition (under
// Manager(LaneEndpointsManager, type), a manager per type) and what its EndpointSlices follow
// (under LaneEndpointsSpaceManager). Each applies its own part,
// so neither a stale cache nor the other's write in between costs a conflict or erases the
// other's condition (a merge patch of the conditions replaced the list whole).
const (
	LanePlacementManager = "synapse-lane-placement"
	LaneEndpointsManager = "synapse-lane-endpoints"
	// LaneEndpointsSpaceManager owns endpointsVectorSpaceID and endpointsVectorSpaceGeneration:
	// a name of its own, since LaneEndpointsManager once applied the ServiceReady condition,
	// which an apply of these fields under that name would drop.
	LaneEndpointsSpaceManager = "synapse-lane-endpoints-space"
)

// LanePlacementConditions are the lane condition types the placement controller writes.
var LanePlacementConditions = []string{v1.LaneConditionPlaced, v1.ConditionReady, v1.LaneConditionProgressing}

// ApplyLanePlacementStatus writes what the placement controller reports of the lane: its
// counts, nodes, vector space (and its generation) and observed generation, every one said even when zero (an
// omitted field would stay at the value another manager once wrote, as after an upgrade from
// merge patches), and of its conditions only LanePlacementConditions. It returns the lane's
// resourceVersion after the write.
func ApplyLanePlacementStatus(ctx context.Context, c client.Client, key types.NamespacedName, st v1.CatalogLaneStatus) (string, error) {
	nodes := st.Nodes
	if nodes == nil {
		nodes = []string{}
	}
	lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	fields := map[string]any{
		"observedGeneration": st.ObservedGeneration, "replicas": st.Replicas, "updatedReplicas": st.UpdatedReplicas,
		"vectorSpaceID": st.VectorSpaceID, "vectorSpaceGeneration": st.VectorSpaceGeneration, "readyReplicas": st.ReadyReplicas, "compilingReplicas": st.CompilingReplicas,
		"failedReplicas": st.FailedReplicas, "nodes": nodes, "conditions": only(st.Conditions, LanePlacementConditions),
		"updatedReadyReplicas": st.UpdatedReadyReplicas,
	}
	if st.LastProgressTime != nil {
		// Left out when unset: this manager then no longer owns it, and the API server drops it.
		fields["lastProgressTime"] = st.LastProgressTime
	}
	err := apply(ctx, c, lane, "CatalogLane", LanePlacementManager, fields)
	return lane.ResourceVersion, err
}

// OverlayLanePlacementStatus sets in dst what ApplyLanePlacementStatus writes of src (the same
// fields and condition types), and leaves the rest of dst (the endpoints controller's part) as
// it is.
func OverlayLanePlacementStatus(dst *v1.CatalogLaneStatus, src *v1.CatalogLaneStatus) {
	dst.ObservedGeneration, dst.Replicas, dst.UpdatedReplicas = src.ObservedGeneration, src.Replicas, src.UpdatedReplicas
	dst.UpdatedReadyReplicas, dst.LastProgressTime = src.UpdatedReadyReplicas, src.LastProgressTime.DeepCopy()
	dst.VectorSpaceID, dst.VectorSpaceGeneration = src.VectorSpaceID, src.VectorSpaceGeneration
	dst.ReadyReplicas, dst.CompilingReplicas, dst.FailedReplicas = src.ReadyReplicas, src.CompilingReplicas, src.FailedReplicas
	dst.Nodes = slices.Clone(src.Nodes)
	dst.Conditions = slices.DeleteFunc(dst.Conditions, func(c metav1.Condition) bool { return slices.Contains(LanePlacementConditions, c.Type) })
	dst.Conditions = append(dst.Conditions, only(src.Conditions, LanePlacementConditions)...)
}

// ApplyLaneCondition writes one condition of a lane under manager, leaving every other
// condition and field as it is, and returns the lane's resourceVersion after the write.
func ApplyLaneCondition(ctx context.Context, c client.Client, key types.NamespacedName, manager string, cond metav1.Condition) (string, error) {
	lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	err := apply(ctx, c, lane, "CatalogLane", manager, struct {
		Conditions []metav1.Condition `json:"conditions"`
	}{Conditions: []metav1.Condition{cond}})
	return lane.ResourceVersion, err
}

// ApplyLaneEndpointsSpace writes the vector space, and the lane's vectorSpaceGeneration, the
// lane's EndpointSlices were just written for, under LaneEndpointsSpaceManager: the endpoints
// controller's alone, both said even when zero.
func ApplyLaneEndpointsSpace(ctx context.Context, c client.Client, key types.NamespacedName, space string, generation int64) error {
	return apply(ctx, c, &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}, "CatalogLane", LaneEndpointsSpaceManager,
		map[string]any{"endpointsVectorSpaceID": space, "endpointsVectorSpaceGeneration": generation})
}

// only is the conditions of the given types.
func only(conds []metav1.Condition, types []string) []metav1.Condition {
	return slices.DeleteFunc(slices.Clone(conds), func(c metav1.Condition) bool { return !slices.Contains(types, c.Type) })
}

// apply sends status as an applied configuration of obj's status subresource.
func apply(ctx context.Context, c client.Client, obj client.Object, kind, manager string, status any) error {
	md := map[string]any{"name": obj.GetName()}
	if obj.GetNamespace() != "" {
		md["namespace"] = obj.GetNamespace()
	}
	body, err := json.Marshal(map[string]any{"apiVersion": v1.GroupVersion.String(), "kind": kind, "metadata": md, "status": status})
	if err != nil {
		return fmt.Errorf("encoding the status of %s %s: %w", kind, client.ObjectKeyFromObject(obj), err)
	}
	return c.Status().Patch(ctx, obj, client.RawPatch(types.ApplyPatchType, body), client.FieldOwner(manager), client.ForceOwnership)
}
