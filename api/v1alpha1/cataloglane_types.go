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

// FieldLaneIdentity is the field a CatalogLane list can be selected by (its CRD's
// selectableFields), and the controller's cache indexes by: the lanes of one identity.
const FieldLaneIdentity = "spec.identityRef.name"

// CatalogLane condition types and reasons.
const (
	// LaneConditionPlaced is True when every replica has a LanePlacement on a matching node.
	LaneConditionPlaced = "Placed"

	// LaneReasonPlaced: every replica is placed.
	LaneReasonPlaced = "Placed"
	// LaneReasonIdentityNotFound: the referenced CertifiedIdentity does not exist.
	LaneReasonIdentityNotFound = "IdentityNotFound"
	// LaneReasonNoMatchingNode: no node runs the identity's worker binary on its macOS build.
	LaneReasonNoMatchingNode = "NoMatchingNode"
	// LaneReasonSelectorMatchesNothing: no node matches the lane's nodeSelector.
	LaneReasonSelectorMatchesNothing = "SelectorMatchesNothing"
	// LaneReasonBudgetFull: matching nodes lack free layer executables for the lane.
	LaneReasonBudgetFull = "BudgetFull"
	// LaneReasonNotEnoughNodes: fewer usable nodes match than the lane has replicas (the
	// rest are not ready, cordoned or paused, or there are too few).
	LaneReasonNotEnoughNodes = "NotEnoughNodes"

	// LaneConditionServiceReady is True when the lane's Service (named after the lane) is the
	// one the controller created for it and its EndpointSlices are written; False when that
	// name is taken, or the Service is missing or cannot be created. A new lane has none until
	// its Service is there (the API server gives out ClusterIPs one at a time).
	LaneConditionServiceReady = "ServiceReady"
	// LaneReasonServiceReady: the lane's Service and EndpointSlices are the controller's.
	LaneReasonServiceReady = "ServiceReady"
	// LaneReasonServiceNameTaken: a Service (or EndpointSlice) of the lane's name exists that the
	// controller did not create; it is never taken over, and the lane gets no endpoints.
	LaneReasonServiceNameTaken = "ServiceNameTaken"
	// LaneReasonServiceMissing: the lane's Service is gone; the controller creates it again,
	// and the lane has no endpoints meanwhile.
	LaneReasonServiceMissing = "ServiceMissing"
	// LaneReasonServiceFailed: the API server refused to create the lane's Service (the
	// message says why: a quota, an admission webhook, a full service range); it is tried again.
	LaneReasonServiceFailed = "ServiceFailed"

	// LaneConditionProgressing is True while the lane's placements are being brought to its
	// latest spec (a rollout, or edits the agents still have to pick up) and False once they
	// all reflect it, or when the rollout cannot go on (the reason says why; the placements of
	// the spec before keep serving meanwhile).
	LaneConditionProgressing = "Progressing"

	// LaneReasonRolloutComplete: every placement reflects the lane's latest spec.
	LaneReasonRolloutComplete = "RolloutComplete"
	// LaneReasonApplyingEdits: placements were updated in place (deadlines, bounds, prewarm)
	// and their agents have not all reported the new generation yet.
	LaneReasonApplyingEdits = "ApplyingEdits"
	// LaneReasonRollingUpdate: the lane moves to a new identity, task or ladder within one
	// vector space, a node at a time within maxUnavailable.
	LaneReasonRollingUpdate = "RollingUpdate"
	// LaneReasonBlueGreen: the lane moves to an identity of another vector space: placements of
	// the new space come up beside the old, and the lane's endpoints switch in one update once
	// enough of them are Ready.
	LaneReasonBlueGreen = "BlueGreen"
	// LaneReasonNewPlacementsFailed: placements of the new spec failed; the old keep serving.
	LaneReasonNewPlacementsFailed = "NewPlacementsFailed"
	// LaneReasonNewPlacementsUnplaceable: no node can take a placement of the new spec beside
	// the old within maxSurge; the old keep serving.
	LaneReasonNewPlacementsUnplaceable = "NewPlacementsUnplaceable"
	// LaneReasonBoundsTooTight: the rollout cannot go on within maxSurge and maxUnavailable (a
	// switch of vector space needs replicas-maxUnavailable new placements serving beside as
	// many old ones); the message says what to set, and the old keep serving.
	LaneReasonBoundsTooTight = "BoundsTooTight"
	// LaneReasonProgressDeadlineExceeded: the rollout has not moved (no placement of the new
	// spec made or Ready, no old one retired, no switch) for progressDeadlineSeconds, as a
	// Deployment's; it goes on, and Progressing turns True again when it moves.
	LaneReasonProgressDeadlineExceeded = "ProgressDeadlineExceeded"
)

