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

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MacNode condition types and reasons. Each type has one writer, which writes it alone by
// server-side apply under its own field manager (internal/statusapply): Ready, EvictionHeld
// (the node lifecycle controller), AddressAllowed (the endpoints controller); AgentReady,
// ANEAvailable, TempSpaceLow, Paused (the node's agent).
const (
	// NodeConditionAgentReady is True while the node's agent runs and reconciles its
	// placements; its message counts the lanes loaded. It is the agent's own report: the
	// Lease, not this, decides Ready.
	NodeConditionAgentReady = "AgentReady"
	// NodeConditionANEAvailable is True when the agent's worker backend can reach the Neural
	// Engine (or its simulated stand-in).
	NodeConditionANEAvailable = "ANEAvailable"
	// NodeConditionTempSpaceLow is True when the per-user temporary folder the compiler writes
	// to is nearly full; cached loads still work, compiles are refused.
	NodeConditionTempSpaceLow = "TempSpaceLow"
	// NodeConditionPaused is True when spec.paused has unloaded every lane of the node.
	NodeConditionPaused = "Paused"
	// NodeConditionAddressAllowed is True when the address the agent reports may be published
	// in the lanes' EndpointSlices: inside the CIDRs the operator allows and outside the
	// cluster's own pod, service and node ranges. False says why the node is left out.
	NodeConditionAddressAllowed = "AddressAllowed"
	// NodeConditionEvictionHeld is True while the controller holds this lost node's eviction
	// because most of the fleet is unreachable at once (a partition, not Macs dying).
	NodeConditionEvictionHeld = "EvictionHeld"

	// NodeReasonAgentRunning: the agent runs and reconciles its placements (AgentReady).
	NodeReasonAgentRunning = "AgentRunning"
	// NodeReasonLeaseRenewed: the node lifecycle controller has seen the agent's Lease renewed
	// within the grace period (Ready True).
	NodeReasonLeaseRenewed = "LeaseRenewed"
	// NodeReasonLeaseExpired: the agent has not renewed its Lease within the grace period.
	NodeReasonLeaseExpired = "LeaseExpired"
	// NodeReasonAddressAllowed: the address is inside an allowed CIDR.
	NodeReasonAddressAllowed = "AddressAllowed"
	// NodeReasonAddressNotAllowed: the address is outside every CIDR the operator allows (or
	// none is configured).
	NodeReasonAddressNotAllowed = "AddressNotAllowed"
	// NodeReasonAddressInClusterRange: the address is inside the cluster's own pod, service or
	// node addresses, or a range the operator denies.
	NodeReasonAddressInClusterRange = "AddressInClusterRange"
	// NodeReasonAddressUnusable: no address, or one no EndpointSlice can hold (loopback,
	// link-local, unspecified, multicast, not IPv4).
	NodeReasonAddressUnusable = "AddressUnusable"
	// NodeReasonFleetPartitioned: too much of the fleet is unreachable at once for evictions.
	NodeReasonFleetPartitioned = "FleetPartitioned"
	// NodeReasonEvictionResumed: the fleet is reachable again; the hold is lifted.
	NodeReasonEvictionResumed = "EvictionResumed"
)

// WorkerBackend is how a node's workers reach a Neural Engine.
// +kubebuilder:validation:Enum=ane;sim
type WorkerBackend string

const (
	// BackendANE drives the real Neural Engine (darwin/arm64).
	BackendANE WorkerBackend = "ane"
	// BackendSim is the faithful stand-in used for tests and development; it is reported, never
	// hidden, so nothing mistakes a simulated node for a real one.
	BackendSim WorkerBackend = "sim"
)

// MacNodeSpec is what administrators set on a node.
type MacNodeSpec struct {
	// unschedulable cordons the node: existing placements stay, no new ones are made.
	// +optional
	Unschedulable bool `json:"unschedulable,omitempty"`

	// paused makes the agent unload every lane; placements stay, in phase Paused.
	// +optional
	Paused bool `json:"paused,omitempty"`
}

// Platform describes the Mac.
type Platform struct {
	// chip is the Apple silicon family, for example M4.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Chip string `json:"chip,omitempty"`

	// hardwareModel is the Mac's model identifier, for example Mac16,10.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	HardwareModel string `json:"hardwareModel,omitempty"`

	// neuralEngineCores is the number of Neural Engine cores; 0 means none was found.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=256
	NeuralEngineCores int32 `json:"neuralEngineCores,omitempty"`

	// macOSBuild is the running macOS build.
	// +optional
	MacOSBuild MacOSBuild `json:"macOSBuild,omitempty"`
}

// NodeWorker is the worker binary the node's agent starts.
type NodeWorker struct {
	// signingIdentifier is the worker's code-signing identifier.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	SigningIdentifier string `json:"signingIdentifier,omitempty"`

	// binaryDigest is the SHA-256 of the worker executable.
	// +optional
	BinaryDigest Sha256Digest `json:"binaryDigest,omitempty"`

	// protocolVersion is the protocol the worker speaks.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=16
	ProtocolVersion int32 `json:"protocolVersion,omitempty"`

	// backend is ane or sim.
	// +optional
	Backend WorkerBackend `json:"backend,omitempty"`
}

