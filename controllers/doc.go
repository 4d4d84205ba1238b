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

// Package controllers holds the reconcilers of synapse-controller, one subpackage per concern
// (lane placement, node lifecycle, endpoints, identities, prewarm policies).
//
// The RBAC markers below are the permissions the manager itself needs; each reconciler declares
// its own beside its code.
//
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=cataloglanes;certifiedidentities;prewarmpolicies;macnodes;laneplacements,verbs=get;list;watch
package controllers