// The defaults of a lane's request limits, which its placements carry resolved.
const (
	DefaultMaxBatchTokens        = 65536
	DefaultMaxConcurrentRequests = 64
	DefaultMaxQueuedRequests     = 256
	// DefaultProgressDeadlineSeconds is rollout.progressDeadlineSeconds's default (as a
	// Deployment's), which the API server fills in; the controller reads it for a lane built
	// without it (a test's, a fake client's).
	DefaultProgressDeadlineSeconds = 600
	// MaxStatusNodes is how many nodes a lane's status.nodes holds: the largest replicas and
	// maxSurge together, old placements and new during a rollout.
	MaxStatusNodes = 512
)

// RolloutStrategy bounds how a lane moves its placements to a new spec.
// +kubebuilder:validation:XValidation:rule="!has(self.maxSurge) || self.maxSurge > 0 || self.maxUnavailable > 0",message="maxSurge and maxUnavailable must not both be 0: a rollout could neither bring a new placement up beside the old nor take an old one down; set maxSurge to 1 (a spare node) or maxUnavailable to 1 (a node at a time, no spare node)"
type RolloutStrategy struct {
	// maxSurge is how many placements of the new spec may exist beyond spec.replicas while
	// the old still serve. Unset, it is spec.replicas: a whole new set comes up beside the
	// old (blue/green), which a move to another vector space needs to switch without a gap.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=256
	MaxSurge *int32 `json:"maxSurge,omitempty"`

	// maxUnavailable is how many of spec.replicas may be out of service during a rollout: a
	// lane without spare nodes needs at least 1 to move at all, a node at a time.
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=256
	MaxUnavailable int32 `json:"maxUnavailable,omitempty"`

	// progressDeadlineSeconds is how long a rollout may go without moving (a placement of the
	// new spec made or Ready, an old one retired, the switch of vector space) before the lane's
	// Progressing condition turns False with reason ProgressDeadlineExceeded, as a
	// Deployment's. The rollout goes on meanwhile.
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	ProgressDeadlineSeconds int32 `json:"progressDeadlineSeconds,omitempty"`
}

