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

package agentcert_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
)

var seq int

// macNode registers a MacNode that reports addresses.
func macNode(addresses ...string) string {
	GinkgoHelper()
	seq++
	name := fmt.Sprintf("mac-%d", seq)
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(kube.Create(ctx, n)).To(Succeed())
	for _, a := range addresses {
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: "InternalIP", Address: a})
	}
	Expect(kube.Status().Update(ctx, n)).To(Succeed())
	return name
}

// placeOn places a lane of namespace default on node; it returns the placement.
func placeOn(lane, node string) *v1.LanePlacement {
	GinkgoHelper()
	p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: lane + "-" + node, Namespace: "default", Labels: map[string]string{v1.LabelLane: lane, v1.LabelNode: node}},
		Spec: v1.LanePlacementSpec{Lane: lane, Node: node, Identity: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	Expect(kube.Create(ctx, p)).To(Succeed())
	return p
}

// request is what a CSR asks for.
type request struct {
	cn       string
	dns      []string
	ips      []string
	usages   []certificatesv1.KeyUsage
	key      crypto.Signer
	lifetime *int32
}

func ecKey() crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	return k
}

// submit creates the request as the ServiceAccount sa of synapse-nodes and returns its name.
func submit(sa string, r request) string {
	GinkgoHelper()
	if r.key == nil {
		r.key = ecKey()
	}
	if r.usages == nil {
		r.usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: r.cn}, DNSNames: r.dns}
	for _, ip := range r.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, r.key)
	Expect(err).NotTo(HaveOccurred())
	seq++
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("csr-%d", seq)},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: agentcert.SignerName, Usages: r.usages, ExpirationSeconds: r.lifetime,
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})}}
	_, err = identity(sa).CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return csr.Name
}

// reconcileUntilSettled reconciles the request until it is signed, denied or failed.
func reconcileUntilSettled(c *agentcert.Controller, name string) *certificatesv1.CertificateSigningRequest {
	GinkgoHelper()
	csr := &certificatesv1.CertificateSigningRequest{}
	for range 3 {
		_, err := c.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
		Expect(err).NotTo(HaveOccurred())
		Expect(kube.Get(ctx, client.ObjectKey{Name: name}, csr)).To(Succeed())
	}
	return csr
}

func condition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) *certificatesv1.CertificateSigningRequestCondition {
	for i := range csr.Status.Conditions {
		if csr.Status.Conditions[i].Type == t {
			return &csr.Status.Conditions[i]
		}
	}
	return nil
}

// trustPool is the ClusterTrustBundle's certificates, as a client would load them.
func trustPool() *x509.CertPool {
	GinkgoHelper()
	ctb := &certificatesv1.ClusterTrustBundle{}
	Expect(kube.Get(ctx, client.ObjectKey{Name: agentcert.TrustBundle}, ctb)).To(Succeed())
	Expect(ctb.Spec.SignerName).To(Equal(agentcert.SignerName))
	pool := x509.NewCertPool()
	Expect(pool.AppendCertsFromPEM([]byte(ctb.Spec.TrustBundle))).To(BeTrue())
	return pool
}

func leaf(csr *certificatesv1.CertificateSigningRequest) *x509.Certificate {
	GinkgoHelper()
	block, _ := pem.Decode(csr.Status.Certificate)
	Expect(block).NotTo(BeNil(), "no certificate issued")
	cert, err := x509.ParseCertificate(block.Bytes)
	Expect(err).NotTo(HaveOccurred())
	return cert
}