// ExecutableBudget counts Neural Engine programs.
type ExecutableBudget struct {
	// layerExecutables is the number of per-layer programs (at most 100 per machine).
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	LayerExecutables int32 `json:"layerExecutables,omitempty"`

	// shapeSlots is the number of resident (model, rung) shapes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	ShapeSlots int32 `json:"shapeSlots,omitempty"`
}

// NodeAddressType is the kind of a node address.
// +kubebuilder:validation:Enum=InternalIP;ExternalIP;Hostname
type NodeAddressType string

// NodeAddress is one way to reach the node's serving port.
type NodeAddress struct {
	// type of the address.
	// +required
	Type NodeAddressType `json:"type"`

	// address, an IP or a host name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Address string `json:"address"`
}

// CachedRungs are the rungs of one identity aned holds compiled on the node, so loading them
// costs milliseconds instead of minutes.
type CachedRungs struct {
	// identity names the CertifiedIdentity.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Identity string `json:"identity"`

	// rungs that aned holds compiled.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	Rungs []Rung `json:"rungs,omitempty"`
}

// CompileQueueSummary is the state of the node's machine-wide compile queue.
type CompileQueueSummary struct {
	// length is the number of shape compiles queued, the running one included.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Length int32 `json:"length,omitempty"`

	// running names the compiling shape as lane/rung, empty when none is.
	// +optional
	// +kubebuilder:validation:MaxLength=300
	Running string `json:"running,omitempty"`

	// predictedDrainSeconds is when the queue is predicted to be empty, from now.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PredictedDrainSeconds int32 `json:"predictedDrainSeconds,omitempty"`
}

// MacNodeStatus is written by the node's agent.
type MacNodeStatus struct {
	// observedGeneration is the generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// platform describes the Mac.
	// +optional
	Platform Platform `json:"platform,omitzero"`

	// worker is the worker binary the agent starts.
	// +optional
	Worker NodeWorker `json:"worker,omitzero"`

	// capacity is the node's Neural Engine budget.
	// +optional
	Capacity ExecutableBudget `json:"capacity,omitzero"`

	// allocated is the part of capacity charged to resident and pending shapes.
	// +optional
	Allocated ExecutableBudget `json:"allocated,omitzero"`

	// addresses reach the agent's serving port.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Addresses []NodeAddress `json:"addresses,omitempty"`

	// servingPort is the agent's HTTP port.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	ServingPort int32 `json:"servingPort,omitempty"`

	// cachedRungs lists, per identity, the rungs aned holds compiled.
	// +optional
	// +listType=map
	// +listMapKey=identity
	// +kubebuilder:validation:MaxItems=256
	CachedRungs []CachedRungs `json:"cachedRungs,omitempty"`

	// compileQueue summarises the node's compile queue.
	// +optional
	CompileQueue CompileQueueSummary `json:"compileQueue,omitzero"`

	// lanes is the number of placements bound to the node.
	// +optional
	Lanes int32 `json:"lanes,omitempty"`

	// conditions: Ready (from the node's Lease, written by the controller), AgentReady,
	// ANEAvailable, TempSpaceLow, Paused (the agent's), AddressAllowed, EvictionHeld (the
	// controller's). A list keyed by type, so that each writer applies its own types and
	// none replaces another's.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MacNode is one Mac of the fleet, registered by its node agent.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=mac,categories=synapse
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Agent",type=string,JSONPath=`.status.conditions[?(@.type=="AgentReady")].status`,priority=1
// +kubebuilder:printcolumn:name="Chip",type=string,JSONPath=`.status.platform.chip`
// +kubebuilder:printcolumn:name="macOS",type=string,JSONPath=`.status.platform.macOSBuild`
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.status.worker.backend`
// +kubebuilder:printcolumn:name="Executables",type=integer,JSONPath=`.status.allocated.layerExecutables`
// +kubebuilder:printcolumn:name="Lanes",type=integer,JSONPath=`.status.lanes`
// +kubebuilder:printcolumn:name="Cordoned",type=boolean,JSONPath=`.spec.unschedulable`,priority=1
// +kubebuilder:printcolumn:name="Paused",type=boolean,JSONPath=`.spec.paused`,priority=1
// +kubebuilder:printcolumn:name="Worker",type=string,JSONPath=`.status.worker.signingIdentifier`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MacNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is set by administrators.
	// +optional
	Spec MacNodeSpec `json:"spec,omitempty"`

	// status is written by the node's agent and, for Ready on lease expiry, the controller.
	// +optional
	Status MacNodeStatus `json:"status,omitempty"`
}

// MacNodeList is a list of MacNode.
// +kubebuilder:object:root=true
type MacNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MacNode `json:"items"`
}

func init() {
	SchemeBuilder.Register(&MacNode{}, &MacNodeList{})
}