// CatalogLaneSpec is a model served on an explicit device across a number of Mac nodes.
// +kubebuilder:validation:XValidation:rule="!has(self.ceiling) || self.ceiling <= self.rungs[self.rungs.size() - 1]",message="ceiling must not exceed the largest rung: add a larger rung or lower the ceiling"
// +kubebuilder:validation:XValidation:rule="!has(self.maxResidentShapes) || self.maxResidentShapes <= self.rungs.size()",message="maxResidentShapes must not exceed the number of rungs"
// +kubebuilder:validation:XValidation:rule="!has(self.maxBatchTokens) || self.maxBatchTokens >= (has(self.ceiling) ? self.ceiling : self.rungs[self.rungs.size() - 1])",message="maxBatchTokens must be at least the ceiling (or the largest rung), or no single input could be served"
type CatalogLaneSpec struct {
	// model is the model's name; it must equal the referenced identity's spec.model.name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`
	Model string `json:"model"`

	// task is what the lane serves: embed (POST /v1/embeddings) or rerank (POST /v1/rerank).
	// +required
	Task Task `json:"task"`

	// device is where requests run. It must be given: a lane never picks a device for itself
	// and never moves to another one.
	// +required
	Device Device `json:"device"`

	// identityRef names the CertifiedIdentity the lane runs under. Only nodes that match it
	// exactly (worker binary, signing identifier, protocol, macOS build) serve the lane.
	// +required
	IdentityRef LocalObjectReference `json:"identityRef"`

	// rungs is the shape ladder: the sequence lengths, ascending, that the worker compiles.
	// A request uses the smallest rung that fits it.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.isSorted()",message="rungs must be in ascending order, for example [128, 256, 512]"
	Rungs []Rung `json:"rungs"`

	// ceiling is the longest sequence, in tokens, the lane accepts; longer ones are refused
	// with unsupported_shape, never truncated. Defaults to the largest rung.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8192
	Ceiling *int32 `json:"ceiling,omitempty"`

	// maxResidentShapes is how many rungs may be resident on a node at once; at that limit
	// the lane evicts one of its own shapes. Defaults to every rung.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	MaxResidentShapes *int32 `json:"maxResidentShapes,omitempty"`

	// replicas is how many Mac nodes serve the lane.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=256
	Replicas int32 `json:"replicas"`

	// nodeSelector restricts the lane to MacNodes with these labels.
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// admissionBoundSeconds bounds how long a request may wait for its shape to be admitted;
	// a shape predicted ready later is answered shape_compiling with a retry time.
	// +optional
	// +kubebuilder:default=600
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	AdmissionBoundSeconds int32 `json:"admissionBoundSeconds"`

	// requestDeadlineSeconds is the default absolute deadline of a request, covering admission
	// and every exchange; no later bucket starts after it.
	// +optional
	// +kubebuilder:default=30
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	RequestDeadlineSeconds int32 `json:"requestDeadlineSeconds"`

	// prewarmPolicyRef names the PrewarmPolicy that chooses which rungs load in the background.
	// Without one, policies whose laneSelector matches the lane apply.
	// +optional
	PrewarmPolicyRef *LocalObjectReference `json:"prewarmPolicyRef,omitempty"`

	// maxBatchTokens bounds the tokens of one call, every input's together (for rerank, every
	// query and document pair's), as TEI's max_batch_tokens does; a call over it is refused with
	// batch_too_large (413) while its inputs are read, before anything runs. Defaults to 65536;
	// at least the ceiling.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1048576
	MaxBatchTokens *int32 `json:"maxBatchTokens,omitempty"`

	// maxConcurrentRequests bounds the lane's calls running at once on each node. Defaults to 64.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	MaxConcurrentRequests *int32 `json:"maxConcurrentRequests,omitempty"`

	// maxQueuedRequests bounds the lane's calls waiting on each node for one of the running
	// ones to finish; a call past it is answered at once with 429 overloaded and Retry-After.
	// Defaults to 256.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4096
	MaxQueuedRequests *int32 `json:"maxQueuedRequests,omitempty"`

	// rollout bounds how placements move to a new identity, task or ladder.
	// +optional
	Rollout RolloutStrategy `json:"rollout,omitempty"`
}

