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

package endpoints

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=networking.k8s.io,resources=servicecidrs,verbs=get;list;watch

// AddressPolicy decides which node addresses may become endpoints. An agent reports its own
// address, and a lane's Service sends in-cluster traffic there: trusted blindly, a
// compromised Mac could point a lane's Service at any address the cluster can reach (the
// CVE-2021-25740 class). So an address is published only inside the CIDRs the operator
// allows, and never inside the cluster's own pod, service or node addresses or the ranges the
// operator denies.
type AddressPolicy struct {
	// Allowed are the CIDRs Macs' addresses may be in; none allows nothing.
	Allowed []netip.Prefix
	// Denied are ranges refused whatever Allowed says, beside the cluster's own, which are read
	// from the API (ServiceCIDRs, Nodes' pod CIDRs and addresses).
	Denied []netip.Prefix
}

// ParsePrefixes parses CIDRs ("192.0.2.0/24"); a bare address is a single-address prefix.
func ParsePrefixes(cidrs []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, c := range cidrs {
		c = strings.TrimSpace(c)
		if c == "" {
			continue
		}
		if !strings.Contains(c, "/") {
			a, err := netip.ParseAddr(c)
			if err != nil {
				return nil, fmt.Errorf("CIDR %q: %w", c, err)
			}
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("CIDR %q: %w", c, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// ClusterRange is one of the cluster's own ranges, with what it is, for the refusal message.
type ClusterRange struct {
	Prefix netip.Prefix
	What   string
}

// AddressRefusedError says why an address is not published. Reason is one of the MacNode
// AddressAllowed condition's reasons.
type AddressRefusedError struct {
	Address string
	Reason  string
	Detail  string
}

func (e *AddressRefusedError) Error() string {
	return fmt.Sprintf("address %q is not published: %s", e.Address, e.Detail)
}

// IsAddressRefused reports whether err is an AddressRefusedError.
func IsAddressRefused(err error) bool {
	var r *AddressRefusedError
	return errors.As(err, &r)
}

// Judge returns the address parsed if it may be an endpoint, or an *AddressRefusedError.
// cluster are the cluster's own ranges (ClusterRanges).
func (p AddressPolicy) Judge(address string, cluster []ClusterRange) (netip.Addr, error) {
	refuse := func(reason, format string, args ...any) (netip.Addr, error) {
		return netip.Addr{}, &AddressRefusedError{Address: address, Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}
	ip, err := netip.ParseAddr(address)
	switch {
	case err != nil:
		return refuse(v1.NodeReasonAddressUnusable, "it is not an IP address")
	case !ip.Is4():
		return refuse(v1.NodeReasonAddressUnusable, "only IPv4 addresses are published")
	case ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() || ip.IsMulticast() || ip.IsLinkLocalMulticast():
		// An EndpointSlice may not hold these, and no in-cluster client could reach them.
		return refuse(v1.NodeReasonAddressUnusable, "a loopback, link-local, unspecified or multicast address cannot be an endpoint")
	}
	for _, d := range p.Denied {
		if d.Contains(ip) {
			return refuse(v1.NodeReasonAddressInClusterRange, "it is inside %s, which the controller's --denied-endpoint-cidrs refuses", d)
		}
	}
	for _, r := range cluster {
		if r.Prefix.Contains(ip) {
			return refuse(v1.NodeReasonAddressInClusterRange, "it is inside %s, %s: a Mac's address may never point a Service into the cluster itself", r.Prefix, r.What)
		}
	}
	if len(p.Allowed) == 0 {
		return refuse(v1.NodeReasonAddressNotAllowed, "no CIDR is allowed for Mac addresses; set the controller's --endpoint-cidrs (the chart's endpoints.allowedCIDRs) to the Macs' network")
	}
	for _, a := range p.Allowed {
		if a.Contains(ip) {
			return ip, nil
		}
	}
	return refuse(v1.NodeReasonAddressNotAllowed, "it is outside the allowed CIDRs %s (the controller's --endpoint-cidrs)", prefixList(p.Allowed))
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}

// ClusterRanges reads the cluster's own ranges: every ServiceCIDR (the service range), every
// Node's pod CIDRs, and every Node's addresses.
func ClusterRanges(ctx context.Context, reader client.Reader) ([]ClusterRange, error) {
	var out []ClusterRange
	var cidrs networkingv1.ServiceCIDRList
	if err := reader.List(ctx, &cidrs, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing ServiceCIDRs: %w", err)
	}
	for _, sc := range cidrs.Items {
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, ClusterRange{Prefix: p.Masked(), What: "the cluster's service range (ServiceCIDR " + sc.Name + ")"})
			}
		}
	}
	var nodes corev1.NodeList
	if err := reader.List(ctx, &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		for _, c := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, ClusterRange{Prefix: p.Masked(), What: "the pod range of Node " + n.Name})
			}
		}
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				out = append(out, ClusterRange{Prefix: netip.PrefixFrom(ip, ip.BitLen()), What: "an address of Node " + n.Name})
			}
		}
	}
	// In one order whatever order the lists came in (a cache's is a map's): an address inside
	// two ranges is refused naming the same one on every pass, so the AddressAllowed condition's
	// message does not change, and its own write does not bring another (AddressChanges).
	slices.SortFunc(out, func(a, b ClusterRange) int {
		return cmp.Or(a.Prefix.Addr().Compare(b.Prefix.Addr()), cmp.Compare(a.Prefix.Bits(), b.Prefix.Bits()), strings.Compare(a.What, b.What))
	})
	return out, nil
}

// nodeAddress is the first InternalIP of the node that may be an endpoint, or the refusal of
// the first one there is (an *AddressRefusedError also when it reports none).
func (p AddressPolicy) nodeAddress(node *v1.MacNode, cluster []ClusterRange) (netip.Addr, error) {
	var first error
	for _, a := range node.Status.Addresses {
		if a.Type != "InternalIP" {
			continue
		}
		ip, err := p.Judge(a.Address, cluster)
		if err == nil {
			return ip, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = &AddressRefusedError{Reason: v1.NodeReasonAddressUnusable, Detail: "the agent reports no InternalIP address"}
	}
	return netip.Addr{}, first
}
