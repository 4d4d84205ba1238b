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

// Rung is one shape of a lane's ladder: a sequence length, in tokens, that the worker compiles
// into its own set of Neural Engine programs. The Neural Engine pads the sequence axis to a
// multiple of 64, so every rung is one.
// +kubebuilder:validation:Minimum=64
// +kubebuilder:validation:Maximum=8192
// +kubebuilder:validation:MultipleOf=64
type Rung int32

// Task is what a lane's model computes.
// +kubebuilder:validation:Enum=embed;rerank
type Task string

const (
	// TaskEmbed serves POST /v1/embeddings.
	TaskEmbed Task = "embed"
	// TaskRerank serves POST /v1/rerank.
	TaskRerank Task = "rerank"
)

// Device is where a lane's requests run. It is always explicit: a lane never moves to another
// device, and a node that cannot run the device refuses the lane instead of running it elsewhere.
// +kubebuilder:validation:Enum=ane
type Device string

const (
	// DeviceANE is the Apple Neural Engine, driven directly through the private framework.
	DeviceANE Device = "ane"
)

// Sha256Digest is a content digest written "sha256:" followed by 64 lowercase hex digits.
// +kubebuilder:validation:Pattern=`^sha256:[a-f0-9]{64}$`
// +kubebuilder:validation:MaxLength=71
type Sha256Digest string

// MacOSBuild is a macOS build number as `sw_vers -buildVersion` prints it, for example 25B78.
// +kubebuilder:validation:Pattern=`^[0-9]{2}[A-Z][0-9]{1,4}[a-z]?$`
// +kubebuilder:validation:MaxLength=12
type MacOSBuild string

// LocalObjectReference names an object of a known kind.
type LocalObjectReference struct {
	// name of the referenced object.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// Condition types and reasons shared by several kinds.
const (
	// ConditionReady summarises an object's other conditions: True when it does its job.
	ConditionReady = "Ready"
)
