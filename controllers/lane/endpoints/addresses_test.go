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

package endpoints_test

import (
	"errors"
	"fmt"
	"net/netip"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

var _ = Describe("Address policy", func() {
	cluster := []endpoints.ClusterRange{{Prefix: netip.MustParsePrefix("192.0.2.128/26"), What: "the pod range of Node n1"}}
	DescribeTable("judging an address",
		func(p endpoints.AddressPolicy, addr, reason string) {
			_, err := p.Judge(addr, cluster)
			if reason == "" {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			var refused *endpoints.AddressRefusedError
			Expect(errors.As(err, &refused)).To(BeTrue(), "%v", err)
			Expect(refused.Reason).To(Equal(reason))
		},
		Entry("inside an allowed CIDR", policy, "192.0.2.7", ""),
		Entry("outside every allowed CIDR", policy, "198.51.100.7", v1.NodeReasonAddressNotAllowed),
		Entry("with no CIDR allowed at all", endpoints.AddressPolicy{}, "192.0.2.7", v1.NodeReasonAddressNotAllowed),
		Entry("inside the cluster's pod range, although allowed", policy, "192.0.2.130", v1.NodeReasonAddressInClusterRange),
		Entry("inside a denied CIDR, although allowed", policy, "192.0.2.250", v1.NodeReasonAddressInClusterRange),
		Entry("loopback", policy, "127.0.0.1", v1.NodeReasonAddressUnusable),
		Entry("link-local (the cloud metadata address)", policy, "169.254.169.254", v1.NodeReasonAddressUnusable),
		Entry("unspecified", policy, "0.0.0.0", v1.NodeReasonAddressUnusable),
		Entry("IPv6", policy, "2001:db8::1", v1.NodeReasonAddressUnusable),
		Entry("not an address", policy, "mac-a.local", v1.NodeReasonAddressUnusable),
	)

	It("parses CIDRs and bare addresses, and refuses what is neither", func() {
		got, err := endpoints.ParsePrefixes([]string{"192.0.2.1", " 10.1.2.3/16 ", ""})
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal([]netip.Prefix{netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("10.1.0.0/16")}))
		_, err = endpoints.ParsePrefixes([]string{"10.0.0.0/33"})
		Expect(err).To(HaveOccurred())
	})
})

var _ = Describe("MacNode addresses", func() {
	addressCondition := func(n *v1.MacNode) *metav1.Condition {
		GinkgoHelper()
		_, err := endpoints.NewAddressController(clk, kube, policy).Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)})
		Expect(err).NotTo(HaveOccurred())
		got := &v1.MacNode{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(n), got)).To(Succeed())
		return meta.FindStatusCondition(got.Status.Conditions, v1.NodeConditionAddressAllowed)
	}

	It("should say on the node that its address is allowed", func() {
		c := addressCondition(node("192.0.2.20", 8080))
		Expect(c.Status).To(Equal(metav1.ConditionTrue))
		Expect(c.Message).To(ContainSubstring("192.0.2.20"))
	})

	It("should refuse, and say so, an address outside the allowed CIDRs", func() {
		c := addressCondition(node("198.51.100.20", 8080))
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(v1.NodeReasonAddressNotAllowed))
		Expect(c.Message).To(ContainSubstring("--endpoint-cidrs"))
	})

	It("should refuse an address in the cluster's service range, read from its ServiceCIDR", func() {
		c := addressCondition(node("10.0.0.10", 8080)) // envtest's service range is 10.0.0.0/24
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(v1.NodeReasonAddressInClusterRange))
		Expect(c.Message).To(ContainSubstring("service range"))
	})

	It("should refuse a Node's address and an address in a Node's pod range, and keep such a Mac out of the endpoints", func() {
		seq++
		k8sNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("worker-%d", seq)}, Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.0.0/24"}}}
		Expect(kube.Create(ctx, k8sNode)).To(Succeed())
		k8sNode.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.60"}}
		Expect(kube.Status().Update(ctx, k8sNode)).To(Succeed())
		DeferCleanup(func() { Expect(kube.Delete(ctx, k8sNode)).To(Succeed()) })

		inPods, onNode := node("10.244.0.9", 8080), node("192.0.2.60", 8080)
		for _, n := range []*v1.MacNode{inPods, onNode} {
			c := addressCondition(n)
			Expect(c.Status).To(Equal(metav1.ConditionFalse))
			Expect(c.Reason).To(Equal(v1.NodeReasonAddressInClusterRange))
			Expect(c.Message).To(ContainSubstring(k8sNode.Name))
		}

		lane := newLane()
		placement(lane, inPods, v1.PhaseReady)
		placement(lane, onNode, v1.PhaseReady)
		placement(lane, node("192.0.2.61", 8080), v1.PhaseReady)
		_, err := reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.61"}}))
	})
})
