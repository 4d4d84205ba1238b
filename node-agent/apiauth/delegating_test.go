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

package apiauth_test

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
)

var seq int

// caller is a ServiceAccount of its own namespace that may call lane-a's embeddings (a Role
// with resourceNames, as a platform team grants a lane) and nothing else.
type caller struct {
	namespace, name string
}

func newCaller() caller {
	GinkgoHelper()
	seq++
	c := caller{namespace: fmt.Sprintf("team-%d", seq), name: "app"}
	_, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.namespace}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	_, err = admin.CoreV1().ServiceAccounts(c.namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: c.name}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	c.grant("lane-a")
	return c
}

func (c caller) username() string { return "system:serviceaccount:" + c.namespace + ":" + c.name }

// grant lets the caller call lane's embeddings: a Role and RoleBinding named for the lane.
func (c caller) grant(lane string) {
	GinkgoHelper()
	_, err := admin.RbacV1().Roles(c.namespace).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: lane},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{v1.GroupVersion.Group}, Resources: []string{"cataloglanes/embeddings"},
			ResourceNames: []string{lane}, Verbs: []string{"create"}}}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	_, err = admin.RbacV1().RoleBindings(c.namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: lane},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: lane},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: c.name, Namespace: c.namespace}}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	c.waitUntil(lane, true)
}

func (c caller) revoke(lane string) {
	GinkgoHelper()
	Expect(admin.RbacV1().RoleBindings(c.namespace).Delete(ctx, lane, metav1.DeleteOptions{})).To(Succeed())
	c.waitUntil(lane, false)
}

// waitUntil waits until the API server's own answer (RBAC reads its objects from informers) is
// allowed, asked directly by the administrator, so that what a Delegating answers is its cache's
// doing, not the API server's lag.
func (c caller) waitUntil(lane string, allowed bool) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		sar, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: c.username(), Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + c.namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: c.namespace, Verb: "create", Group: v1.GroupVersion.Group,
				Resource: "cataloglanes", Subresource: "embeddings", Name: lane}}}, metav1.CreateOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(sar.Status.Allowed).To(Equal(allowed))
	}).WithTimeout(10 * time.Second).WithPolling(50 * time.Millisecond).Should(Succeed())
}

// token is a token for the caller, issued for audiences (the API server's own if none).
func (c caller) token(audiences ...string) string {
	GinkgoHelper()
	tr, err := admin.CoreV1().ServiceAccounts(c.namespace).CreateToken(ctx, c.name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

func request(token string) *http.Request {
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://mac-1/v1/embeddings", nil)
	Expect(err).NotTo(HaveOccurred())
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	return r
}

type fixture struct {
	clock *clocktesting.FakeClock
	reg   *prometheus.Registry
	auth  *apiauth.Delegating
}

func newFixture(cacheSize int) fixture {
	f := fixture{clock: clocktesting.NewFakeClock(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)), reg: prometheus.NewRegistry()}
	f.auth = apiauth.New(apiauth.Config{TokenReviews: asNode.AuthenticationV1(), SubjectAccessReviews: asNode.AuthorizationV1(),
		Clock: f.clock, CacheSize: cacheSize, Log: GinkgoLogr})
	f.reg.MustRegister(f.auth)
	return f
}

// reviews is how many reviews of kind were asked of the API server.
func (f fixture) reviews(kind string) int {
	GinkgoHelper()
	mfs, err := f.reg.Gather()
	Expect(err).NotTo(HaveOccurred())
	total := 0
	for _, mf := range mfs {
		if mf.GetName() != "synapse_agent_auth_reviews_total" {
			continue
		}
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if l.GetName() == "review" && l.GetValue() == kind {
					total += int(m.Counter.GetValue())
				}
			}
		}
	}
	return total
}

func (f fixture) authenticate(token string) (user.Info, bool) {
	GinkgoHelper()
	u, ok, _, err := f.auth.AuthenticateRequest(request(token))
	Expect(err).NotTo(HaveOccurred())
	return u, ok
}

