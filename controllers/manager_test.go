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

package controllers_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers"
	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

func TestManager(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller manager")
}

var (
	te     *testenv.Env
	kube   client.Client
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
)

// The manager runs as the controller's ServiceAccount under the RBAC of config/ (the chart's),
// with the cache scoped as main.go scopes it, so a permission the code needs and the shipped
// RBAC lacks fails here.
var _ = BeforeSuite(func() {
	var err error
	te, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	kube = te.Client
	ctx, cancel = context.WithCancel(context.Background())
	Expect(te.Install(ctx)).To(Succeed())
	asController, err := te.ServiceAccountConfig(ctx, "synapse-system", "synapse-controller")
	Expect(err).NotTo(HaveOccurred())

	mgr, err := ctrl.NewManager(asController, ctrl.Options{
		Scheme:                  te.Scheme,
		Cache:                   controllers.CacheOptions(),
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		LeaderElection:          true,
		LeaderElectionID:        "synapse-controller.fleet.synapse.dev",
		LeaderElectionNamespace: "synapse-system",
	})
	Expect(err).NotTo(HaveOccurred())
	opts := controllers.Options{Addresses: endpoints.AddressPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
		Namespace: "synapse-system", Reader: mgr.GetAPIReader()}
	Expect(controllers.IndexFields(ctx, mgr.GetFieldIndexer())).To(Succeed())
	for _, c := range controllers.NewControllers(clock.RealClock{}, mgr.GetClient(), mgr.GetEventRecorder("synapse-controller"), opts) {
		Expect(c.Register(ctx, mgr)).To(Succeed())
	}
	done = make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(done)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	cancel()
	<-done
	Expect(te.Stop()).To(Succeed())
})

// fakeAgent registers a MacNode and heartbeats its Lease, as a node agent does.
func fakeAgent(name string, digest v1.Sha256Digest, ip string) {
	GinkgoHelper()
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(kube.Create(ctx, n)).To(Succeed())
	stored := n.DeepCopy()
	n.Status = v1.MacNodeStatus{Platform: v1.Platform{Chip: "M4", MacOSBuild: "25B78"},
		Worker:      v1.NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Capacity:    v1.ExecutableBudget{LayerExecutables: 100},
		Addresses:   []v1.NodeAddress{{Type: "InternalIP", Address: ip}},
		ServingPort: 8080,
		Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed,
			LastTransitionTime: metav1.Now()}}}
	// A merge patch, as the agent writes: the controller writes the node's status too.
	Expect(kube.Status().Patch(ctx, n, client.MergeFrom(stored))).To(Succeed())
	Expect(kube.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lifecycle.LeaseNamespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(name), RenewTime: ptr.To(metav1.NowMicro())}})).To(Succeed())
}

