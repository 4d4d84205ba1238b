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

package restriction

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
)

// world is what one row acts in: two joined Macs, self (whose identity acts) and other, each
// with its MacNode, a placement bound to it and (other's) Lease; and an identity of the nodes'
// namespace that is no node.
type world struct {
	self, other string
	// as acts as self's agent; cs is the same identity's clientset (TokenRequest).
	as client.Client
	cs kubernetes.Interface
	// own and others are placements bound to self and to other, with the retirement finalizer
	// and a lane owner.
	own, others *v1.LanePlacement
}

var seq int

// newWorld joins two fresh Macs; with policiesOnly, self's identity is also bound to
// cluster-admin, so that whatever the shipped RBAC would refuse reaches the policies.
func newWorld(policiesOnly bool) *world {
	GinkgoHelper()
	seq++
	w := &world{self: fmt.Sprintf("self-%d", seq), other: fmt.Sprintf("other-%d", seq)}
	var cfg *rest.Config
	for _, node := range []string{w.self, w.other} {
		joined, err := nodeidentity.Join(ctx, adminClientset(), nodeidentity.JoinOptions{Node: node, Server: env.Config.Host,
			CAData: env.Config.CAData, Lifetime: time.Hour, Dir: GinkgoT().TempDir()})
		Expect(err).NotTo(HaveOccurred())
		if node == w.self {
			cfg, err = clientcmd.BuildConfigFromFlags("", joined.Kubeconfig)
			Expect(err).NotTo(HaveOccurred())
		}
		n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: node}}
		Expect(admin.Create(ctx, n)).To(Succeed())
	}
	if policiesOnly {
		bindClusterAdmin(nodeidentity.ServiceAccountName(w.self))
	}
	var err error
	w.as, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	w.cs, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())

	Expect(admin.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: w.other, Namespace: "synapse-node-lease"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(w.other), RenewTime: ptr.To(metav1.NowMicro())}})).To(Succeed())
	w.own, w.others = placement(w.self), placement(w.other)
	return w
}

func adminClientset() kubernetes.Interface {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(env.Config)
	Expect(err).NotTo(HaveOccurred())
	return cs
}

// bindClusterAdmin gives a ServiceAccount of the nodes' namespace every right RBAC can give.
func bindClusterAdmin(sa string) {
	GinkgoHelper()
	Expect(admin.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-cluster-admin"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: nodeidentity.Namespace}}})).To(Succeed())
}

// intruder is a client for a ServiceAccount of synapse-nodes that is not named for a node,
// bound to cluster-admin: only the policies stand in its way.
func intruder(name string) client.Client {
	GinkgoHelper()
	Expect(admin.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: nodeidentity.Namespace}})).To(Succeed())
	bindClusterAdmin(name)
	tr, err := adminClientset().CoreV1().ServiceAccounts(nodeidentity.Namespace).CreateToken(ctx, name,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	cfg := rest.AnonymousClientConfig(env.Config)
	cfg.BearerToken = tr.Status.Token
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// placement creates, as the controller does, a placement bound to node.
func placement(node string) *v1.LanePlacement {
	GinkgoHelper()
	p := &v1.LanePlacement{
		ObjectMeta: metav1.ObjectMeta{Name: "lane-" + node, Namespace: "default",
			Labels:     map[string]string{v1.LabelNode: node, v1.LabelLane: "lane"},
			Finalizers: []string{v1.FinalizerRetirement},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: v1.GroupVersion.String(), Kind: "CatalogLane", Name: "lane",
				UID: types.UID("00000000-0000-0000-0000-0000000000" + fmt.Sprintf("%02d", seq%100)), Controller: ptr.To(true)}}},
		Spec: v1.LanePlacementSpec{Lane: "lane", Node: node, Identity: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30},
	}
	Expect(admin.Create(ctx, p)).To(Succeed())
	return p
}

// get reads obj afresh as the administrator.
func get[T client.Object](obj T) T {
	GinkgoHelper()
	Expect(admin.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
	return obj
}

func node(name string) *v1.MacNode {
	GinkgoHelper()
	return get(&v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}})
}

// createConfigMap is a write no agent has any business making.
func createConfigMap(w *world) error {
	seq++
	return w.as.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", seq), Namespace: "default"}})
}
