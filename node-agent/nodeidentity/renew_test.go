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

package nodeidentity_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
)

var seq int

// join joins a fresh Mac as an administrator does.
func join() (string, *nodeidentity.Joined) {
	GinkgoHelper()
	seq++
	node := fmt.Sprintf("mac-%d", seq)
	joined, err := nodeidentity.Join(ctx, admin, nodeidentity.JoinOptions{Node: node, Server: env.Config.Host, CAData: env.Config.CAData,
		Lifetime: time.Hour, Dir: GinkgoT().TempDir()})
	Expect(err).NotTo(HaveOccurred())
	return node, joined
}

// asMac is a client reading the Mac's kubeconfig afresh (and so its token file as it is now).
func asMac(j *nodeidentity.Joined) client.Client {
	GinkgoHelper()
	cfg, err := clientcmd.BuildConfigFromFlags("", j.Kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// heartbeat writes the node's Lease, as its agent does.
func heartbeat(c client.Client, node string) error {
	l := &coordinationv1.Lease{}
	err := c.Get(ctx, client.ObjectKey{Namespace: "synapse-node-lease", Name: node}, l)
	if apierrors.IsNotFound(err) {
		return c.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: "synapse-node-lease"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), RenewTime: ptr.To(metav1.NowMicro())}})
	}
	if err != nil {
		return err
	}
	l.Spec.RenewTime = ptr.To(metav1.NowMicro())
	return c.Update(ctx, l)
}

func readToken(j *nodeidentity.Joined) (string, nodeidentity.Claims) {
	GinkgoHelper()
	data, err := os.ReadFile(j.TokenFile)
	Expect(err).NotTo(HaveOccurred())
	c, err := nodeidentity.ParseClaims(string(data))
	Expect(err).NotTo(HaveOccurred())
	return string(data), c
}

// counting counts the token requests the renewer makes; fail, when set, answers them instead.
type counting struct {
	real func(string) (nodeidentity.TokenRequester, error)
	n    atomic.Int32
	fail error
}

func (c *counting) tokens(token string) (nodeidentity.TokenRequester, error) {
	r, err := c.real(token)
	if err != nil {
		return nil, err
	}
	return countingRequester{TokenRequester: r, c: c}, nil
}

type countingRequester struct {
	nodeidentity.TokenRequester
	c *counting
}

func (r countingRequester) CreateToken(ctx context.Context, name string, tr *authenticationv1.TokenRequest, opts metav1.CreateOptions) (*authenticationv1.TokenRequest, error) {
	r.c.n.Add(1)
	if r.c.fail != nil {
		return nil, r.c.fail
	}
	return r.TokenRequester.CreateToken(ctx, name, tr, opts)
}

// startRenewer runs a renewer of the Mac's token on a fake clock that starts when the token
// was issued, and waits until it waits on the clock.
func startRenewer(j *nodeidentity.Joined) (*nodeidentity.Renewer, *clocktesting.FakeClock, *counting) {
	GinkgoHelper()
	_, claims := readToken(j)
	clk := clocktesting.NewFakeClock(claims.IssuedAt)
	calls := &counting{real: nodeidentity.TokensFor(env.Config)}
	r := &nodeidentity.Renewer{Clock: clk, Tokens: calls.tokens, Path: j.TokenFile, Log: logr.Discard()}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	DeferCleanup(func() {
		cancel()
		Expect(<-done).To(Succeed())
	})
	Eventually(clk.HasWaiters).Should(BeTrue())
	return r, clk, calls
}

// stepTo moves the clock to t once the renewer waits on it, and waits until it waits again.
func stepTo(clk *clocktesting.FakeClock, t time.Time) {
	GinkgoHelper()
	Eventually(clk.HasWaiters).Should(BeTrue())
	clk.SetTime(t)
}

