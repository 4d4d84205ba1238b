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

package servingcert_test

import (
	"context"
	"crypto/x509"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/node-agent/servingcert"
)

// obtain runs an Auto source of the node until the spec ends, and waits for its first
// certificate.
func obtain(cfg servingcert.Config) *servingcert.Auto {
	GinkgoHelper()
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	cfg.Log = GinkgoLogr
	s, err := servingcert.New(cfg)
	Expect(err).NotTo(HaveOccurred())
	ctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	Expect(s.Obtain(ctx, func() bool { return true })).To(Succeed())
	return s
}

// placeOn places lane on node.
func placeOn(lane types.NamespacedName, node string) {
	GinkgoHelper()
	p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: lane.Name + "-" + node, Namespace: lane.Namespace,
		Labels: map[string]string{v1.LabelLane: lane.Name, v1.LabelNode: node}},
		Spec: v1.LanePlacementSpec{Lane: lane.Name, Node: node, Identity: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	Expect(admin.Create(ctx, p)).To(Succeed())
}

// requestsOf lists the requests node's identity made.
func requestsOf(node string) []certificatesv1.CertificateSigningRequest {
	GinkgoHelper()
	list, err := adminCS.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	Expect(err).NotTo(HaveOccurred())
	var out []certificatesv1.CertificateSigningRequest
	for _, csr := range list.Items {
		if csr.Spec.Username == agentcert.NodeUserPrefix+node {
			out = append(out, csr)
		}
	}
	return out
}

