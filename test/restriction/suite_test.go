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

// Package restriction is the node-restriction suite: real node identities, joined as
// `synapse-agent join` joins a Mac and authenticated by their own TokenRequest tokens, try
// every write an agent needs and every one it must not make, against an API server running
// the RBAC and ValidatingAdmissionPolicies of config/.
package restriction

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/openapi/resolver"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx   = context.Background()
	admin client.Client
	env   *testenv.Env
	_     = testenv.Suite(func(e *testenv.Env) {
		env, admin = e, e.Client
		Expect(e.Install(ctx)).To(Succeed())
		waitForPolicies()
	})
)

func TestRestriction(t *testing.T) { testenv.RunSpecs(t, "Node restriction") }

// waitForPolicies type-checks every policy against the API server's schemas, as the
// kube-controller-manager's policy status controller does (envtest runs none), so that a
// misspelt field fails here rather than at runtime, and waits until the policies are enforced.
func waitForPolicies() {
	GinkgoHelper()
	var list admissionregistrationv1.ValidatingAdmissionPolicyList
	Expect(admin.List(ctx, &list)).To(Succeed())
	Expect(list.Items).To(HaveLen(7))
	dc, err := discovery.NewDiscoveryClientForConfig(env.Config)
	Expect(err).NotTo(HaveOccurred())
	checker := &validating.TypeChecker{SchemaResolver: &resolver.ClientDiscoveryResolver{Discovery: dc},
		RestMapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
	for i := range list.Items {
		Expect(checker.Check(&list.Items[i])).To(BeEmpty(), "policy %s", list.Items[i].Name)
	}
	// The admission plugin loads policies and bindings from its own informers: wait until a
	// write the catch-all policy refuses is refused.
	w := newWorld(true)
	Eventually(func(g Gomega) {
		err := createConfigMap(w)
		g.Expect(err).To(HaveOccurred())
		g.Expect(err.Error()).To(ContainSubstring("rule nothing-else"))
	}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
}