func (f fixture) mayCall(u user.Info, namespace, lane, subresource string) bool {
	GinkgoHelper()
	allowed, _, err := f.auth.Authorize(ctx, u, apiauth.Access{Namespace: namespace, Lane: lane, Subresource: subresource})
	Expect(err).NotTo(HaveOccurred())
	return allowed
}

var _ = Describe("Delegating", func() {
	DescribeTable("authentication refuses a call", func(token func(caller) string) {
		f := newFixture(0)
		u, ok := f.authenticate(token(newCaller()))
		Expect(ok).To(BeFalse())
		Expect(u).To(BeNil())
	},
		Entry("without a token", func(caller) string { return "" }),
		Entry("with a token the API server never issued", func(caller) string { return "not-a-token" }),
		Entry("with a token for the API server's audience, not the fleet's", func(c caller) string { return c.token() }),
		Entry("with a token for another audience", func(c caller) string { return c.token("vault") }),
	)

	It("should authenticate a token for the fleet's audience as its ServiceAccount", func() {
		f := newFixture(0)
		c := newCaller()
		u, ok := f.authenticate(c.token(apiauth.DefaultAudience))
		Expect(ok).To(BeTrue())
		Expect(u.GetName()).To(Equal(c.username()))
		Expect(u.GetGroups()).To(ContainElements("system:serviceaccounts", "system:serviceaccounts:"+c.namespace, "system:authenticated"))
	})

	It("should let a caller allowed lane A call lane A's embeddings and nothing else", func() {
		f := newFixture(0)
		c := newCaller()
		u, ok := f.authenticate(c.token(apiauth.DefaultAudience))
		Expect(ok).To(BeTrue())
		Expect(f.mayCall(u, c.namespace, "lane-a", "embeddings")).To(BeTrue())
		Expect(f.mayCall(u, c.namespace, "lane-b", "embeddings")).To(BeFalse())
		Expect(f.mayCall(u, c.namespace, "lane-a", "rerank")).To(BeFalse())
		Expect(f.mayCall(u, "default", "lane-a", "embeddings")).To(BeFalse())
		allowed, _, err := f.auth.Authorize(ctx, u, apiauth.Access{Path: "/metrics"})
		Expect(err).NotTo(HaveOccurred())
		Expect(allowed).To(BeFalse())
	})

	It("should keep a token's review 2 minutes: a deleted ServiceAccount's token is refused after that", func() {
		f := newFixture(0)
		c := newCaller()
		token := c.token(apiauth.DefaultAudience)
		_, ok := f.authenticate(token)
		Expect(ok).To(BeTrue())
		Expect(f.reviews("TokenReview")).To(Equal(1))

		Expect(admin.CoreV1().ServiceAccounts(c.namespace).Delete(ctx, c.name, metav1.DeleteOptions{})).To(Succeed())
		Eventually(func(g Gomega) {
			tr, err := admin.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
				Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{apiauth.DefaultAudience}}}, metav1.CreateOptions{})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(tr.Status.Authenticated).To(BeFalse())
			// The API server keeps its own token decisions 10 s.
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

		f.clock.Step(apiauth.DefaultAuthenticatedTTL - time.Second)
		_, ok = f.authenticate(token)
		Expect(ok).To(BeTrue(), "the cached review")
		Expect(f.reviews("TokenReview")).To(Equal(1))
		f.clock.Step(2 * time.Second)
		_, ok = f.authenticate(token)
		Expect(ok).To(BeFalse())
		Expect(f.reviews("TokenReview")).To(Equal(2))
		// The refusal is kept too: a flood of one bad token is one review per 30 seconds.
		f.clock.Step(apiauth.DefaultUnauthenticatedTTL - time.Second)
		_, ok = f.authenticate(token)
		Expect(ok).To(BeFalse())
		Expect(f.reviews("TokenReview")).To(Equal(2))
		f.clock.Step(2 * time.Second)
		f.authenticate(token)
		Expect(f.reviews("TokenReview")).To(Equal(3))
	})

	It("should keep an allowed call 5 minutes and a denied one 30 seconds", func() {
		f := newFixture(0)
		c := newCaller()
		u, ok := f.authenticate(c.token(apiauth.DefaultAudience))
		Expect(ok).To(BeTrue())
		Expect(f.mayCall(u, c.namespace, "lane-a", "embeddings")).To(BeTrue())
		Expect(f.mayCall(u, c.namespace, "lane-b", "embeddings")).To(BeFalse())
		Expect(f.reviews("SubjectAccessReview")).To(Equal(2))

		// RBAC changes both ways; the cache answers as before until each decision expires.
		c.revoke("lane-a")
		c.grant("lane-b")
		f.clock.Step(apiauth.DefaultDeniedTTL - time.Second)
		Expect(f.mayCall(u, c.namespace, "lane-a", "embeddings")).To(BeTrue())
		Expect(f.mayCall(u, c.namespace, "lane-b", "embeddings")).To(BeFalse())
		Expect(f.reviews("SubjectAccessReview")).To(Equal(2))

		f.clock.Step(2 * time.Second)
		Expect(f.mayCall(u, c.namespace, "lane-b", "embeddings")).To(BeTrue(), "the denial expired")
		Expect(f.mayCall(u, c.namespace, "lane-a", "embeddings")).To(BeTrue(), "the allowance has not")
		Expect(f.reviews("SubjectAccessReview")).To(Equal(3))

		f.clock.Step(apiauth.DefaultAllowedTTL - apiauth.DefaultDeniedTTL)
		Expect(f.mayCall(u, c.namespace, "lane-a", "embeddings")).To(BeFalse(), "the allowance expired")
		Expect(f.reviews("SubjectAccessReview")).To(Equal(4))
	})

	It("should hold at most its cache size of each kind of decision, the least recently used going first", func() {
		f := newFixture(2)
		c := newCaller()
		u, ok := f.authenticate(c.token(apiauth.DefaultAudience))
		Expect(ok).To(BeTrue())
		// lane-a is allowed, the others denied.
		for _, lane := range []string{"lane-a", "lane-b", "lane-c", "lane-d"} {
			f.mayCall(u, c.namespace, lane, "embeddings")
		}
		Expect(f.reviews("SubjectAccessReview")).To(Equal(4))
		f.mayCall(u, c.namespace, "lane-d", "embeddings")
		Expect(f.mayCall(u, c.namespace, "lane-a", "embeddings")).To(BeTrue())
		Expect(f.reviews("SubjectAccessReview")).To(Equal(4), "three denials did not evict the allowance")
		f.mayCall(u, c.namespace, "lane-b", "embeddings")
		Expect(f.reviews("SubjectAccessReview")).To(Equal(5), "lane-b's denial was evicted by the later ones")
	})

	It("should review a token once however many calls carry it at once", func() {
		f := newFixture(0)
		c := newCaller()
		token := c.token(apiauth.DefaultAudience)
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				defer GinkgoRecover()
				_, ok := f.authenticate(token)
				Expect(ok).To(BeTrue())
			})
		}
		wg.Wait()
		Expect(f.reviews("TokenReview")).To(Equal(1))
	})

	It("should answer an error, not a decision, when the API server cannot be asked", func() {
		cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1"})
		Expect(err).NotTo(HaveOccurred())
		auth := apiauth.New(apiauth.Config{TokenReviews: cs.AuthenticationV1(), SubjectAccessReviews: cs.AuthorizationV1(), ReviewTimeout: 5 * time.Second})
		_, ok, _, err := auth.AuthenticateRequest(request("some-token"))
		Expect(err).To(HaveOccurred())
		Expect(ok).To(BeFalse())
		allowed, _, err := auth.Authorize(ctx, &user.DefaultInfo{Name: "alice"}, apiauth.Access{Namespace: "team", Lane: "lane-a", Subresource: "embeddings"})
		Expect(err).To(HaveOccurred())
		Expect(allowed).To(BeFalse())
	})
})