var _ = Describe("An agent's serving certificate", func() {
	It("should be issued by the fleet's signer for the node's name and address, and chain to the published bundle", func() {
		name, identity := node("192.0.2.10")
		ctl := newController()
		judge(func(csr *certificatesv1.CertificateSigningRequest) {
			defer GinkgoRecover()
			_, err := ctl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(csr)})
			Expect(err).NotTo(HaveOccurred())
		})
		s := obtain(servingcert.Config{Node: name, Addresses: []string{"192.0.2.10"}, Client: identity})
		addr := serveTLS(s)

		// As a client does: the CA bundle from the ClusterTrustBundle, the node's name expected.
		ctb := &certificatesv1.ClusterTrustBundle{}
		Expect(admin.Get(ctx, client.ObjectKey{Name: agentcert.TrustBundle}, ctb)).To(Succeed())
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM([]byte(ctb.Spec.TrustBundle))).To(BeTrue())
		cert, err := served(addr, name, pool)
		Expect(err).NotTo(HaveOccurred())
		Expect(cert.Subject.CommonName).To(Equal(name))
		Expect(cert.DNSNames).To(Equal([]string{name}))
		Expect(cert.IPAddresses).To(HaveLen(1))
		Expect(cert.IPAddresses[0].String()).To(Equal("192.0.2.10"))
		// Another node's name is not this certificate's.
		_, err = served(addr, "mac-elsewhere", pool)
		Expect(err).To(MatchError(ContainSubstring("certificate is valid for " + name)))
		// One request, approved by the controller.
		reqs := requestsOf(name)
		Expect(reqs).To(HaveLen(1))
		Expect(reqs[0].Status.Conditions[0].Reason).To(Equal(agentcert.ReasonApproved))
	})

	It("should name the Services of the lanes placed on the node in a new certificate at once, and not those of lanes placed elsewhere", func() {
		name, identity := node("192.0.2.15")
		ctl := newController()
		judge(func(csr *certificatesv1.CertificateSigningRequest) {
			defer GinkgoRecover()
			_, err := ctl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(csr)})
			Expect(err).NotTo(HaveOccurred())
		})
		issued := make(chan struct{}, 8)
		s := obtain(servingcert.Config{Node: name, Addresses: []string{"192.0.2.15"}, Client: identity})
		s.OnIssued(func() { issued <- struct{}{} })
		search := types.NamespacedName{Namespace: "default", Name: "gte-search"}
		Expect(s.NamesLane(search)).To(BeFalse())

		// The lane is placed on the node: the agent says so, and the next certificate names it.
		placeOn(search, name)
		s.ServeLanes([]types.NamespacedName{search})
		Eventually(issued).WithTimeout(30 * time.Second).Should(Receive())
		Eventually(func() bool { return s.NamesLane(search) }).WithTimeout(30 * time.Second).Should(BeTrue())
		addr := serveTLS(s)
		ctb := &certificatesv1.ClusterTrustBundle{}
		Expect(admin.Get(ctx, client.ObjectKey{Name: agentcert.TrustBundle}, ctb)).To(Succeed())
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM([]byte(ctb.Spec.TrustBundle))).To(BeTrue())
		for _, host := range []string{name, "gte-search.default.svc"} {
			_, err := served(addr, host, pool)
			Expect(err).NotTo(HaveOccurred(), "a client calling %s", host)
		}

		// A lane placed on another node: the signer leaves its name out, and the node keeps its
		// own names and its other lane's.
		other := types.NamespacedName{Namespace: "default", Name: "gte-other"}
		placeOn(other, "mac-elsewhere")
		before := len(requestsOf(name))
		s.ServeLanes([]types.NamespacedName{search, other})
		Eventually(func() int { return len(requestsOf(name)) }).WithTimeout(30 * time.Second).Should(BeNumerically(">", before))
		Eventually(issued).WithTimeout(30 * time.Second).Should(Receive())
		Eventually(func() []string {
			var approvals []string
			for _, r := range requestsOf(name) {
				for _, c := range r.Status.Conditions {
					if c.Type == certificatesv1.CertificateApproved {
						approvals = append(approvals, c.Message)
					}
				}
			}
			return approvals
		}).WithTimeout(30 * time.Second).Should(ContainElement(ContainSubstring("left out of the certificate, as no lane placed on the node holds them")))
		_, err := served(addr, "gte-other.default.svc", pool)
		Expect(err).To(MatchError(ContainSubstring("certificate is valid for")))
		_, err = served(addr, "gte-search.default.svc", pool)
		Expect(err).NotTo(HaveOccurred())
		// The refused name is not asked for again at once: the manager, whose template no
		// longer holds it, is satisfied (it asked every second while the template held it).
		Eventually(func() bool { return s.NamesLane(other) }).WithTimeout(10*time.Second).Should(BeTrue(),
			"a refused name holds no placement back: the lane has no Service of its own here")
		// (One more request may follow, for the template without the refused name, which the
		// manager had queued; not one a second.)
		asked := len(requestsOf(name))
		Consistently(func() int { return len(requestsOf(name)) }).WithTimeout(4 * time.Second).WithPolling(500 * time.Millisecond).Should(BeNumerically("<=", asked+1))
		Expect(s.NamesLane(search)).To(BeTrue())
	})

	It("should hold its request while lanes are placed, and get one certificate naming them all; a request held past MaxHold is asked again", func() {
		name, identity := node("192.0.2.16")
		ctl := newController()
		var held atomic.Bool // while set, the signer judges nothing (its queue is long)
		judge(func(csr *certificatesv1.CertificateSigningRequest) {
			defer GinkgoRecover()
			if held.Load() {
				return
			}
			_, err := ctl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(csr)})
			Expect(err).NotTo(HaveOccurred())
		})
		clk := clocktesting.NewFakeClock(time.Now())
		s := obtain(servingcert.Config{Node: name, Addresses: []string{"192.0.2.16"}, Client: identity, Clock: clk})
		Expect(requestsOf(name)).To(HaveLen(1))

		held.Store(true)
		lanes := []types.NamespacedName{{Namespace: "default", Name: "gte-a"}, {Namespace: "default", Name: "gte-b"}, {Namespace: "default", Name: "gte-c"}}
		placeOn(lanes[0], name)
		s.ServeLanes(lanes[:1])
		Eventually(func() int { return len(requestsOf(name)) }).WithTimeout(30 * time.Second).Should(Equal(2))
		// The Mac learns of two more lanes while its request waits: it keeps its request (the
		// manager, handed a new template, would abandon it within a few seconds and ask again).
		placeOn(lanes[1], name)
		s.ServeLanes(lanes[:2])
		placeOn(lanes[2], name)
		s.ServeLanes(lanes)
		Consistently(func() int { return len(requestsOf(name)) }).WithTimeout(5 * time.Second).WithPolling(250 * time.Millisecond).Should(Equal(2))

		// Judged, the request is signed for every lane placed on the node by then.
		held.Store(false)
		Eventually(func() bool {
			return s.NamesLane(lanes[0]) && s.NamesLane(lanes[1]) && s.NamesLane(lanes[2])
		}).WithTimeout(30 * time.Second).Should(BeTrue())
		Consistently(func() int { return len(requestsOf(name)) }).WithTimeout(3*time.Second).WithPolling(250*time.Millisecond).Should(Equal(2),
			"the certificate names every lane the Mac knows of: nothing more to ask")
		// The answered request's template is let go of a few seconds later (a rotation asks
		// with the lanes placed then), and the certificate still satisfies the manager.
		clk.Step(10 * time.Second)
		Consistently(func() int { return len(requestsOf(name)) }).WithTimeout(3*time.Second).WithPolling(250*time.Millisecond).Should(Equal(2),
			"nothing to ask once the hold is let go of")

		// A request the signer leaves unjudged holds a newer template back for MaxHold only.
		held.Store(true)
		fourth := types.NamespacedName{Namespace: "default", Name: "gte-d"}
		placeOn(fourth, name)
		s.ServeLanes(append(slices.Clone(lanes), fourth))
		Eventually(func() int { return len(requestsOf(name)) }).WithTimeout(30 * time.Second).Should(Equal(3))
		fifth := types.NamespacedName{Namespace: "default", Name: "gte-e"}
		placeOn(fifth, name)
		all := append(slices.Clone(lanes), fourth, fifth)
		s.ServeLanes(all)
		Consistently(func() int { return len(requestsOf(name)) }).WithTimeout(3 * time.Second).WithPolling(250 * time.Millisecond).Should(Equal(3))
		clk.Step(servingcert.MaxHold)
		Eventually(func() int { return len(requestsOf(name)) }).WithTimeout(30 * time.Second).Should(Equal(4))
		held.Store(false)
		Eventually(func() bool { return s.NamesLane(fifth) }).WithTimeout(30 * time.Second).Should(BeTrue())
	})

	It("should rotate before expiry, new connections getting the new certificate on the same listener", func() {
		name, identity := node("192.0.2.11")
		ca := testCA()
		// Certificates of 10 s: client-go's manager asks for the next one at 70 to 90% of that.
		judge(shortLivedSigner(ca, 10*time.Second))
		s := obtain(servingcert.Config{Node: name, Addresses: []string{"192.0.2.11"}, Client: identity})
		addr := serveTLS(s)
		pool := x509.NewCertPool()
		pool.AddCert(ca.Cert)
		first, err := served(addr, name, pool)
		Expect(err).NotTo(HaveOccurred())

		// The listener, never restarted, hands new connections the next certificate, which a
		// client verifies as it did the first, and which was issued before the first expired.
		var second *x509.Certificate
		Eventually(func(g Gomega) {
			var err error
			second, err = served(addr, name, pool)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(second.SerialNumber).NotTo(Equal(first.SerialNumber))
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		Expect(second.DNSNames).To(Equal([]string{name}))
		Expect(second.NotBefore).To(BeTemporally("<", first.NotAfter), "rotated only after the first expired")
		Expect(second.PublicKey).NotTo(Equal(first.PublicKey), "a rotation brings a new key")
		Expect(len(requestsOf(name))).To(BeNumerically(">=", 2))
	})

	It("should serve the certificate it kept after a restart, without a new request", func() {
		name, identity := node("192.0.2.12")
		ca := testCA()
		judge(shortLivedSigner(ca, time.Hour))
		dir := GinkgoT().TempDir()
		first := obtain(servingcert.Config{Node: name, Addresses: []string{"192.0.2.12"}, Client: identity, Dir: dir})
		before, err := first.GetCertificate(nil)
		Expect(err).NotTo(HaveOccurred())

		// The agent starts again: its MacNode does not report its address yet, so it could ask
		// for nothing; it serves the stored certificate at once.
		again, err := servingcert.New(servingcert.Config{Node: name, Addresses: []string{"192.0.2.12"}, Client: identity, Dir: dir,
			Clock: clock.RealClock{}, Log: GinkgoLogr})
		Expect(err).NotTo(HaveOccurred())
		ctx, cancel := context.WithCancel(ctx)
		DeferCleanup(cancel)
		Expect(again.Obtain(ctx, func() bool { return false })).To(Succeed())
		after, err := again.GetCertificate(nil)
		Expect(err).NotTo(HaveOccurred())
		Expect(after.Leaf.SerialNumber).To(Equal(before.Leaf.SerialNumber))
		Expect(requestsOf(name)).To(HaveLen(1))
	})

	DescribeTable("should give up after the wait timeout, or MaxPendingWait while its request waits for its answer, saying what became of its request",
		func(reported bool, answer certificatesv1.RequestConditionType, want string) {
			name, identity := node("192.0.2.13")
			if answer != "" {
				judge(func(csr *certificatesv1.CertificateSigningRequest) {
					cond := certificatesv1.CertificateSigningRequestCondition{Type: answer, Status: corev1.ConditionTrue, Reason: "AgentServingApproved",
						Message: "approved; the signature is written on a later pass", LastUpdateTime: metav1.Now()}
					if answer == certificatesv1.CertificateDenied {
						cond.Reason, cond.Message = "AgentServingDenied", "IP address 192.0.2.13 is not one node reports"
					}
					csr.Status.Conditions = append(csr.Status.Conditions, cond)
					_, _ = adminCS.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
				})
			}
			clk := clocktesting.NewFakeClock(time.Now())
			s, err := servingcert.New(servingcert.Config{Node: name, Addresses: []string{"192.0.2.13"}, Client: identity, Clock: clk,
				WaitTimeout: time.Minute, Log: GinkgoLogr})
			Expect(err).NotTo(HaveOccurred())
			ctx, cancel := context.WithCancel(ctx)
			DeferCleanup(cancel)
			done := make(chan error, 1)
			go func() { done <- s.Obtain(ctx, func() bool { return reported }) }()

			Eventually(clk.HasWaiters).Should(BeTrue())
			if reported {
				// The request is made, and judged if anything judges it, before the time is up.
				Eventually(func(g Gomega) {
					reqs := requestsOf(name)
					g.Expect(reqs).NotTo(BeEmpty())
					var got []certificatesv1.RequestConditionType
					for _, c := range reqs[len(reqs)-1].Status.Conditions {
						got = append(got, c.Type)
					}
					if answer == "" {
						g.Expect(got).To(BeEmpty())
					} else {
						g.Expect(got).To(ContainElement(answer))
					}
				}).Should(Succeed())
			}
			Consistently(done).WithTimeout(200 * time.Millisecond).ShouldNot(Receive())
			clk.Step(time.Minute)
			within := "1m0s"
			if waits := reported && answer != certificatesv1.CertificateDenied; waits {
				// A request waiting for its answer is waited on, minute after minute, not given up
				// for another at the back of the signer's queue; at MaxPendingWait it is.
				for waited := time.Minute; waited < servingcert.MaxPendingWait; waited += time.Minute {
					Eventually(clk.Waiters).Should(Equal(2), "the deadline set again, and the progress ticker")
					Expect(done).NotTo(Receive())
					clk.Step(time.Minute)
				}
				Expect(requestsOf(name)).To(HaveLen(1), "nothing new asked")
				within = servingcert.MaxPendingWait.String()
			}
			var got error
			Eventually(done).Should(Receive(&got))
			var notIssued *servingcert.NotIssuedError
			Expect(errors.As(got, &notIssued)).To(BeTrue(), "%v", got)
			Expect(got.Error()).To(ContainSubstring("no serving certificate from signer fleet.synapse.dev/agent-serving within " + within))
			Expect(got.Error()).To(ContainSubstring(want))
			_, err = s.GetCertificate(nil)
			Expect(err).To(HaveOccurred())
		},
		Entry("nothing requested while the MacNode does not report the address", false, certificatesv1.RequestConditionType(""), "does not report its address yet"),
		Entry("a request nothing judges", true, certificatesv1.RequestConditionType(""), "is pending: nothing has judged it"),
		Entry("a request approved and not signed", true, certificatesv1.CertificateApproved, "is approved but not signed yet"),
		Entry("a denied request", true, certificatesv1.CertificateDenied, "was denied (AgentServingDenied): IP address 192.0.2.13 is not one node reports"),
	)
})