var _ = Describe("A joined Mac", func() {
	It("authenticates as its own ServiceAccount with a token that expires, from files only its user reads", func() {
		node, j := join()
		Expect(heartbeat(asMac(j), node)).To(Succeed())
		_, claims := readToken(j)
		Expect(claims.Node()).To(Equal(node))
		Expect(claims.Lifetime()).To(Equal(time.Hour))
		for _, f := range []string{j.TokenFile, j.Kubeconfig} {
			info, err := os.Stat(f)
			Expect(err).NotTo(HaveOccurred())
			Expect(info.Mode().Perm()).To(Equal(os.FileMode(0o600)), f)
		}
	})

	It("records the API server's audiences, the only ones the policy lets it request a token for", func() {
		_, j := join()
		cm, err := admin.CoreV1().ConfigMaps(nodeidentity.Namespace).Get(ctx, nodeidentity.AudiencesConfigMap, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		tr, err := admin.CoreV1().ServiceAccounts(nodeidentity.Namespace).CreateToken(ctx, j.ServiceAccount,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(600))}}, metav1.CreateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(tr.Spec.Audiences).NotTo(BeEmpty())
		Expect(cm.Data).To(HaveKeyWithValue(nodeidentity.AudiencesKey, strings.Join(tr.Spec.Audiences, ",")))

		// Whatever an administrator wrote there, joining puts the API server's back.
		cm.Data[nodeidentity.AudiencesKey] = "vault"
		_, err = admin.CoreV1().ConfigMaps(nodeidentity.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred())
		join()
		cm, err = admin.CoreV1().ConfigMaps(nodeidentity.Namespace).Get(ctx, nodeidentity.AudiencesConfigMap, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		Expect(cm.Data).To(HaveKeyWithValue(nodeidentity.AudiencesKey, strings.Join(tr.Spec.Audiences, ",")))
	})

	It("joined again keeps its ServiceAccount and gets a fresh token", func() {
		node, j := join()
		first, _ := readToken(j)
		again, err := nodeidentity.Join(ctx, admin, nodeidentity.JoinOptions{Node: node, Server: env.Config.Host, CAData: env.Config.CAData,
			Lifetime: time.Hour, Dir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		Expect(again.CreatedIdentity).To(BeFalse())
		second, _ := readToken(again)
		Expect(second).NotTo(Equal(first))
		Expect(heartbeat(asMac(again), node)).To(Succeed())
		Expect(heartbeat(asMac(j), node)).To(Succeed(), "the first token stays valid until it expires")
	})

	It("refuses a token lifetime of years, and a node name no MacNode can have", func() {
		for _, opts := range []nodeidentity.JoinOptions{
			{Node: "mac-long", Lifetime: 365 * 24 * time.Hour},
			{Node: "Mac_A"},
		} {
			opts.Server, opts.CAData, opts.Dir = env.Config.Host, env.Config.CAData, GinkgoT().TempDir()
			_, err := nodeidentity.Join(ctx, admin, opts)
			Expect(err).To(HaveOccurred())
		}
	})

	Context("with its renewer on a fake clock", func() {
		It("renews its token after 80% of its lifetime, not before, and the new token works", func() {
			node, j := join()
			old, claims := readToken(j)
			r, clk, calls := startRenewer(j)

			stepTo(clk, claims.IssuedAt.Add(claims.Lifetime()*79/100))
			Consistently(calls.n.Load).WithTimeout(200 * time.Millisecond).Should(BeZero())

			stepTo(clk, claims.RenewAt())
			Eventually(func() int { n, _ := r.Status(); return n }).Should(Equal(1))
			// The next renewal is 80% of the new token's lifetime later by the agent's clock,
			// however far ahead of the API server's that clock is.
			Consistently(calls.n.Load).WithTimeout(1500 * time.Millisecond).Should(BeEquivalentTo(1))
			renewedAt := clk.Now()
			stepTo(clk, renewedAt.Add(time.Hour*8/10-time.Second))
			Consistently(calls.n.Load).WithTimeout(200 * time.Millisecond).Should(BeEquivalentTo(1))
			stepTo(clk, renewedAt.Add(time.Hour*8/10))
			Eventually(calls.n.Load).Should(BeEquivalentTo(2))
			renewed, next := readToken(j)
			Expect(renewed).NotTo(Equal(old))
			Eventually(func() int { n, _ := r.Status(); return n }).Should(Equal(2))
			Expect(next.Node()).To(Equal(node))
			Expect(next.Lifetime()).To(Equal(time.Hour), "the same lifetime is asked for")
			Expect(heartbeat(asMac(j), node)).To(Succeed())
			_, err := r.Status()
			Expect(err).NotTo(HaveOccurred())
		})

		It("once revoked (its ServiceAccount deleted) can write nothing, and its renewal says it is revoked", func() {
			node, j := join()
			mac := asMac(j)
			Expect(heartbeat(mac, node)).To(Succeed())
			_, claims := readToken(j)
			r, clk, _ := startRenewer(j)

			Expect(admin.CoreV1().ServiceAccounts(nodeidentity.Namespace).Delete(ctx, nodeidentity.ServiceAccountName(node), metav1.DeleteOptions{})).To(Succeed())
			Eventually(func() bool { return apierrors.IsUnauthorized(heartbeat(asMac(j), node)) }).
				WithTimeout(30*time.Second).Should(BeTrue(), "a revoked Mac still writes")

			stepTo(clk, claims.RenewAt())
			Eventually(func() error { _, err := r.Status(); return err }).Should(MatchError(nodeidentity.ErrRevoked))

			// Joined again, the running agent picks up its new token file and renews it.
			again, err := nodeidentity.Join(ctx, admin, nodeidentity.JoinOptions{Node: node, Server: env.Config.Host, CAData: env.Config.CAData,
				Lifetime: time.Hour, Dir: dirOf(j)})
			Expect(err).NotTo(HaveOccurred())
			Expect(again.CreatedIdentity).To(BeTrue())
			// The API server learns of the new ServiceAccount through its informer.
			Eventually(func() error { return heartbeat(asMac(j), node) }).WithTimeout(30 * time.Second).Should(Succeed())
			_, fresh := readToken(j)
			stepTo(clk, fresh.RenewAt())
			Eventually(func() error { _, err := r.Status(); return err }).WithTimeout(10 * time.Second).Should(Succeed())
			Expect(heartbeat(asMac(j), node)).To(Succeed())
		})

		It("says its token expired when it could not renew it in time, and keeps retrying at bounded intervals", func() {
			_, j := join()
			_, claims := readToken(j)
			r, clk, calls := startRenewer(j)
			calls.fail = errors.New("connection refused")

			stepTo(clk, claims.RenewAt())
			Eventually(calls.n.Load).Should(BeEquivalentTo(1))
			Eventually(func() error { _, err := r.Status(); return err }).Should(MatchError(ContainSubstring("connection refused")))
			_, err := r.Status()
			Expect(errors.Is(err, nodeidentity.ErrExpired)).To(BeFalse(), "not expired yet: %v", err)

			// Each retry comes within MaxRetry of the last, however long the outage.
			attempts := calls.n.Load()
			for clk.Now().Before(claims.Expiry.Add(nodeidentity.MaxRetry)) {
				stepTo(clk, clk.Now().Add(nodeidentity.MaxRetry))
				attempts++
				Eventually(calls.n.Load).Should(Equal(attempts))
			}
			Eventually(func() error { _, err := r.Status(); return err }).Should(MatchError(nodeidentity.ErrExpired))
		})
	})
})

func dirOf(j *nodeidentity.Joined) string { return filepath.Dir(j.TokenFile) }
