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
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

var seq int

// macNode registers a MacNode that reports addresses. The controller certifies no address two
// MacNodes report, and the suite's MacNodes stay: a spec whose request names an address gives
// its node one no other spec's node reports.
func macNode(addresses ...string) string {
	GinkgoHelper()
	seq++
	name := fmt.Sprintf("mac-%d", seq)
	Expect(kube.Create(ctx, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
	var as []v1.NodeAddress
	for _, a := range addresses {
		as = append(as, v1.NodeAddress{Type: "InternalIP", Address: a})
	}
	report(name, as...)
	return name
}

// report makes node report addresses, as its agent does, and waits until the controller's
// cache shows it: the other MacNodes' addresses are judged from there.
func report(node string, addresses ...v1.NodeAddress) {
	GinkgoHelper()
	n := &v1.MacNode{}
	Expect(kube.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
	n.Status.Addresses = addresses
	Expect(kube.Status().Update(ctx, n)).To(Succeed())
	Eventually(func(g Gomega) {
		got := &v1.MacNode{}
		g.Expect(cached.Get(ctx, client.ObjectKey{Name: node}, got)).To(Succeed())
		g.Expect(got.ResourceVersion).To(Equal(n.ResourceVersion))
	}).WithTimeout(10 * time.Second).Should(Succeed())
}

func internalIP(a string) v1.NodeAddress { return v1.NodeAddress{Type: "InternalIP", Address: a} }
func hostname(a string) v1.NodeAddress   { return v1.NodeAddress{Type: "Hostname", Address: a} }

// denied is the request's Denied condition's message, failing if it is not denied, or issued.
func denied(csr *certificatesv1.CertificateSigningRequest) string {
	GinkgoHelper()
	d := condition(csr, certificatesv1.CertificateDenied)
	Expect(d).NotTo(BeNil(), "not denied: %+v", csr.Status)
	Expect(d.Reason).To(Equal(agentcert.ReasonDenied))
	Expect(csr.Status.Certificate).To(BeEmpty())
	return d.Message
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

	It("should also certify the Services of the lanes placed on the node that the request does not name, and say so, so that they need no request of their own", func() {
		node := macNode("192.0.2.22")
		placeOn("gte-asked", node)
		name := submit("synapse-node-"+node, request{cn: node, dns: []string{node, "gte-asked.default.svc"}, ips: []string{"192.0.2.22"}})
		// Placed while the request waits to be judged; a lane placed elsewhere is not the node's.
		placeOn("gte-since", node)
		placeOn("gte-elsewhere", macNode("192.0.2.23"))
		csr := reconcileUntilSettled(newController(), name)
		approved := condition(csr, certificatesv1.CertificateApproved)
		Expect(approved).NotTo(BeNil(), "%+v", csr.Status)
		Expect(approved.Message).To(ContainSubstring("that it does not name (placed since it asked): gte-since.default.svc"))
		cert := leaf(csr)
		Expect(cert.DNSNames).To(ConsistOf(node, "gte-asked.default.svc", "gte-since.default.svc"))
		_, err := cert.Verify(x509.VerifyOptions{DNSName: "gte-since.default.svc", Roots: trustPool(), CurrentTime: clk.Now(),
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		Expect(err).NotTo(HaveOccurred())
	})

	It("should name a few of the lanes it adds in the approval, and count the rest", func() {
		node := macNode("192.0.2.24")
		var want []string
		for i := range 7 {
			lane := fmt.Sprintf("gte-many-%d", i)
			placeOn(lane, node)
			want = append(want, lane+".default.svc")
		}
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{"192.0.2.24"}}))
		approved := condition(csr, certificatesv1.CertificateApproved)
		Expect(approved).NotTo(BeNil(), "%+v", csr.Status)
		Expect(approved.Message).To(HaveSuffix(" and 2 more"))
		Expect(leaf(csr).DNSNames).To(ConsistOf(append(want, node)))
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
		node := macNode("192.0.2.18")
		name := submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{"192.0.2.18"}})
		_, err := newController().Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
		Expect(err).NotTo(HaveOccurred())
		csr := &certificatesv1.CertificateSigningRequest{}
		Expect(kube.Get(ctx, client.ObjectKey{Name: name}, csr)).To(Succeed())
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil())
		Expect(leaf(csr).DNSNames).To(ConsistOf(node))
	})

	It("should sign a request whose approval landed and whose signature failed on a later pass, approved once", func() {
		node := macNode("192.0.2.21")
		name := submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{"192.0.2.21"}})
		left := ptr.To(1)
		failing := agentcert.NewController(clk, statusFailsOnce{Client: cached, left: left}, kube, caNamespace, policy)
		// The first pass that finds the request in the cache approves it, then fails to sign.
		csr := &certificatesv1.CertificateSigningRequest{}
		Eventually(func(g Gomega) {
			_, err := failing.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
			g.Expect(err).To(MatchError(ContainSubstring("the API server is away")))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		Expect(*left).To(BeZero())
		Expect(kube.Get(ctx, client.ObjectKey{Name: name}, csr)).To(Succeed())
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil(), "the approval landed")
		Expect(csr.Status.Certificate).To(BeEmpty())
		// The next passes (the cache may be a moment behind the approval) sign it.
		Eventually(func(g Gomega) {
			_, _ = failing.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: name}})
			g.Expect(kube.Get(ctx, client.ObjectKey{Name: name}, csr)).To(Succeed())
			g.Expect(csr.Status.Certificate).NotTo(BeEmpty())
		}).WithTimeout(10 * time.Second).Should(Succeed())
		approvals := 0
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved {
				approvals++
			}
		}
		Expect(approvals).To(Equal(1))
		Expect(leaf(csr).DNSNames).To(ConsistOf(node))
	})

	It("should sign with a CA replaced in its Secret once CARecheck has passed, not before", func() {
		c := newController()
		node := macNode("192.0.2.19")
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
		Entry("for its own name in capitals, which a client takes for its own", func(n string) string { return "synapse-node-" + n },
			func(n string) request { return request{cn: n, dns: []string{strings.ToUpper(n)}} }, "is not a host name in lower case"),
		Entry("for a wildcard", func(n string) string { return "synapse-node-" + n },
			func(n string) request { return request{cn: n, dns: []string{n, "*.example"}} }, "DNS name *.example is not a host name in lower case without a trailing dot or a wildcard"),
		Entry("for an IP address written as a DNS name", func(n string) string { return "synapse-node-" + n },
			func(n string) request { return request{cn: n, dns: []string{"192.0.2.20"}} }, "an IP address is asked for as one"),
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

var _ = Describe("Agent serving certificates for names and addresses the rest of the fleet holds", func() {
	It("should deny a node an IP address another MacNode reports, naming that MacNode", func() {
		owner := macNode("192.0.2.41")
		thief := macNode("192.0.2.42")
		report(thief, internalIP("192.0.2.42"), internalIP("192.0.2.41"))
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+thief, request{cn: thief, dns: []string{thief}, ips: []string{"192.0.2.42", "192.0.2.41"}}))
		Expect(denied(csr)).To(Equal("IP address 192.0.2.41 is also reported by MacNode " + owner +
			": no node is certified for an address or host name another reports, until only one reports it"))
		// The same address, written as an IPv4-mapped IPv6 address, is the same to a client.
		report(thief, internalIP("192.0.2.42"), internalIP("::ffff:192.0.2.41"))
		csr = reconcileUntilSettled(newController(), submit("synapse-node-"+thief, request{cn: thief, dns: []string{thief}, ips: []string{"::ffff:192.0.2.41"}}))
		Expect(denied(csr)).To(ContainSubstring("IP address 192.0.2.41 is also reported by MacNode " + owner))
	})

	It("should deny a node another MacNode's name, and leave that MacNode its own name", func() {
		owner := macNode("192.0.2.43")
		thief := macNode("192.0.2.44")
		report(thief, internalIP("192.0.2.44"), hostname(owner))
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+thief, request{cn: thief, dns: []string{thief, owner}}))
		Expect(denied(csr)).To(Equal("DNS name " + owner + " is MacNode " + owner + "'s own name, which only that node is certified for"))
		// Its own name is the owner's whoever else reports it.
		csr = reconcileUntilSettled(newController(), submit("synapse-node-"+owner, request{cn: owner, dns: []string{owner}, ips: []string{"192.0.2.43"}}))
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil(), "%+v", csr.Status)
		Expect(leaf(csr).DNSNames).To(Equal([]string{owner}))
	})

	It("should deny a node a host name another MacNode reports, however it is spelt", func() {
		owner := macNode("192.0.2.45")
		report(owner, internalIP("192.0.2.45"), hostname("Studio-7.Example."))
		thief := macNode("192.0.2.46")
		report(thief, internalIP("192.0.2.46"), hostname("studio-7.example"))
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+thief, request{cn: thief, dns: []string{thief, "studio-7.example"}}))
		Expect(denied(csr)).To(Equal("DNS name studio-7.example is also reported by MacNode " + owner +
			": no node is certified for an address or host name another reports, until only one reports it"))
	})

	It("should deny both nodes an IP address both report, until one stops reporting it", func() {
		a, b := macNode("192.0.2.47"), macNode("192.0.2.47")
		for node, other := range map[string]string{a: b, b: a} {
			csr := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{"192.0.2.47"}}))
			Expect(denied(csr)).To(HavePrefix("IP address 192.0.2.47 is also reported by MacNode "+other+":"), node)
		}
		// The names only the node can have are still its own.
		csr := reconcileUntilSettled(newController(), submit("synapse-node-"+a, request{cn: a, dns: []string{a}}))
		Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil(), "%+v", csr.Status)

		report(a, internalIP("192.0.2.48"))
		for node, ip := range map[string]string{a: "192.0.2.48", b: "192.0.2.47"} {
			csr := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{ip}}))
			Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil(), "%s: %+v", node, csr.Status)
			Expect(leaf(csr).IPAddresses).To(HaveLen(1))
			Expect(leaf(csr).IPAddresses[0].String()).To(Equal(ip))
		}
	})

	It("should certify a lane's Service name to every node the lane is placed on: the controllers place it, not the nodes", func() {
		a, b := macNode("192.0.2.49"), macNode("192.0.2.50")
		for _, node := range []string{a, b} {
			placeOn("gte-shared", node)
		}
		for node, ip := range map[string]string{a: "192.0.2.49", b: "192.0.2.50"} {
			csr := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node, "gte-shared.default.svc"}, ips: []string{ip}}))
			Expect(condition(csr, certificatesv1.CertificateApproved)).NotTo(BeNil(), "%s: %+v", node, csr.Status)
			Expect(leaf(csr).DNSNames).To(Equal([]string{node, "gte-shared.default.svc"}))
		}
	})

	DescribeTable("should deny an IP address the cluster does not publish for a Mac, as the address controller's AddressAllowed condition says",
		func(address, why string) {
			node := macNode(address)
			csr := reconcileUntilSettled(newController(), submit("synapse-node-"+node, request{cn: node, dns: []string{node}, ips: []string{address}}))
			msg := denied(csr)
			Expect(msg).To(HavePrefix("IP address " + address + " is not one the controller publishes for a Mac, so it is not certified: "))
			Expect(msg).To(ContainSubstring(why))

			// The address controller, under the same policy, refuses it for the same reason.
			_, err := endpoints.NewAddressController(clk, kube, policy).Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKey{Name: node}})
			Expect(err).NotTo(HaveOccurred())
			n := &v1.MacNode{}
			Expect(kube.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
			allowed := meta.FindStatusCondition(n.Status.Conditions, v1.NodeConditionAddressAllowed)
			Expect(allowed).NotTo(BeNil())
			Expect(allowed.Status).To(Equal(metav1.ConditionFalse))
			Expect(allowed.Message).To(ContainSubstring(strings.TrimPrefix(msg, "IP address "+address+" is not one the controller publishes for a Mac, so it is not certified: ")))
		},
		Entry("outside the allowed CIDRs", "198.51.100.7", "it is outside the allowed CIDRs 192.0.2.0/24"),
		Entry("inside a range the operator denies", "192.0.2.250", "it is inside 192.0.2.240/28"),
		Entry("a loopback address", "127.0.0.1", "a loopback"),
	)
})

// statusFailsOnce is a client whose next left status updates fail as an API server away would.
type statusFailsOnce struct {
	client.Client
	left *int
}

func (c statusFailsOnce) SubResource(name string) client.SubResourceClient {
	sc := c.Client.SubResource(name)
	if name != "status" {
		return sc
	}
	return failingSubResource{SubResourceClient: sc, left: c.left}
}

type failingSubResource struct {
	client.SubResourceClient
	left *int
}

func (s failingSubResource) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	if *s.left > 0 {
		*s.left--
		return errors.New("the API server is away")
	}
	return s.SubResourceClient.Update(ctx, obj, opts...)
}
