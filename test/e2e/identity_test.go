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
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/localfleet"
)

// whoami asks the API server who a kubeconfig authenticates as.
func whoami(kubeconfig string) string {
	GinkgoHelper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return review.Status.UserInfo.Username
}

// argAfter is the argument after flag on a process's command line.
func argAfter(pid int, flag string) string {
	GinkgoHelper()
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	Expect(err).NotTo(HaveOccurred())
	args := strings.Split(string(data), "\x00")
	i := slices.Index(args, flag)
	Expect(i).To(BeNumerically(">=", 0), "no %s on the command line %v", flag, args)
	return args[i+1]
}

var _ = Describe("Identities", func() {
	It("should run each Mac under its own joined identity, which may not write another Mac's objects", func() {
		for _, mac := range append(slices.Clone(matching), other) {
			Expect(argAfter(fleet.PID(mac), "--kubeconfig")).To(Equal(fleet.MacKubeconfig(mac)))
			Expect(whoami(fleet.MacKubeconfig(mac))).To(Equal("system:serviceaccount:synapse-nodes:synapse-node-" + mac))
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", fleet.MacKubeconfig("mac-a"))
		Expect(err).NotTo(HaveOccurred())
		asMacA, err := client.New(cfg, client.Options{Scheme: kube.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		n := &v1.MacNode{}
		Expect(asMacA.Get(ctx, client.ObjectKey{Name: "mac-b"}, n)).To(Succeed())
		n.Status.ServingPort = 1
		err = asMacA.Status().Update(ctx, n)
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "mac-a wrote mac-b's status: %v", err)
		Expect(err.Error()).To(ContainSubstring("rule macnode-own"))
		err = asMacA.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "mac-b", Namespace: "kube-system"}})
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "mac-a created a kube-system Lease: %v", err)
	})

	It("should have every Mac listen on a loopback address of its own, on the port they all share, and advertise a documentation address of its own", func() {
		loopbacks, advertised, ports := map[netip.Addr]string{}, map[string]string{}, map[uint16]bool{}
		for _, mac := range append(slices.Clone(matching), other) {
			own, err := netip.ParseAddrPort(hostPort(mac))
			Expect(err).NotTo(HaveOccurred())
			Expect(own.Addr().IsLoopback()).To(BeTrue(), "%s is called on %s", mac, own)
			Expect(argAfter(fleet.PID(mac), "--listen")).To(Equal(own.String()))
			addrs, err := listening(fleet.PID(mac))
			Expect(err).NotTo(HaveOccurred())
			Expect(addrs).NotTo(BeEmpty(), "%s listens nowhere", mac)
			for _, a := range addrs {
				Expect(a).To(Equal(own), "%s listens on %s", mac, a)
			}
			Expect(loopbacks).NotTo(HaveKey(own.Addr()), "%s listens on %s's address", mac, loopbacks[own.Addr()])
			loopbacks[own.Addr()] = mac
			ports[own.Port()] = true

			adv := argAfter(fleet.PID(mac), "--advertise-address")
			Expect(adv).To(Equal(fleet.AdvertisedAddress(mac)))
			Expect(netip.MustParsePrefix("198.51.100.0/24").Contains(netip.MustParseAddr(adv))).To(BeTrue(),
				"%s advertises %s, outside TEST-NET-2 (RFC 5737), which nothing routes", mac, adv)
			Expect(advertised).NotTo(HaveKey(adv), "%s advertises %s's address", mac, advertised[adv])
			advertised[adv] = mac
		}
		Expect(ports).To(HaveLen(1), "the Macs share one port")
	})

	It("should run the controller under its ServiceAccount, electing its leader in its own namespace", func() {
		Expect(whoami(fleet.ControllerKubeconfig())).To(Equal("system:serviceaccount:synapse-system:synapse-controller"))
		Eventually(func(g Gomega) {
			lease := &coordinationv1.Lease{}
			g.Expect(kube.Get(ctx, client.ObjectKey{Namespace: localfleet.ControllerNamespace, Name: "synapse-controller.fleet.synapse.dev"}, lease)).To(Succeed())
			g.Expect(lease.Spec.HolderIdentity).NotTo(BeNil())
		}).WithTimeout(10 * time.Second).Should(Succeed())
	})

	It("should serve the controller's metrics only to a caller RBAC lets read them", func() {
		scrape := func(token string) int {
			GinkgoHelper()
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, fleet.ControllerMetricsURL(), nil)
			Expect(err).NotTo(HaveOccurred())
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			// The controller's certificate is self-signed; this is the loopback.
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
			resp, err := c.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer resp.Body.Close()
			_, err = io.Copy(io.Discard, resp.Body)
			Expect(err).NotTo(HaveOccurred())
			return resp.StatusCode
		}
		token := func(sa string, reader bool) string {
			GinkgoHelper()
			Expect(kube.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: "default"}})).To(Succeed())
			if reader {
				Expect(kube.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-metrics"},
					RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "synapse-metrics-reader"},
					Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: "default"}}})).To(Succeed())
			}
			cs, err := kubernetes.NewForConfig(fleet.Config)
			Expect(err).NotTo(HaveOccurred())
			tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, sa, &authenticationv1.TokenRequest{
				Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptrTo(int64(600))}}, metav1.CreateOptions{})
			Expect(err).NotTo(HaveOccurred())
			return tr.Status.Token
		}
		Expect(scrape("")).To(Equal(http.StatusUnauthorized))
		Expect(scrape(token("not-a-scraper", false))).To(Equal(http.StatusForbidden))
		scraper := token("prometheus", true)
		Eventually(func() int { return scrape(scraper) }).WithTimeout(10 * time.Second).Should(Equal(http.StatusOK))
	})

	It("should publish the Macs' advertised addresses in the lane's one EndpointSlice, inside the allowed CIDR", func() {
		l := newLane(v1.TaskEmbed, 3)
		var want []string
		for _, mac := range readyOn(l) {
			want = append(want, fleet.AdvertisedAddress(mac))
		}
		slices.Sort(want)
		port, err := netip.ParseAddrPort(hostPort(matching[0]))
		Expect(err).NotTo(HaveOccurred())
		Eventually(func(g Gomega) {
			for _, mac := range matching {
				n := &v1.MacNode{}
				g.Expect(kube.Get(ctx, client.ObjectKey{Name: mac}, n)).To(Succeed())
				c := meta.FindStatusCondition(n.Status.Conditions, v1.NodeConditionAddressAllowed)
				g.Expect(c).NotTo(BeNil())
				g.Expect(c.Status).To(Equal(metav1.ConditionTrue), c.Message)
			}
			var list discoveryv1.EndpointSliceList
			g.Expect(kube.List(ctx, &list, client.InNamespace(l.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: l.Name})).To(Succeed())
			g.Expect(list.Items).To(HaveLen(1), "the Macs share a port, so one slice lists them all")
			s := list.Items[0]
			g.Expect(s.Ports).To(HaveLen(1))
			g.Expect(s.Ports[0].Port).To(HaveValue(BeEquivalentTo(port.Port())))
			var addrs []string
			for _, e := range s.Endpoints {
				g.Expect(isReady(e)).To(BeTrue())
				addrs = append(addrs, e.Addresses...)
			}
			g.Expect(addrs).To(Equal(want), "one endpoint per Mac, each at its own address")
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	})
})
