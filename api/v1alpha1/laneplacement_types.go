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

// Fields a LanePlacement list can be selected by (its CRD's selectableFields, kubectl get
// laneplacements --field-selector spec.node=mac-a), and the controller's cache indexes by the
// same names: a controller finds a node's placements, or an identity's, without walking them all.
const (
	FieldPlacementNode     = "spec.node"
	FieldPlacementIdentity = "spec.identity"
)

// LabelNode labels every LanePlacement with the name of its node, so an agent watches only the
// placements bound to it.
const LabelNode = "fleet.synapse.dev/node"

// LabelLane labels every LanePlacement with the name of its lane.
const LabelLane = "fleet.synapse.dev/lane"

// FinalizerRetirement keeps a LanePlacement until its node's agent has retired the lane's
// worker: exit confirmed and reservations refunded.
const FinalizerRetirement = "fleet.synapse.dev/retirement"

// LanePlacement condition types and reasons.
const (
	// PlacementConditionArtifactVerified is True when the model artifact passed every check.
	PlacementConditionArtifactVerified = "ArtifactVerified"
	// PlacementConditionWorkerRunning is True when the lane's worker process is connected.
	PlacementConditionWorkerRunning = "WorkerRunning"
	// PlacementConditionSelfChecked is True when the worker's self-check passed.
	PlacementConditionSelfChecked = "SelfChecked"

	// PlacementConditionNodeReady mirrors the node's health onto its placements, as the node
	// lifecycle controller marks a lost node's Pods not ready: False from the moment the node's
	// Lease expires, until the node is back. Only the controller writes it; the lane's
	// endpoints leave such a placement out at once.
	PlacementConditionNodeReady = "NodeReady"
	// PlacementReasonNodeUnknown: the node's Lease expired; nothing it reports is current.
	PlacementReasonNodeUnknown = "NodeUnknown"
	// PlacementReasonNodeReady: the node's Lease is renewed.
	PlacementReasonNodeReady = "NodeReady"

	// PlacementConditionTerminating is True while the node's agent is stopping: the placement
	// still serves what reaches it, and the lane's endpoints list it as terminating (not ready)
	// so no new call is sent there. Only the agent writes it.
	PlacementConditionTerminating = "Terminating"
	// PlacementReasonAgentStopping: the node's agent is shutting down.
	PlacementReasonAgentStopping = "AgentStopping"
	// PlacementReasonAwaitingServingCertificate (Ready False, phase Loading): the lane is loaded
	// and checked, but the node's API serves nothing until its first serving certificate comes
	// from the fleet's signer.
	PlacementReasonAwaitingServingCertificate = "AwaitingServingCertificate"

	// PlacementConditionDrained is True once the lane's endpoints no longer list the placement
	// as ready: its agent may then close its server. Only the endpoints controller writes it,
	// and only on placements that are Terminating.
	PlacementConditionDrained = "Drained"
	// PlacementReasonNotAnEndpoint: the lane's EndpointSlices do not list the placement as ready.
	PlacementReasonNotAnEndpoint = "NotAReadyEndpoint"
)

// PlacementPhase is where a placement is in its life.
// +kubebuilder:validation:Enum=Pending;Loading;Compiling;Ready;Paused;Retiring;Failed
type PlacementPhase string

const (
	// PhasePending: the agent has not yet acted on the placement.
	PhasePending PlacementPhase = "Pending"
	// PhaseLoading: the artifact is being verified and the worker started.
	PhaseLoading PlacementPhase = "Loading"
	// PhaseCompiling: the first shape is being compiled.
	PhaseCompiling PlacementPhase = "Compiling"
	// PhaseReady: the lane serves requests on the node.
	PhaseReady PlacementPhase = "Ready"
	// PhasePaused: the node is paused and the lane unloaded.
	PhasePaused PlacementPhase = "Paused"
	// PhaseRetiring: the worker is draining before its exit is confirmed.
	PhaseRetiring PlacementPhase = "Retiring"
	// PhaseFailed: the lane cannot run on the node; lastFault says why.
	PhaseFailed PlacementPhase = "Failed"
)