// CatalogLaneStatus aggregates the lane's placements.
type CatalogLaneStatus struct {
	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// replicas is the number of LanePlacements that exist for the lane.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// updatedReplicas is the number of placements of the lane's latest identity, task and
	// ladder.
	// +optional
	UpdatedReplicas int32 `json:"updatedReplicas,omitempty"`

	// updatedReadyReplicas is the number of placements of the latest spec that serve (Ready on
	// a Ready node).
	// +optional
	UpdatedReadyReplicas int32 `json:"updatedReadyReplicas,omitempty"`

	// lastProgressTime is when the lane's rollout last moved; unset when no rollout is under way.
	// +optional
	LastProgressTime *metav1.Time `json:"lastProgressTime,omitempty"`

	// vectorSpaceID is the vector space the lane answers in: only placements of this space are
	// the lane's endpoints. A rollout to another space switches it once, when enough placements
	// of the new space are Ready.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	VectorSpaceID string `json:"vectorSpaceID,omitempty"`

	// vectorSpaceGeneration counts the lane's switches from one vector space to another: a
	// blue/green rollout's switch, or its rollback, each adds one.
	// +optional
	// +kubebuilder:validation:Minimum=0
	VectorSpaceGeneration int64 `json:"vectorSpaceGeneration,omitempty"`

	// endpointsVectorSpaceID and endpointsVectorSpaceGeneration are the vector space, and the
	// vectorSpaceGeneration, the lane's EndpointSlices were last written for by the endpoints
	// controller: they list no placement of another space. A blue/green rollout's old
	// placements keep answering until endpointsVectorSpaceGeneration reaches
	// vectorSpaceGeneration, then drain for a few seconds (clients act on the slices they last
	// saw) before they retire.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	EndpointsVectorSpaceID string `json:"endpointsVectorSpaceID,omitempty"`
	// +optional
	// +kubebuilder:validation:Minimum=0
	EndpointsVectorSpaceGeneration int64 `json:"endpointsVectorSpaceGeneration,omitempty"`

	// readyReplicas is the number of placements that serve requests: Ready, of the vector space
	// the lane answers in, on a node that is Ready (a Mac whose Lease lapsed is out of the
	// lane's endpoints at once, whatever its placement last said).
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// compilingReplicas is the number of placements compiling their first shapes.
	// +optional
	CompilingReplicas int32 `json:"compilingReplicas,omitempty"`

	// failedReplicas is the number of placements whose node reported a fault.
	// +optional
	FailedReplicas int32 `json:"failedReplicas,omitempty"`

	// nodes lists the MacNodes the lane is placed on, the old spec's and the new's during a
	// rollout: at most replicas + maxSurge (512 at their largest); should a lane edited in the
	// middle of a rollout hold more for a moment, the first 512 by name (replicas counts them
	// all). Atomic: the placement
	// controller alone writes it, whole, so an apply replaces it even where an older writer (a
	// merge patch before the controllers applied their parts) still owns some of its entries.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=512
	// +kubebuilder:validation:items:MaxLength=253
	Nodes []string `json:"nodes,omitempty"`

	// endpoint is the in-cluster URL of the lane's Service.
	// +optional
	// +kubebuilder:validation:MaxLength=512
	Endpoint string `json:"endpoint,omitempty"`

	// conditions: Placed, Progressing, ServiceReady, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CatalogLane serves one model for one task on the Neural Engine of a set of Mac nodes.
// Its name becomes a Service name and a label value, so it must be a DNS-1035 label.
// +kubebuilder:validation:XValidation:rule="self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",message="metadata.name must be a DNS-1035 label (at most 63 characters: lowercase letters, digits and '-', starting with a letter and ending with a letter or digit), because it names the lane's Service"
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lane,categories=synapse
// +kubebuilder:selectablefield:JSONPath=`.spec.identityRef.name`
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model`
// +kubebuilder:printcolumn:name="Task",type=string,JSONPath=`.spec.task`
// +kubebuilder:printcolumn:name="Device",type=string,JSONPath=`.spec.device`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Up-to-date",type=integer,JSONPath=`.status.updatedReplicas`
// +kubebuilder:printcolumn:name="Compiling",type=integer,JSONPath=`.status.compilingReplicas`
// +kubebuilder:printcolumn:name="Status",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Rollout",type=string,JSONPath=`.status.conditions[?(@.type=="Progressing")].reason`
// +kubebuilder:printcolumn:name="Space",type=string,JSONPath=`.status.vectorSpaceID`,priority=1
// +kubebuilder:printcolumn:name="Identity",type=string,JSONPath=`.spec.identityRef.name`,priority=1
// +kubebuilder:printcolumn:name="Rungs",type=string,JSONPath=`.spec.rungs`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CatalogLane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired lane.
	// +required
	Spec CatalogLaneSpec `json:"spec"`

	// status is written by the controller.
	// +optional
	Status CatalogLaneStatus `json:"status,omitempty"`
}

// CatalogLaneList is a list of CatalogLane.
// +kubebuilder:object:root=true
type CatalogLaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CatalogLane `json:"items"`
}

func init() {
	SchemeBuilder.Register(&CatalogLane{}, &CatalogLaneList{})
}
