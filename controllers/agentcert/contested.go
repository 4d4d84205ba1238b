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

package agentcert

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/index"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

// contested says why the names and addresses req asks for may not be certified to node although
// it reports them (nil: they may), or fails with a read's error.
//
// An agent writes its own MacNode's status, and config/policies/node_restriction.yaml does not
// judge what it writes there: an address or host name a node reports is its word alone.
// Certified on that word, Mac A reporting Mac B's address or host name would get a certificate
// for it and pass for B to any client that verifies B by it. So of what the fleet holds:
//
//   - A node's own name (its MacNode's) is always its own: it keeps it whoever else reports it,
//     and another node reporting it as a host name is refused it.
//   - A lane's Service name is certified only through the lane's placement on the node (Judge),
//     which the controllers, not the node, write.
//   - An address or host name two MacNodes report is certified to neither until only one
//     reports it. The first to report it does not win: the order of two status writes is one
//     an attacker can race, and the other node may well be the address's real holder. The
//     Denied condition names the other MacNode, so whoever reads it knows which two to look
//     at; the agent asks again (client-go's certificate manager backs off) and is certified
//     once the conflict ends.
//   - An IP address is certified only if the lanes' EndpointSlices may list it: the address
//     controller's judgement (endpoints.AddressPolicy, which its AddressAllowed condition
//     shows), so that the two agree on which addresses the cluster trusts a Mac with.
//
// The other MacNodes are read from the cache (the FieldNodeAddress index), not the API server as
// the requester's own MacNode is: two nodes reporting one address within the cache's lag of
// each other can both be certified once; the next request of either is denied.
//
// A conflict that appears after a certificate was issued revokes nothing: the certificate is
// valid until it expires (DefaultCertLifetime, or what the agent asks up to MaxCertLifetime),
// and its renewal is denied.
func (c *Controller) contested(ctx context.Context, node *v1.MacNode, req *x509.CertificateRequest, services []string) (verdict, err error) {
	for _, dns := range req.DNSNames {
		if dns == node.Name || slices.Contains(services, dns) {
			continue
		}
		other := &v1.MacNode{}
		switch err := c.kube.Get(ctx, client.ObjectKey{Name: dns}, other); {
		case err == nil:
			return fmt.Errorf("DNS name %s is MacNode %s's own name, which only that node is certified for", dns, other.Name), nil
		case !apierrors.IsNotFound(err):
			return nil, err
		}
		if verdict, err := c.reportedElsewhere(ctx, node, "DNS name", dns); verdict != nil || err != nil {
			return verdict, err
		}
	}
	if len(req.IPAddresses) == 0 {
		return nil, nil
	}
	cluster, err := endpoints.ClusterRanges(ctx, c.kube)
	if err != nil {
		return nil, err
	}
	for _, ip := range req.IPAddresses {
		var refused *endpoints.AddressRefusedError
		if _, err := c.policy.Judge(ip.String(), cluster); errors.As(err, &refused) {
			return fmt.Errorf("IP address %s is not one the controller publishes for a Mac, so it is not certified: %s", ip, refused.Detail), nil
		} else if err != nil {
			return nil, err
		}
		if verdict, err := c.reportedElsewhere(ctx, node, "IP address", ip.String()); verdict != nil || err != nil {
			return verdict, err
		}
	}
	return nil, nil
}

// reportedElsewhere says which other MacNodes report address, as a denial (nil: none does).
func (c *Controller) reportedElsewhere(ctx context.Context, node *v1.MacNode, what, address string) (verdict, err error) {
	var list v1.MacNodeList
	if err := c.kube.List(ctx, &list, client.MatchingFields{index.FieldNodeAddress: index.AddressKey(address)}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing the MacNodes that report %s: %w", address, err)
	}
	var others []string
	for _, n := range list.Items {
		if n.Name != node.Name {
			others = append(others, n.Name)
		}
	}
	if len(others) == 0 {
		return nil, nil
	}
	slices.Sort(others)
	return fmt.Errorf("%s %s is also reported by MacNode %s: no node is certified for an address or host name another reports, until only one reports it",
		what, address, strings.Join(others, ", ")), nil
}
