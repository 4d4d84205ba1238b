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
// The RBAC markers below are the permissions the manager itself needs (events; the metrics
// endpoint's authentication and authorisation of its scrapers); each reconciler declares its
// own beside its code. The leader-election Lease is in the controller's own namespace, under a
// Role of its own (config/rbac/leader_election_role.yaml), not in this ClusterRole.
//
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=cataloglanes;certifiedidentities;prewarmpolicies;macnodes;laneplacements,verbs=get;list;watch
package controllers