// LanePlacementSpec binds one lane to one node. The controller writes it; the lane and node
// never change (a move is a new placement).
// +kubebuilder:validation:XValidation:rule="!has(self.prewarmRungs) || self.prewarmRungs.all(r, r in self.rungs)",message="prewarmRungs must be rungs of the lane's ladder"
type LanePlacementSpec struct {
	// lane is the CatalogLane's name, in the placement's namespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="lane is immutable"
	Lane string `json:"lane"`

	// node is the MacNode's name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable: a move is a new placement"
	Node string `json:"node"`

	// identity is the CertifiedIdentity the node matched when the lane was placed. A lane that
	// moves to another identity gets new placements (a rollout), never this one changed.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="identity is immutable: a new identity is a new placement"
	Identity string `json:"identity"`

	// vectorSpaceID is the identity's vector space, copied when the placement is made: the
	// lane's endpoints list only placements of the space the lane answers in.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="vectorSpaceID is immutable"
	VectorSpaceID string `json:"vectorSpaceID,omitempty"`

	// task is copied from the lane.
	// +required
	Task Task `json:"task"`

	// device is copied from the lane.
	// +required
	Device Device `json:"device"`

	// rungs is the lane's ladder.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.isSorted()",message="rungs must be in ascending order"
	Rungs []Rung `json:"rungs"`

	// ceiling is the longest sequence the lane accepts.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8192
	Ceiling int32 `json:"ceiling"`

	// maxResidentShapes is how many rungs may be resident at once.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=8
	MaxResidentShapes int32 `json:"maxResidentShapes"`

	// admissionBoundSeconds bounds a request's wait for admission.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	AdmissionBoundSeconds int32 `json:"admissionBoundSeconds"`

	// requestDeadlineSeconds is a request's default absolute deadline.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=600
	RequestDeadlineSeconds int32 `json:"requestDeadlineSeconds"`

	// prewarmRungs are loaded in the background once the lane is ready, resolved from the
	// lane's PrewarmPolicy.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	PrewarmRungs []Rung `json:"prewarmRungs,omitempty"`

	// maxBatchTokens bounds the tokens of one call (the lane's, defaulted); 0: the agent's default.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1048576
	MaxBatchTokens int32 `json:"maxBatchTokens,omitempty"`

	// maxConcurrentRequests bounds the calls running at once (the lane's, defaulted); 0: the
	// agent's default.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1024
	MaxConcurrentRequests int32 `json:"maxConcurrentRequests,omitempty"`

	// maxQueuedRequests bounds the calls waiting to run (the lane's, defaulted); past it a call
	// is answered 429 overloaded.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4096
	MaxQueuedRequests *int32 `json:"maxQueuedRequests,omitempty"`
}

// CompileProgress reports a running shape compile, which can take minutes when cold.
type CompileProgress struct {
	// rung being compiled.
	// +required
	Rung Rung `json:"rung"`

	// layersDone is how many layers are compiled or loaded.
	// +required
	// +kubebuilder:validation:Minimum=0
	LayersDone int32 `json:"layersDone"`

	// layersTotal is the model's number of layers.
	// +required
	// +kubebuilder:validation:Minimum=1
	LayersTotal int32 `json:"layersTotal"`

	// predictedReadyTime is when the shape is predicted to be resident.
	// +optional
	PredictedReadyTime *metav1.Time `json:"predictedReadyTime,omitempty"`
}

// PrewarmSummary reports the background load of the lane's prewarm rungs.
type PrewarmSummary struct {
	// state of the prewarm.
	// +required
	// +kubebuilder:validation:Enum=Waiting;Running;Finished;Cancelled
	State string `json:"state"`

	// loaded are the rungs prewarm admitted.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	Loaded []Rung `json:"loaded,omitempty"`

	// loadedFromCache counts the loaded rungs aned already held.
	// +optional
	LoadedFromCache int32 `json:"loadedFromCache,omitempty"`

	// compiled counts the loaded rungs that had to be compiled.
	// +optional
	Compiled int32 `json:"compiled,omitempty"`

	// alreadyResident counts rungs that were resident when prewarm reached them.
	// +optional
	AlreadyResident int32 `json:"alreadyResident,omitempty"`

	// skippedForBudget counts rungs that did not fit free budget; the first one ends prewarm.
	// +optional
	SkippedForBudget int32 `json:"skippedForBudget,omitempty"`

	// failed counts rungs the worker refused.
	// +optional
	Failed int32 `json:"failed,omitempty"`

	// totalMilliseconds is the prewarm's duration.
	// +optional
	TotalMilliseconds int64 `json:"totalMilliseconds,omitempty"`
}

// ProbeMeasurement is the runtime placement probe of one resident rung: the fastest of 5
// evaluations on the device and on a CPU-only reference of the same artifact, back to back.
// A ratio above 0.8 means the model is not running on the Neural Engine: the lane fails with
// ComputeUnitMismatchError. On the sim backend nothing is measured: the ratio is the one the
// stand-in was configured with, the probe says simulated, and no time is reported.
// +kubebuilder:validation:XValidation:rule="!has(self.simulated) || !self.simulated || (!has(self.deviceMicroseconds) && !has(self.cpuMicroseconds))",message="a simulated probe reports no measured times"
type ProbeMeasurement struct {
	// rung is the probed shape.
	// +required
	Rung Rung `json:"rung"`

	// simulated is true when the sim backend modelled the probe; its ratio is configured, not
	// measured.
	// +optional
	Simulated bool `json:"simulated,omitempty"`

	// deviceMicroseconds is the fastest evaluation on the device (measured probes only).
	// +optional
	// +kubebuilder:validation:Minimum=0
	DeviceMicroseconds int64 `json:"deviceMicroseconds,omitempty"`

	// cpuMicroseconds is the fastest evaluation of the CPU-only reference (measured probes
	// only).
	// +optional
	// +kubebuilder:validation:Minimum=0
	CPUMicroseconds int64 `json:"cpuMicroseconds,omitempty"`

	// ratio is device over CPU time, with two decimals.
	// +required
	// +kubebuilder:validation:MaxLength=16
	Ratio string `json:"ratio"`

	// workerGeneration is the worker generation it was measured on.
	// +optional
	WorkerGeneration int64 `json:"workerGeneration,omitempty"`
}

