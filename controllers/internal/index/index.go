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

// Package index registers the controller cache's field indexes. A list from the cache by
// labels walks every object of the kind and matches each; by a field the cache indexes, it
// reads the matching ones alone. make scale's profile showed the walks: the lifecycle
// controller listing a node's placements by label and the identity controller listing every
// lane, each on every pass, were two thirds of the controller's reconcile CPU while 1,500 lanes
// were placed on 300 Macs. The fields are the CRDs' selectableFields too, so a client without
// the cache (a test's, kubectl's) selects by the same names, on the API server; all but
// FieldNodeAddress, a list, which a selectableField cannot name (its jsonPath may not use the
// array notation: kubernetes/apiextensions-apiserver, pkg/apis/apiextensions/v1/types.go,
// SelectableField), so it is the cache's alone.
package index

import (
	"context"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// Register adds the indexes to the manager's cache; call it once, before the controllers start.
func Register(ctx context.Context, indexer client.FieldIndexer) error {
	for _, ix := range []struct {
		obj   client.Object
		field string
		value func(client.Object) []string
	}{
		{&v1.LanePlacement{}, v1.FieldPlacementNode, func(o client.Object) []string { return []string{o.(*v1.LanePlacement).Spec.Node} }},
		{&v1.LanePlacement{}, v1.FieldPlacementIdentity, func(o client.Object) []string { return []string{o.(*v1.LanePlacement).Spec.Identity} }},
		{&v1.CatalogLane{}, v1.FieldLaneIdentity, func(o client.Object) []string { return []string{o.(*v1.CatalogLane).Spec.IdentityRef.Name} }},
		{&v1.MacNode{}, FieldNodeAddress, func(o client.Object) []string { return nodeAddresses(o.(*v1.MacNode)) }},
	} {
		if err := indexer.IndexField(ctx, ix.obj, ix.field, ix.value); err != nil {
			return err
		}
	}
	return nil
}

// FieldNodeAddress indexes MacNodes by every address they report, of any type, as AddressKey
// writes it: the MacNodes that report an address, which agentcert certifies for none of them
// but its only reporter.
const FieldNodeAddress = "status.addresses.address"

// AddressKey is the index's key of an address: an IP address in its canonical form (an IPv4
// address mapped into IPv6 is the IPv4 address, as crypto/x509 compares them with net.IP.Equal),
// any other a host name in lower case without its trailing dot, as crypto/x509's host name
// verification compares names (golang/go, src/crypto/x509/verify.go, matchHostnames). Two
// spellings a client cannot tell apart are one key.
func AddressKey(address string) string {
	if ip, err := netip.ParseAddr(address); err == nil {
		return ip.Unmap().WithZone("").String()
	}
	return strings.TrimSuffix(strings.ToLower(address), ".")
}

func nodeAddresses(n *v1.MacNode) []string {
	var out []string
	for _, a := range n.Status.Addresses {
		if k := AddressKey(a.Address); k != "" && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}
