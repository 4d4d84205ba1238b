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

// Package agentcert issues the Macs' serving certificates through the CSR API, as the
// kube-controller-manager's approver and signer do for kubelets: under the fleet's own signer
// (SignerName) it approves a request only from a node's own identity and only for that node's
// name and addresses, signs it with the fleet CA kept in a Secret, and publishes the CA as a
// ClusterTrustBundle for clients.
package agentcert

import (
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// SignerName is the fleet's signer of agent serving certificates.
const SignerName = "fleet.synapse.dev/agent-serving"

// NodeUserPrefix is a node identity's user name without the node: a Mac's agent authenticates
// as the ServiceAccount synapse-nodes/synapse-node-<node>.
const NodeUserPrefix = "system:serviceaccount:synapse-nodes:synapse-node-"

// NodeOf is the node a CSR's requester is the identity of, or "" for any other requester.
func NodeOf(csr *certificatesv1.CertificateSigningRequest) string {
	node, ok := strings.CutPrefix(csr.Spec.Username, NodeUserPrefix)
	if !ok {
		return ""
	}
	return node
}

// allowedUsages are what a serving certificate may be used for; server auth is required.
var allowedUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth}

// Judge says why the CSR may not be approved for node (nil: it may): its requester must be the
// node's own identity, its subject the node, its names the node's name, host names it reports
// or lanes' Service names (<lane>.<namespace>.svc), its addresses the node's reported
// addresses, its usages those of a TLS server, its key one of today's. What the node reports
// is its own word; whether the rest of the fleet lets it hold those names and addresses is
// Controller.contested's to say. Of the Service names,
// only those of lanes placed on the node that hold their name (services) are certified; the
// others are left out of the returned request, which is what is signed, and listed in left:
// one lane's name that cannot be certified (its placement just went, another Service holds its
// name) never costs the node the certificate for its own names and its other lanes.
func Judge(csr *certificatesv1.CertificateSigningRequest, node *v1.MacNode, services []string) (req *x509.CertificateRequest, left []string, err error) {
	name := NodeOf(csr)
	if name == "" || node == nil || node.Name != name {
		return nil, nil, fmt.Errorf("%s is not a node identity (ServiceAccount synapse-nodes/synapse-node-<node>) of a registered MacNode", csr.Spec.Username)
	}
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, nil, fmt.Errorf("the request is not a PEM CERTIFICATE REQUEST")
	}
	req, err = x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("the request does not parse: %w", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, nil, fmt.Errorf("the request's signature does not verify: %w", err)
	}
	if req.Subject.CommonName != name || len(req.Subject.Organization) > 0 {
		return nil, nil, fmt.Errorf("the subject must be CN=%s and nothing else, not %s", name, req.Subject)
	}
	if len(req.EmailAddresses) > 0 || len(req.URIs) > 0 {
		return nil, nil, fmt.Errorf("a serving certificate names no e-mail addresses or URIs")
	}
	if len(req.DNSNames) == 0 && len(req.IPAddresses) == 0 {
		return nil, nil, fmt.Errorf("the request names neither the node nor an address")
	}
	var kept []string
	for _, dns := range req.DNSNames {
		// A client compares names in lower case, without a trailing dot, and takes a wildcard
		// for any name under it (golang/go, src/crypto/x509/verify.go, matchHostnames): a name
		// written otherwise would be certified as one the checks below never saw.
		if dns != strings.TrimSuffix(strings.ToLower(dns), ".") || strings.Contains(dns, "*") || net.ParseIP(dns) != nil {
			return nil, nil, fmt.Errorf("DNS name %s is not a host name in lower case without a trailing dot or a wildcard (an IP address is asked for as one)", dns)
		}
		// A Service's name only through a lane placed on the node: never through a host name
		// the node reports (its own words), and never in any other form.
		switch {
		case serviceShaped(dns) && slices.Contains(services, dns):
			kept = append(kept, dns)
		case serviceShaped(dns):
			left = append(left, dns)
		case slices.Contains(strings.Split(dns, "."), "svc"):
			return nil, nil, fmt.Errorf("DNS name %s is a Service's name of another form than a lane's (<lane>.<namespace>.svc)", dns)
		case dns == name || hasAddress(node, v1.NodeAddressType("Hostname"), dns):
			kept = append(kept, dns)
		default:
			return nil, nil, fmt.Errorf("DNS name %s is neither node %s's name, a host name it reports, nor a lane's Service name (<lane>.<namespace>.svc)", dns, name)
		}
	}
	req.DNSNames = kept
	if len(kept) == 0 && len(req.IPAddresses) == 0 {
		return nil, nil, fmt.Errorf("the request names neither the node nor an address it may hold")
	}
	for _, ip := range req.IPAddresses {
		if !hasIP(node, ip) {
			return nil, nil, fmt.Errorf("IP address %s is not one node %s reports", ip, name)
		}
	}
	if !slices.Contains(csr.Spec.Usages, certificatesv1.UsageServerAuth) {
		return nil, nil, fmt.Errorf("the usages must include server auth")
	}
	for _, u := range csr.Spec.Usages {
		if !slices.Contains(allowedUsages, u) {
			return nil, nil, fmt.Errorf("usage %q is not a TLS server's", u)
		}
	}
	switch k := req.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve.Params().BitSize < 256 {
			return nil, nil, fmt.Errorf("an ECDSA key must be P-256 or larger")
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return nil, nil, fmt.Errorf("an RSA key must have at least 2048 bits")
		}
	default:
		return nil, nil, fmt.Errorf("the key must be ECDSA or RSA, not %T", req.PublicKey)
	}
	return req, left, nil
}

// withPlacedLanes adds to the request that is signed the Service names of the lanes placed on
// the node (services) that it does not name yet, and returns them. A Mac asks for a certificate
// naming the lanes it knows of, and asks again each time it learns of another; a request judged
// a minute after it was made (a fleet's rollout brings requests by the hundred) was signed
// without the lanes placed on the node meanwhile, which then waited for the next request and
// its judgement before they could be Ready. Signed with them, the certificate already names
// them when the agent learns of them: the node is entitled to exactly these names (Judge
// certifies a lane's Service name only through its placement on the node), and client-go's
// certificate manager, which the agents run, is satisfied by a certificate that names more
// than it asked for (certSatisfiesTemplateLocked compares the names it wants against the
// certificate's, kubernetes/client-go util/certificate/certificate_manager.go).
func withPlacedLanes(req *x509.CertificateRequest, services []string) []string {
	var added []string
	for _, s := range services {
		if !slices.Contains(req.DNSNames, s) {
			added = append(added, s)
		}
	}
	req.DNSNames = append(req.DNSNames, added...)
	return added
}

// serviceShaped reports whether dns has the form of a lane's Service name, <lane>.<namespace>.svc.
func serviceShaped(dns string) bool {
	return strings.Count(dns, ".") == 2 && strings.HasSuffix(dns, ".svc")
}

func hasAddress(node *v1.MacNode, typ v1.NodeAddressType, addr string) bool {
	return slices.ContainsFunc(node.Status.Addresses, func(a v1.NodeAddress) bool { return a.Type == typ && a.Address == addr })
}

func hasIP(node *v1.MacNode, ip net.IP) bool {
	return slices.ContainsFunc(node.Status.Addresses, func(a v1.NodeAddress) bool {
		got := net.ParseIP(a.Address)
		return got != nil && got.Equal(ip)
	})
}