var _ = Describe("The manager", func() {
	It("should take the leader lease and place a lane end to end with agents that report Ready", func() {
		Eventually(func(g Gomega) {
			lease := &coordinationv1.Lease{}
			g.Expect(kube.Get(ctx, client.ObjectKey{Namespace: "synapse-system", Name: "synapse-controller.fleet.synapse.dev"}, lease)).To(Succeed())
			g.Expect(lease.Spec.HolderIdentity).NotTo(BeNil())
		}).WithTimeout(30 * time.Second).Should(Succeed())

		digest := v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 7))
		Expect(kube.Create(ctx, &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "gte"}, Spec: v1.CertifiedIdentitySpec{
			Worker:           v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
			Model:            v1.ModelIdentity{Name: "gte", Revision: "r", Layers: 22, HiddenSize: 768, EmbeddingDimensions: 768, CheckpointDigest: digest},
			ConversionPolicy: v1.ConversionPolicy{Name: "p", Digest: digest}, MacOSBuild: "25B78", VectorSpaceID: "gte"}})).To(Succeed())
		fakeAgent("mac-a", digest, "192.0.2.1")
		fakeAgent("mac-b", digest, "192.0.2.2")
		lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "gte-search", Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
				Rungs: []v1.Rung{128, 256}, Replicas: 2, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, lane)).To(Succeed())

		Eventually(func(g Gomega) {
			got := &v1.CatalogLane{}
			g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.LaneConditionPlaced)).To(BeTrue())
			g.Expect(got.Status.Nodes).To(Equal([]string{"mac-a", "mac-b"}))
		}).WithTimeout(30 * time.Second).Should(Succeed())

		// The agents report their placements Ready: the lane's endpoints follow.
		var ps v1.LanePlacementList
		Expect(kube.List(ctx, &ps, client.MatchingLabels{v1.LabelLane: lane.Name})).To(Succeed())
		for i := range ps.Items {
			ps.Items[i].Status.Phase = v1.PhaseReady
			Expect(kube.Status().Update(ctx, &ps.Items[i])).To(Succeed())
		}
		Eventually(func(g Gomega) {
			var slices discoveryv1.EndpointSliceList
			g.Expect(kube.List(ctx, &slices, client.MatchingLabels{discoveryv1.LabelServiceName: lane.Name})).To(Succeed())
			g.Expect(slices.Items).To(HaveLen(1))
			g.Expect(slices.Items[0].Endpoints).To(HaveLen(2))
			got := &v1.CatalogLane{}
			g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
			g.Expect(got.Status.ReadyReplicas).To(BeEquivalentTo(2))
		}).WithTimeout(30 * time.Second).Should(Succeed())
	})
})

var _ = Describe("Agent serving certificates", func() {
	It("should publish the fleet CA and sign a joined Mac's request for its own name, under the shipped RBAC and policies", func() {
		fakeAgent("mac-tls", v1.Sha256Digest("sha256:"+strings.Repeat("c", 64)), "192.0.2.77")
		admin, err := kubernetes.NewForConfig(te.Config)
		Expect(err).NotTo(HaveOccurred())
		joined, err := nodeidentity.Join(ctx, admin, nodeidentity.JoinOptions{Node: "mac-tls", Server: te.Config.Host, CAData: te.Config.CAData,
			Lifetime: time.Hour, Dir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		cfg, err := clientcmd.BuildConfigFromFlags("", joined.Kubeconfig)
		Expect(err).NotTo(HaveOccurred())
		asMac, err := kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())

		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		Expect(err).NotTo(HaveOccurred())
		der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "mac-tls"},
			DNSNames: []string{"mac-tls"}, IPAddresses: []net.IP{net.ParseIP("192.0.2.77")}}, key)
		Expect(err).NotTo(HaveOccurred())
		_, err = asMac.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "mac-tls-serving"},
			Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: agentcert.SignerName, Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
				Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())

		var issued []byte
		Eventually(func(g Gomega) {
			csr, err := asMac.CertificatesV1().CertificateSigningRequests().Get(ctx, "mac-tls-serving", metav1.GetOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(csr.Status.Certificate).NotTo(BeEmpty(), "conditions %+v", csr.Status.Conditions)
			issued = csr.Status.Certificate
		}).WithTimeout(30 * time.Second).Should(Succeed())
		ctb := &certificatesv1.ClusterTrustBundle{}
		Expect(kube.Get(ctx, client.ObjectKey{Name: agentcert.TrustBundle}, ctb)).To(Succeed())
		pool := x509.NewCertPool()
		Expect(pool.AppendCertsFromPEM([]byte(ctb.Spec.TrustBundle))).To(BeTrue())
		block, _ := pem.Decode(issued)
		cert, err := x509.ParseCertificate(block.Bytes)
		Expect(err).NotTo(HaveOccurred())
		_, err = cert.Verify(x509.VerifyOptions{DNSName: "192.0.2.77", Roots: pool})
		Expect(err).NotTo(HaveOccurred())
	})
})