var _ = Describe("Agent serving certificates", func() {
	It("should approve and sign a node's request for its own name and address, verifiable with the published bundle", func() {
		node := macNode("192.0.2.10")
		name := submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{"192.0.2.10"}})
		csr := reconcileUntilSettled(newController(), name)
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil())
		cert := leaf(csr)
		Expect(cert.DNSNames).To(Equal([]string{node}))
		Expect(cert.IPAddresses[0].String()).To(Equal("192.0.2.10"))
		Expect(cert.ExtKeyUsage).To(Equal([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}))
		Expect(cert.NotAfter).To(BeTemporally("~", clk.Now().Add(agentcert.DefaultCertLifetime), time.Second))
		for _, host := range []string{node, "192.0.2.10"} {
			_, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: trustPool(), CurrentTime: clk.Now(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			Expect(err).NotTo(HaveOccurred(), host)
		}
	})

	It("should approve a request naming the Services of the lanes placed on the node, so that a call through a lane's Service verifies", func() {
		node := macNode("192.0.2.13")
		placeOn("gte-search", node)
		names := []string{node, "gte-search.default.svc"}
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: names, ips: []string{"192.0.2.13"}}))
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil(), "%+v", csr.Status)
		cert := leaf(csr)
		Expect(cert.DNSNames).To(Equal(names))
		for _, host := range names[1:] {
			_, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: trustPool(), CurrentTime: clk.Now(),
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
			Expect(err).NotTo(HaveOccurred(), host)
		}
	})

	It("should leave out of the certificate a lane's Service name the node may not hold (the lane is not placed on it, or no longer is, or another Service holds its name), and certify the rest", func() {
		here, there := macNode("192.0.2.14"), macNode("192.0.2.15")
		placeOn("gte-there", there)
		gone := placeOn("gte-gone", here)
		Expect(kube.Delete(ctx, gone)).To(Succeed())
		placeOn("kubernetes", here) // a lane whose name the API server's own Service holds
		placeOn("gte-here", here)
		refused := []string{"gte-there.default.svc", "gte-gone.default.svc", "kubernetes.default.svc"}
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+here,
			request{cn: here, dns: append([]string{here, "gte-here.default.svc"}, refused...), ips: []string{"192.0.2.14"}}))
		approved := condition(csr, certificatesv1.CertificateApproved)
		Expect(approved).NotTo(BeNil(), "%+v", csr.Status)
		for _, dns := range refused {
			Expect(approved.Message).To(ContainSubstring(dns))
		}
		Expect(leaf(csr).DNSNames).To(Equal([]string{here, "gte-here.default.svc"}), "the node keeps its own names and its other lanes'")
	})

	It("should never certify a Service's name through a host name the node reports", func() {
		here := macNode("192.0.2.17")
		n := &v1.MacNode{}
		Expect(kube.Get(ctx, client.ObjectKey{Name: here}, n)).To(Succeed())
		n.Status.Addresses = append(n.Status.Addresses, v1.NodeAddress{Type: "Hostname", Address: "payments.prod.svc"},
			v1.NodeAddress{Type: "Hostname", Address: "kubernetes.default.svc.cluster.local"})
		Expect(kube.Status().Update(ctx, n)).To(Succeed())
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+here, request{cn: here, dns: []string{here, "payments.prod.svc"}}))
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil(), "%+v", csr.Status)
		Expect(leaf(csr).DNSNames).To(Equal([]string{here}), "no lane of that name is placed on the node")
		csr = reconcileUntilSettled(newController(), submit("synapse-node-"+here, request{cn: here, dns: []string{here, "kubernetes.default.svc.cluster.local"}}))
		Expect(condition(csr, certificatesv1.CertificateDenied)).NotTo(BeNil(), "%+v", csr.Status)
	})

	It("should deny a request naming a DNS name of any other form", func() {
		here := macNode("192.0.2.16")
		placeOn("gte-form", here)
		for _, dns := range []string{"gte-form.default", "gte-form.default.svc.cluster.local", "kubernetes.default.svc.cluster.local"} {
			csr := reconcileUntilSettled(newController(), submit("synapse-node-"+here, request{cn: here, dns: []string{here, dns}}))
			denied := condition(csr, certificatesv1.CertificateDenied)
			Expect(denied).NotTo(BeNil(), "%s: not denied: %+v", dns, csr.Status)
			Expect(denied.Message).To(ContainSubstring("DNS name " + dns + " is"))
		}
	})

	It("should keep one CA: another controller (a new leader) signs with the same one", func() {
		node := macNode("192.0.2.11")
		first := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}}))
		second := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}}))
		Expect(leaf(first).Issuer).To(Equal(leaf(second).Issuer))
		pool := trustPool()
		for _, csr := range []*certificatesv1.CertificateSigningRequest{first, second} {
			_, err := leaf(csr).Verify(x509.VerifyOptions{DNSName: node, Roots: pool, CurrentTime: clk.Now()})
			Expect(err).NotTo(HaveOccurred())
		}
		s := &corev1.Secret{}
		Expect(kube.Get(ctx, client.ObjectKey{Namespace: caNamespace, Name: agentcert.CASecret}, s)).To(Succeed())
		Expect(s.Type).To(Equal(corev1.SecretTypeTLS))
	})

	It("should approve and sign a request in one pass, so a fleet's burst of requests waits in the queue once", func() {
		node := macNode("192.0.2.13")
		name := submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{"192.0.2.13"}})
		_, err := newController().Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
		Expect(err).NotTo(HaveOccurred())
		csr := &certificatesv1.CertificateSigningRequest{}
		Expect(kube.Get(ctx, client.ObjectKey{Name: name}, csr)).To(Succeed())
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil())
		Expect(leaf(csr).DNSNames).To(ConsistOf(node))
	})

	It("should sign with a CA replaced in its Secret once CARecheck has passed, not before", func() {
		c := newController()
		node := macNode("192.0.2.14")
		before := leaf(reconcileUntilSettled(c, submit("synapse-node-"+node, request{cn: node, dns: []string{node}})))
		s := &corev1.Secret{}
		Expect(kube.Get(ctx, client.ObjectKey{Namespace: caNamespace, Name: agentcert.CASecret}, s)).To(Succeed())
		old := s.DeepCopy()
		DeferCleanup(func() {
			// The suite's other specs verify against the CA they published first.
			s := &corev1.Secret{}
			Expect(kube.Get(ctx, client.ObjectKey{Namespace: caNamespace, Name: agentcert.CASecret}, s)).To(Succeed())
			s.Data = old.Data
			Expect(kube.Update(ctx, s)).To(Succeed())
			clk.Step(agentcert.CARecheck)
			_, err := c.EnsureCA(ctx) // publishes the first CA's bundle again
			Expect(err).NotTo(HaveOccurred())
		})
		certPEM, keyPEM, err := agentcert.NewCA(clk.Now(), agentcert.CALifetime)
		Expect(err).NotTo(HaveOccurred())
		s.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}
		Expect(kube.Update(ctx, s)).To(Succeed())

		sameCA := leaf(reconcileUntilSettled(c, submit("synapse-node-"+node, request{cn: node, dns: []string{node}})))
		Expect(sameCA.Issuer).To(Equal(before.Issuer), "within CARecheck the CA read last signs")
		Expect(sameCA.AuthorityKeyId).To(Equal(before.AuthorityKeyId))
		clk.Step(agentcert.CARecheck)
		replaced := leaf(reconcileUntilSettled(c, submit("synapse-node-"+node, request{cn: node, dns: []string{node}})))
		Expect(replaced.AuthorityKeyId).NotTo(Equal(before.AuthorityKeyId), "after CARecheck the CA in the Secret signs")
		_, err = replaced.Verify(x509.VerifyOptions{DNSName: node, Roots: trustPool(), CurrentTime: clk.Now()})
		Expect(err).NotTo(HaveOccurred(), "the replaced CA is published in the bundle")
	})

	It("should issue for the lifetime asked, at most a week", func() {
		node := macNode("192.0.2.12")
		short := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}, lifetime: ptr.To(int32(600))}))
		Expect(leaf(short).NotAfter).To(BeTemporally("~", clk.Now().Add(10*time.Minute), time.Second))
		long := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}, lifetime: ptr.To(int32(90 * 24 * 3600))}))
		Expect(leaf(long).NotAfter).To(BeTemporally("~", clk.Now().Add(agentcert.MaxCertLifetime), time.Second))
	})

	DescribeTable("should deny, saying why, a request",
		func(sa func(node string) string, r func(node string) request, why string) {
			node := macNode("192.0.2.20")
			csr := reconcileUntilSettled(newController(), submit(sa(node), r(node)))
			denied := condition(csr, certificatesv1.CertificateDenied)
			Expect(denied).NotTo(BeNil(), "not denied: %+v", csr.Status)
			Expect(denied.Reason).To(Equal(agentcert.ReasonDenied))
			Expect(denied.Message).To(ContainSubstring(why))
			Expect(csr.Status.Certificate).To(BeEmpty())
		},
		Entry("from a node for another node's name", func(n string) string { return "synapse-node-" + n },
			func(string) request { return request{cn: "mac-other", dns: []string{"mac-other"}} }, "the subject must be CN="),
		Entry("from another node for this node's name", func(string) string { return "synapse-node-mac-elsewhere" },
			func(n string) request { return request{cn: n, dns: []string{n}} }, "is not a node identity"),
		Entry("from a ServiceAccount that is no node", func(string) string { return "intruder" },
			func(n string) request { return request{cn: n, dns: []string{n}} }, "is not a node identity"),
		Entry("for an address the node does not report", func(n string) string { return "synapse-node-" + n },
			func(n string) request { return request{cn: n, dns: []string{n}, ips: []string{"10.0.0.1"}} }, "IP address 10.0.0.1 is not one"),
		Entry("for another DNS name", func(n string) string { return "synapse-node-" + n },
			func(n string) request { return request{cn: n, dns: []string{"api.example.com"}} }, "DNS name api.example.com"),
		Entry("for nothing but a Service name it may not hold", func(n string) string { return "synapse-node-" + n },
			func(n string) request { return request{cn: n, dns: []string{"kubernetes.default.svc"}} }, "names neither the node nor an address it may hold"),
		Entry("for client auth", func(n string) string { return "synapse-node-" + n },
			func(n string) request {
				return request{cn: n, dns: []string{n}, usages: []certificatesv1.KeyUsage{certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth}}
			}, `usage "client auth"`),
		Entry("with a weak key", func(n string) string { return "synapse-node-" + n },
			func(n string) request {
				k, err := rsa.GenerateKey(rand.Reader, 1024)
				Expect(err).NotTo(HaveOccurred())
				return request{cn: n, dns: []string{n}, key: k}
			}, "at least 2048 bits"),
	)

	It("should leave other signers' requests alone", func() {
		node := macNode("192.0.2.30")
		name := submit("synapse-node-"+node, request{cn: node, dns: []string{node}})
		csr := &certificatesv1.CertificateSigningRequest{}
		Expect(kube.Get(ctx, client.ObjectKey{Name: name}, csr)).To(Succeed())
		// The same request to the kubelet-serving signer is not this controller's to judge.
		other := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name + "-kubelet"},
			Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: certificatesv1.KubeletServingSignerName, Request: csr.Spec.Request,
				Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}}}
		Expect(kube.Create(ctx, other)).To(Succeed())
		got := reconcileUntilSettled(newController(), other.Name)
		Expect(got.Status.Conditions).To(BeEmpty())
		Expect(got.Status.Certificate).To(BeEmpty())
	})
})
