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

// PrewarmPolicy condition types and reasons.
const (
	// PrewarmConditionConflict is True when a lane this policy selects is also selected by
	// another policy; the conflict is resolved by name order and the loser says so here.
	PrewarmConditionConflict = "Conflict"
)

// PrewarmPolicySpec chooses the rungs a node loads in the background once a lane is ready:
// at the lowest priority, one admission at a time, only into free budget, never evicting.
type PrewarmPolicySpec struct {
	// laneSelector selects the CatalogLanes of this namespace the policy applies to. An empty
	// selector selects every lane of the namespace. Lanes that name a policy in
	// spec.prewarmPolicyRef use that one instead.
	// +optional
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn', 'Exists', 'DoesNotExist'])",message="laneSelector.matchExpressions operator must be In, NotIn, Exists or DoesNotExist"
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['Exists', 'DoesNotExist'] ? !has(e.values) || size(e.values) == 0 : has(e.values) && size(e.values) > 0)",message="laneSelector.matchExpressions: In and NotIn need values, Exists and DoesNotExist take none"
	LaneSelector metav1.LabelSelector `json:"laneSelector,omitempty"`

	// rungs are loaded in this order, ascending; rungs that are not in a lane's ladder are
	// skipped for that lane. An empty list turns prewarm off for the selected lanes.
	// +optional
	// +listType=set
	// +kubebuilder:default={128,256,512}
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.isSorted()",message="rungs must be in ascending order, for example [128, 256, 512]"
	Rungs []Rung `json:"rungs"`
}

// PrewarmPolicyStatus reports which lanes the policy applies to.
type PrewarmPolicyStatus struct {
	// observedGeneration is the generation the status was computed from.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// selectedLanes is how many lanes the policy applies to.
	// +optional
	SelectedLanes int32 `json:"selectedLanes,omitempty"`

	// conditions: Conflict, Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PrewarmPolicy says which rungs of which lanes are loaded before the first request needs them.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=prewarm,categories=synapse
// +kubebuilder:printcolumn:name="Rungs",type=string,JSONPath=`.spec.rungs`
// +kubebuilder:printcolumn:name="Lanes",type=integer,JSONPath=`.status.selectedLanes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type PrewarmPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the desired policy.
	// +required
	Spec PrewarmPolicySpec `json:"spec"`

	// status is written by the controller.
	// +optional
	Status PrewarmPolicyStatus `json:"status,omitempty"`
}

// PrewarmPolicyList is a list of PrewarmPolicy.
// +kubebuilder:object:root=true
type PrewarmPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PrewarmPolicy `json:"items"`
}

func init() {
	SchemeBuilder.Register(&PrewarmPolicy{}, &PrewarmPolicyList{})
}
