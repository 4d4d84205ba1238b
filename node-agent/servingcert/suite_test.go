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
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers"
	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/node-agent/servingcert"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx   = context.Background()
	admin client.Client
	// adminCS is the administrator's clientset: the suite's signers approve and sign with it.
	adminCS kubernetes.Interface
	env     *testenv.Env
	_       = testenv.Suite(func(e *testenv.Env) {
		env, admin = e, e.Client
		// The agents' RBAC and node-restriction policies, as a cluster has them.
		Expect(e.Install(ctx)).To(Succeed())
		var err error
		adminCS, err = kubernetes.NewForConfig(e.Config)
		Expect(err).NotTo(HaveOccurred())
	})
)

func TestServingCert(t *testing.T) {
	// Before anything in the process logs through controller-runtime: once its root logger has
	// been used 30 s after start with none set, it is filled with a null sink for good, and a
	// later SetLogger is ignored (kubernetes-sigs/controller-runtime, pkg/log/log.go:
	// eventuallyFulfillRoot; pkg/log/deleg.go: Fulfill). A control plane slow to start made the
	// specs that read certwatcher's errors find none.
	recordRuntimeLog()
	testenv.RunSpecs(t, "Agent serving certificates")
}

// newController is the fleet's approver and signer, as synapse-controller runs it: reading from
// a cache with the controllers' field indexes (but the requests, which the suite's signers
// judge as soon as they are made), and certifying the Macs' addresses, in 192.0.2.0/24.
func newController() *agentcert.Controller {
	GinkgoHelper()
	ctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	cached, err := env.CachedClient(ctx, controllers.IndexFields, &certificatesv1.CertificateSigningRequest{}, &certificatesv1.ClusterTrustBundle{})
	Expect(err).NotTo(HaveOccurred())
	return agentcert.NewController(clock.RealClock{}, cached, admin, "default",
		endpoints.AddressPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}})
}

var seq int

// node registers a MacNode reporting address, and returns its name and its identity: the
// ServiceAccount synapse-nodes/synapse-node-<node>, as `synapse-agent join` creates it.
// The controller certifies no address two MacNodes report: a spec whose node's request it
// judges gives it an address of its own.
func node(address string) (string, kubernetes.Interface) {
	GinkgoHelper()
	seq++
	name := fmt.Sprintf("mac-%d", seq)
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(admin.Create(ctx, n)).To(Succeed())
	n.Status.Addresses = []v1.NodeAddress{{Type: "InternalIP", Address: address}}
	Expect(admin.Status().Update(ctx, n)).To(Succeed())
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "synapse-nodes", Name: "synapse-node-" + name}}
	Expect(admin.Create(ctx, sa)).To(Succeed())
	cfg, err := env.ServiceAccountConfig(ctx, "synapse-nodes", sa.Name)
	Expect(err).NotTo(HaveOccurred())
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	return name, cs
}

// judge runs handle on every request of the fleet's signer that is not settled (signed, denied
// or failed) until the spec ends, as an approver and signer would.
func judge(handle func(*certificatesv1.CertificateSigningRequest)) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	DeferCleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		_ = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			list, err := adminCS.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, nil // the spec is ending
			}
			for i := range list.Items {
				csr := &list.Items[i]
				if csr.Spec.SignerName == servingcert.SignerName && len(csr.Status.Certificate) == 0 && !settled(csr) {
					handle(csr)
				}
			}
			return false, nil
		})
	}()
}

func approved(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved {
			return true
		}
	}
	return false
}

func settled(csr *certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
			return true
		}
	}
	return false
}

// shortLivedSigner approves every request and signs it with ca for lifetime from now (no
// back-dating, so client-go's manager rotates it within the spec).
func shortLivedSigner(ca *agentcert.CA, lifetime time.Duration) func(*certificatesv1.CertificateSigningRequest) {
	return func(csr *certificatesv1.CertificateSigningRequest) {
		defer GinkgoRecover()
		if !approved(csr) {
			csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved,
				Status: corev1.ConditionTrue, Reason: "Test", LastUpdateTime: metav1.Now()})
			var err error
			if csr, err = adminCS.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
				return // judged again on the next pass
			}
		}
		block, _ := pem.Decode(csr.Spec.Request)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		Expect(err).NotTo(HaveOccurred())
		serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
		Expect(err).NotTo(HaveOccurred())
		now := time.Now()
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: serial, Subject: req.Subject, DNSNames: req.DNSNames,
			IPAddresses: req.IPAddresses, NotBefore: now, NotAfter: now.Add(lifetime), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca.Cert, req.PublicKey, ca.Key)
		Expect(err).NotTo(HaveOccurred())
		csr.Status.Certificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		// A conflict leaves it approved and unsigned: the next pass signs it.
		_, _ = adminCS.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{})
	}
}

// testCA is a fleet CA of the suite's own.
func testCA() *agentcert.CA {
	GinkgoHelper()
	certPEM, keyPEM, err := agentcert.NewCA(time.Now(), time.Hour)
	Expect(err).NotTo(HaveOccurred())
	ca, err := agentcert.ParseCA(certPEM, keyPEM)
	Expect(err).NotTo(HaveOccurred())
	return ca
}

// serveTLS serves source's certificate on a loopback listener, once, for the whole spec.
func serveTLS(source interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}) string {
	GinkgoHelper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }),
		TLSConfig: &tls.Config{GetCertificate: source.GetCertificate}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	DeferCleanup(srv.Close)
	return ln.Addr().String()
}

// served is the certificate a TLS client that trusts pool and expects serverName gets at addr.
func served(addr, serverName string, pool *x509.CertPool) (*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: pool, ServerName: serverName})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}
