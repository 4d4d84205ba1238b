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

// CertifiedIdentity condition types and reasons.
const (
	// IdentityConditionMatched is True when at least one MacNode runs this identity's worker
	// binary, on its backend, on this identity's macOS build.
	IdentityConditionMatched = "Matched"

	// IdentityReasonNodesMatch: one or more nodes match.
	IdentityReasonNodesMatch = "NodesMatch"
	// IdentityReasonNoMatchingNode: no node runs this worker binary, on this backend, on this
	// macOS build.
	IdentityReasonNoMatchingNode = "NoMatchingNode"
)

// WorkerIdentity is the worker binary an identity approves. aned keys its compile cache by
// code-signing identifier, so the identifier must stay stable across deploys; the digest pins
// the exact binary.
type WorkerIdentity struct {
	// signingIdentifier is the worker's code-signing identifier, for example synapse-ane-worker.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9._-]*$`
	SigningIdentifier string `json:"signingIdentifier"`

	// binaryDigest is the SHA-256 of the worker executable.
	// +required
	BinaryDigest Sha256Digest `json:"binaryDigest"`

	// protocolVersion is the agent-worker protocol the binary speaks. Only version 3 exists.
	// +required
	// +kubebuilder:validation:Minimum=3
	// +kubebuilder:validation:Maximum=3
	ProtocolVersion int32 `json:"protocolVersion"`

	// backend is the worker backend the approval holds for: ane (the Neural Engine) or sim (the
	// stand-in). It is part of the identity: a sim approval never matches a node whose workers
	// run ane and the reverse, so the stand-in's answers never pass for the Neural Engine's.
	// +required
	Backend WorkerBackend `json:"backend"`
}

// ModelIdentity is the model checkpoint an identity approves.
type ModelIdentity struct {
	// name of the model, for example gte-modernbert-base.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`
	Name string `json:"name"`

	// revision of the checkpoint, as its publisher names it (a tag or commit).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Revision string `json:"revision"`

	// checkpointDigest is the SHA-256 of the checkpoint's weights.
	// +required
	CheckpointDigest Sha256Digest `json:"checkpointDigest"`

	// layers is the number of transformer layers; each is one Neural Engine executable per rung.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	Layers int32 `json:"layers"`

	// hiddenSize is the model's width, which sets the per-layer compile cost.
	// +required
	// +kubebuilder:validation:Minimum=64
	// +kubebuilder:validation:Maximum=16384
	// +kubebuilder:validation:MultipleOf=64
	HiddenSize int32 `json:"hiddenSize"`

	// embeddingDimensions is the length of the vectors the model returns.
	// +required
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=16384
	EmbeddingDimensions int32 `json:"embeddingDimensions"`
}

// ConversionPolicy is the named, versioned recipe that turned the checkpoint into Neural
// Engine programs.
type ConversionPolicy struct {
	// name of the policy, including its version, for example ane-fp16-v1.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	Name string `json:"name"`

	// digest of the policy's definition.
	// +required
	Digest Sha256Digest `json:"digest"`
}

// CertifiedIdentitySpec is one approved combination. It is immutable: an approval never
// carries over to another binary, model, conversion policy or macOS build.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable: create a new CertifiedIdentity for a new worker, model, conversion policy or macOS build"
type CertifiedIdentitySpec struct {
	// worker is the approved worker binary.
	// +required
	Worker WorkerIdentity `json:"worker"`

	// model is the approved checkpoint.
	// +required
	Model ModelIdentity `json:"model"`

	// conversionPolicy is the approved conversion.
	// +required
	ConversionPolicy ConversionPolicy `json:"conversionPolicy"`

	// macOSBuild is the only macOS build this approval holds for.
	// +required
	MacOSBuild MacOSBuild `json:"macOSBuild"`

	// vectorSpaceID names the embedding space the outputs belong to. Vectors with different
	// ids must never be compared.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	VectorSpaceID string `json:"vectorSpaceID"`
}

// CertifiedIdentityStatus reports where the identity can run and who uses it.
type CertifiedIdentityStatus struct {
	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// matchingNodes is how many MacNodes run this worker binary, on this backend, on this macOS
	// build.
	// +optional
	MatchingNodes int32 `json:"matchingNodes,omitempty"`

	// laneCount is how many CatalogLanes reference this identity. A change of the lanes alone
	// is written at most every 5 s, so a burst of lanes applied at once is a few writes.
	// +optional
	// +kubebuilder:validation:Minimum=0
	LaneCount int32 `json:"laneCount,omitempty"`

	// lanes lists the CatalogLanes (namespace/name) that reference this identity: all of them,
	// or the first 100 by name when more do (laneCount counts them all).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=100
	// +kubebuilder:validation:items:MaxLength=317
	Lanes []string `json:"lanes,omitempty"`

	// conditions: Matched, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// CertifiedIdentity approves one worker binary and backend, model checkpoint, conversion policy
// and macOS build together. Lanes reference an identity; a node serves a lane only if it matches the
// identity exactly.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:scope=Cluster,shortName=cid,categories=synapse
// +kubebuilder:printcolumn:name="Model",type=string,JSONPath=`.spec.model.name`
// +kubebuilder:printcolumn:name="Revision",type=string,JSONPath=`.spec.model.revision`
// +kubebuilder:printcolumn:name="macOS",type=string,JSONPath=`.spec.macOSBuild`
// +kubebuilder:printcolumn:name="Worker",type=string,JSONPath=`.spec.worker.signingIdentifier`
// +kubebuilder:printcolumn:name="Backend",type=string,JSONPath=`.spec.worker.backend`
// +kubebuilder:printcolumn:name="Nodes",type=integer,JSONPath=`.status.matchingNodes`
// +kubebuilder:printcolumn:name="Lanes",type=integer,JSONPath=`.status.laneCount`
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.spec.conversionPolicy.name`,priority=1
// +kubebuilder:printcolumn:name="Digest",type=string,JSONPath=`.spec.worker.binaryDigest`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type CertifiedIdentity struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the approved combination; immutable.
	// +required
	Spec CertifiedIdentitySpec `json:"spec"`

	// status is written by the controller.
	// +optional
	Status CertifiedIdentityStatus `json:"status,omitempty"`
}

// CertifiedIdentityList is a list of CertifiedIdentity.
// +kubebuilder:object:root=true
type CertifiedIdentityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []CertifiedIdentity `json:"items"`
}

func init() {
	SchemeBuilder.Register(&CertifiedIdentity{}, &CertifiedIdentityList{})
}
