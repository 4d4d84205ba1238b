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

package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

// hostPort is where a Mac's API listens on the loopback.
func hostPort(node string) string {
	GinkgoHelper()
	u, err := url.Parse(fleet.URL(node))
	Expect(err).NotTo(HaveOccurred())
	Expect(u.Scheme).To(Equal("https"))
	return u.Host
}

// handshake connects to a Mac's API as a TLS client that trusts pool and expects serverName.
func handshake(node, serverName string, pool *x509.CertPool) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", hostPort(node),
		&tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

var _ = Describe("The Macs' serving certificates", func() {
	It("should chain to the published CA bundle, name the node and its address, and come from a request the controller approved", func() {
		pool, err := fleet.TrustBundle(ctx)
		Expect(err).NotTo(HaveOccurred())
		for _, node := range slices.Concat(matching, []string{other}) {
			By(node)
			cert, err := handshake(node, node, pool)
			Expect(err).NotTo(HaveOccurred())
			Expect(cert.Subject.CommonName).To(Equal(node))
			// The node's name, and the Service names of the lanes placed on it (those of
			// lanes the suite placed there earlier stay until the next rotation).
			Expect(cert.DNSNames).To(ContainElement(node))
			for _, dns := range cert.DNSNames {
				if dns != node {
					Expect(dns).To(MatchRegexp(`^lane-[0-9]+\.default\.svc$`), "%s's certificate names %s", node, dns)
				}
			}
			Expect(cert.IPAddresses).To(HaveLen(1))
			Expect(cert.IPAddresses[0].String()).To(Equal(fleet.AdvertisedAddress(node)))
			Expect(cert.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}))
			_, err = cert.Verify(x509.VerifyOptions{DNSName: fleet.AdvertisedAddress(node), Roots: pool})
			Expect(err).NotTo(HaveOccurred(), "the certificate names the advertised address")
			// Nor does it pass for another Mac's address: each Mac has its own.
			elsewhere := fleet.AdvertisedAddress(matching[0])
			if node == matching[0] {
				elsewhere = fleet.AdvertisedAddress(other)
			}
			_, err = cert.Verify(x509.VerifyOptions{DNSName: elsewhere, Roots: pool})
			Expect(err).To(MatchError(ContainSubstring("certificate is valid for")), "%s's certificate passes for %s", node, elsewhere)

			// A client expecting another Mac refuses it: the certificate is this node's alone.
			_, err = handshake(node, "mac-elsewhere", pool)
			Expect(err).To(MatchError(ContainSubstring("certificate is valid for " + node)))
			// A client that does not trust the fleet's CA refuses it.
			_, err = handshake(node, node, x509.NewCertPool())
			Expect(err).To(MatchError(ContainSubstring("certificate signed by unknown authority")))
		}

		By("the requests that issued them: each Mac's own, judged by the controller")
		var csrs certificatesv1.CertificateSigningRequestList
		Expect(kube.List(ctx, &csrs)).To(Succeed())
		approved := map[string]bool{}
		for _, csr := range csrs.Items {
			if csr.Spec.SignerName != agentcert.SignerName {
				continue
			}
			node := agentcert.NodeOf(&csr)
			Expect(node).NotTo(BeEmpty(), "request %s from %s", csr.Name, csr.Spec.Username)
			for _, c := range csr.Status.Conditions {
				if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue && c.Reason == agentcert.ReasonApproved && len(csr.Status.Certificate) > 0 {
					approved[node] = true
				}
			}
		}
		for _, node := range slices.Concat(matching, []string{other}) {
			Expect(approved).To(HaveKey(node))
		}
	})

	It("should refuse plain HTTP on the API's port", func() {
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + hostPort(matching[0]) + "/healthz")
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Body.Close()).To(Succeed())
		// Go's TLS server answers a plain HTTP request so, and serves nothing.
		Expect(resp.StatusCode).To(Equal(http.StatusBadRequest))
	})

	It("should say in the lane's Service that its port is HTTPS", func() {
		l := newLane(v1.TaskEmbed, 1)
		readyOn(l)
		svc := &corev1.Service{}
		Eventually(func(g Gomega) {
			g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), svc)).To(Succeed())
		}).WithTimeout(30 * time.Second).Should(Succeed())
		Expect(svc.Spec.Ports).To(HaveLen(1))
		Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(endpoints.ServicePort))
		Expect(svc.Spec.Ports[0].AppProtocol).To(HaveValue(Equal("https")))
		Expect(svc.Spec.Ports[0].Name).To(Equal(endpoints.PortName))
	})
})