// WorkerWarnings are the warning lines a placement's workers wrote.
type WorkerWarnings struct {
	// count is how many warning lines the lane's workers wrote since the agent loaded it.
	// +required
	// +kubebuilder:validation:Minimum=0
	Count int64 `json:"count"`

	// recent are the latest lines, oldest first; a line over 512 bytes is shortened here (the
	// agent's log holds it whole).
	// +optional
	// +kubebuilder:validation:MaxItems=5
	// +kubebuilder:validation:items:MaxLength=512
	Recent []string `json:"recent,omitempty"`

	// lastTime is when the latest line was read.
	// +optional
	LastTime *metav1.Time `json:"lastTime,omitempty"`
}

// Fault is the last failure the agent observed for a placement.
type Fault struct {
	// code is the machine-readable refusal or fault code, for example engine_crashed.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	Code string `json:"code"`

	// message says what happened and what to do.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// time the fault was observed.
	// +required
	Time metav1.Time `json:"time"`
}

// LanePlacementStatus is written by the node's agent.
type LanePlacementStatus struct {
	// observedGeneration is the generation the agent last acted on.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// phase summarises the placement.
	// +optional
	Phase PlacementPhase `json:"phase,omitempty"`

	// workerGeneration counts the lane's worker processes on the node; it grows by one per
	// restart.
	// +optional
	WorkerGeneration int64 `json:"workerGeneration,omitempty"`

	// residentShapes are the rungs loaded on the Neural Engine.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	ResidentShapes []Rung `json:"residentShapes,omitempty"`

	// cachedShapes are the rungs aned holds compiled.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	CachedShapes []Rung `json:"cachedShapes,omitempty"`

	// compile reports the running shape compile, if any.
	// +optional
	Compile *CompileProgress `json:"compile,omitempty"`

	// prewarm reports the background load.
	// +optional
	Prewarm *PrewarmSummary `json:"prewarm,omitempty"`

	// lastFault is the last failure observed.
	// +optional
	LastFault *Fault `json:"lastFault,omitempty"`

	// probes are the runtime placement probes of the resident rungs.
	// +optional
	// +listType=map
	// +listMapKey=rung
	// +kubebuilder:validation:MaxItems=8
	Probes []ProbeMeasurement `json:"probes,omitempty"`

	// backend is the worker backend that computes this placement's answers: ane or sim.
	// +optional
	Backend WorkerBackend `json:"backend,omitempty"`

	// workerWarnings counts the warning lines the lane's workers wrote on this node (every
	// stderr line other than a worker's own progress lines: the framework's, the runtime's, an
	// injected fault's) and keeps the latest.
	// +optional
	WorkerWarnings *WorkerWarnings `json:"workerWarnings,omitempty"`

	// conditions: ArtifactVerified, WorkerRunning, SelfChecked, Terminating and Ready (the
	// agent's), NodeReady (the node lifecycle controller's), Drained (the endpoints
	// controller's).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// LanePlacement is one lane bound to one Mac node, as a Pod is bound to a node.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=lp,categories=synapse
// +kubebuilder:selectablefield:JSONPath=`.spec.node`
// +kubebuilder:selectablefield:JSONPath=`.spec.identity`
// +kubebuilder:printcolumn:name="Lane",type=string,JSONPath=`.spec.lane`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.status.backend`
// +kubebuilder:printcolumn:name="Gen",type=integer,JSONPath=`.status.workerGeneration`
// +kubebuilder:printcolumn:name="Resident",type=string,JSONPath=`.status.residentShapes`
// +kubebuilder:printcolumn:name="Compiling",type=integer,JSONPath=`.status.compile.rung`
// +kubebuilder:printcolumn:name="Layers",type=integer,JSONPath=`.status.compile.layersDone`
// +kubebuilder:printcolumn:name="Of",type=integer,JSONPath=`.status.compile.layersTotal`
// +kubebuilder:printcolumn:name="ETA",type=date,JSONPath=`.status.compile.predictedReadyTime`,priority=1
// +kubebuilder:printcolumn:name="Fault",type=string,JSONPath=`.status.lastFault.code`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LanePlacement struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is written by the controller.
	// +required
	Spec LanePlacementSpec `json:"spec"`

	// status is written by the node's agent.
	// +optional
	Status LanePlacementStatus `json:"status,omitempty"`
}

// LanePlacementList is a list of LanePlacement.
// +kubebuilder:object:root=true
type LanePlacementList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LanePlacement `json:"items"`
}

func init() {
	SchemeBuilder.Register(&LanePlacement{}, &LanePlacementList{})
}
