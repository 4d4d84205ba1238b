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
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

// listed is a reader that lists fixed ServiceCIDRs and Nodes, in the order given.
type listed struct {
	client.Reader
	cidrs []networkingv1.ServiceCIDR
	nodes []corev1.Node
}

func (l listed) List(_ context.Context, list client.ObjectList, _ ...client.ListOption) error {
	switch list := list.(type) {
	case *networkingv1.ServiceCIDRList:
		list.Items = l.cidrs
	case *corev1.NodeList:
		list.Items = l.nodes
	}
	return nil
}

// The cluster's ranges come in one order whatever order the lists do (a cache's is a map's): an
// address inside two of them is refused naming the same one on every pass, so the
// AddressAllowed condition's own write does not bring another with a different message.
func TestClusterRangesComeInOneOrder(t *testing.T) {
	cidr := func(name string, cidrs ...string) networkingv1.ServiceCIDR {
		return networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: networkingv1.ServiceCIDRSpec{CIDRs: cidrs}}
	}
	node := func(name, podCIDR string) corev1.Node {
		return corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: []string{podCIDR}}}
	}
	// A service range being replaced by a wider one overlaps it, as the ServiceCIDR API allows.
	a := listed{cidrs: []networkingv1.ServiceCIDR{cidr("kubernetes", "10.96.0.0/16"), cidr("wider", "10.96.0.0/12")},
		nodes: []corev1.Node{node("n1", "10.244.0.0/24"), node("n2", "10.244.1.0/24")}}
	b := listed{cidrs: slices.Clone(a.cidrs), nodes: slices.Clone(a.nodes)}
	slices.Reverse(b.cidrs)
	slices.Reverse(b.nodes)
	ra, err := endpoints.ClusterRanges(context.Background(), a)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := endpoints.ClusterRanges(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ra, rb) {
		t.Fatalf("the ranges follow the lists' order:\n%v\n%v", ra, rb)
	}
	policy := endpoints.AddressPolicy{}
	_, ea := policy.Judge("10.96.0.5", ra)
	_, eb := policy.Judge("10.96.0.5", rb)
	if ea == nil || eb == nil || ea.Error() != eb.Error() {
		t.Fatalf("an address inside both service ranges: %v, then %v", ea, eb)
	}
}
