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

package controllers

import (
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
)

// CacheOptions scopes the manager's cache to what the controllers read: the node Leases of
// synapse-node-lease only (the controller's RBAC reads Leases nowhere else), the Services and
// EndpointSlices the lanes' Service and endpoints controllers created, the certificate requests of the fleet's signer (by their managed-by labels: another
// Service of a lane's name is never read, so never taken over), and Nodes stripped to the pod
// CIDRs and addresses the address policy refuses.
func CacheOptions() cache.Options {
	return cache.Options{ByObject: map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{lifecycle.LeaseNamespace: {}}},
		// Only the requests of the fleet's own signer.
		&certificatesv1.CertificateSigningRequest{}: {Field: fields.OneTermEqualSelector("spec.signerName", agentcert.SignerName)},
		&corev1.Service{}:            {Label: labels.SelectorFromSet(labels.Set{endpoints.ServiceManagedByLabel: endpoints.ManagedBy})},
		&discoveryv1.EndpointSlice{}: {Label: labels.SelectorFromSet(labels.Set{discoveryv1.LabelManagedBy: endpoints.ManagedBy})},
		&corev1.Node{}: {Transform: func(o any) (any, error) {
			n, ok := o.(*corev1.Node)
			if !ok {
				return o, nil
			}
			m := n.ObjectMeta
			m.ManagedFields, m.Annotations = nil, nil
			return &corev1.Node{ObjectMeta: m, Spec: corev1.NodeSpec{PodCIDRs: n.Spec.PodCIDRs},
				Status: corev1.NodeStatus{Addresses: n.Status.Addresses}}, nil
		}},
	}, DefaultTransform: cache.TransformStripManagedFields()}
}
