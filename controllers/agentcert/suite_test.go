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
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/controllers"
	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

const caNamespace = "synapse-system"

var (
	ctx  = context.Background()
	kube client.Client
	// cached reads as the manager's client does, from a cache with the controllers' field
	// indexes; the requests and the trust bundle it reads from the API server, as the specs
	// judge a request at once.
	cached client.Client
	// policy is the address policy the controller certifies IP addresses by: the Macs are in
	// 192.0.2.0/24, whose top sixteen addresses the operator refuses.
	policy = endpoints.AddressPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")},
		Denied: []netip.Prefix{netip.MustParsePrefix("192.0.2.240/28")}}
	env *testenv.Env
	clk = clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	_   = testenv.Suite(func(e *testenv.Env) {
		env, kube = e, e.Client
		for _, ns := range []string{caNamespace, "synapse-nodes"} {
			Expect(kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		}
		// The node identities of this suite may create requests (the agents' own RBAC is
		// issue of the agent side); the requester the API server records is what is judged.
		Expect(kube.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "csr-creator"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: []string{"create", "get"}}}})).To(Succeed())
		Expect(kube.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "csr-creator"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "csr-creator"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "system:serviceaccounts:synapse-nodes"}}})).To(Succeed())
	})
)

var _ = BeforeEach(func() {
	ctx, cancel := context.WithCancel(ctx)
	DeferCleanup(cancel)
	var err error
	cached, err = env.CachedClient(ctx, controllers.IndexFields, &certificatesv1.CertificateSigningRequest{}, &certificatesv1.ClusterTrustBundle{})
	Expect(err).NotTo(HaveOccurred())
})

func TestAgentCert(t *testing.T) { testenv.RunSpecs(t, "Agent serving certificates") }

func newController() *agentcert.Controller {
	return agentcert.NewController(clk, cached, kube, caNamespace, policy)
}

// identity is a ServiceAccount of synapse-nodes named sa, as a client-go clientset.
func identity(sa string) kubernetes.Interface {
	GinkgoHelper()
	err := kube.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "synapse-nodes", Name: sa}})
	Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	cfg, err := env.ServiceAccountConfig(ctx, "synapse-nodes", sa)
	Expect(err).NotTo(HaveOccurred())
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	return cs
}
