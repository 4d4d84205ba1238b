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

package finalizers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

var seq int

func identity() *v1.CertifiedIdentity {
	GinkgoHelper()
	seq++
	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-%d", seq)}, Spec: v1.CertifiedIdentitySpec{
		Worker:           v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Model:            v1.ModelIdentity{Name: "gte", Revision: "r", Layers: 4, HiddenSize: 64, EmbeddingDimensions: 32, CheckpointDigest: digest},
		ConversionPolicy: v1.ConversionPolicy{Name: "p", Digest: digest}, MacOSBuild: "25B78", VectorSpaceID: "gte"}}
	Expect(admin.Create(ctx, id)).To(Succeed())
	return id
}

func lane(namespace string, id *v1.CertifiedIdentity, replicas int32) *v1.CatalogLane {
	GinkgoHelper()
	seq++
	l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lane-%d", seq), Namespace: namespace},
		Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: id.Name},
			Rungs: []v1.Rung{128}, Replicas: replicas, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	Expect(admin.Create(ctx, l)).To(Succeed())
	return l
}

func namespace() string {
	GinkgoHelper()
	seq++
	ns := fmt.Sprintf("team-%d", seq)
	Expect(admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
	return ns
}

func placementsOf(l *v1.CatalogLane) []v1.LanePlacement {
	var ps v1.LanePlacementList
	Expect(admin.List(ctx, &ps, client.InNamespace(l.Namespace), client.MatchingLabels{v1.LabelLane: l.Name})).To(Succeed())
	return ps.Items
}

// placedOn waits until the lane has a placement on each of nodes.
func placedOn(l *v1.CatalogLane, nodes ...string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var on []string
		for _, p := range placementsOf(l) {
			if p.DeletionTimestamp.IsZero() {
				on = append(on, p.Spec.Node)
			}
		}
		g.Expect(on).To(ConsistOf(nodes))
	}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
}

func unknown(name string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		n := &v1.MacNode{}
		g.Expect(admin.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
		g.Expect(meta.FindStatusCondition(n.Status.Conditions, v1.ConditionReady).Status).To(Equal(metav1.ConditionUnknown))
	}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
}

func gone(obj client.Object) func(Gomega) {
	return func(g Gomega) {
		err := admin.Get(ctx, client.ObjectKeyFromObject(obj), obj)
		g.Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s %s is still there (finalizers %v): %v",
			obj.GetObjectKind().GroupVersionKind().Kind, client.ObjectKeyFromObject(obj), obj.GetFinalizers(), err)
	}
}

// Ordered: the uninstall runs last, and removes the CRDs.
var _ = Describe("No finalizer blocks a deletion forever", Ordered, func() {
	var id *v1.CertifiedIdentity
	BeforeAll(func() {
		id = identity()
		for _, name := range []string{"mac-a", "mac-b", "mac-c"} {
			startMac(name)
		}
	})

	It("releases the placements of a deleted MacNode, whose agent is gone", func() {
		victim := startMac("victim-1")
		l := lane("default", id, 4)
		placedOn(l, "mac-a", "mac-b", "mac-c", "victim-1")
		var onVictim v1.LanePlacement
		for _, p := range placementsOf(l) {
			if p.Spec.Node == "victim-1" {
				onVictim = p
			}
		}
		victim.die()
		Expect(admin.Delete(ctx, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "victim-1"}})).To(Succeed())
		Eventually(gone(&onVictim)).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		placedOn(l, "mac-a", "mac-b", "mac-c")
	})

	It("completes the deletion of a namespace with lanes, on live Macs and on one that is Unknown", func() {
		ns := namespace()
		victim := startMac("victim-2")
		l := lane(ns, id, 4)
		placedOn(l, "mac-a", "mac-b", "mac-c", "victim-2")
		victim.die()
		unknown("victim-2")

		Expect(admin.Delete(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).To(Succeed())
		// What the namespace controller does: delete everything in it, wait until it is gone,
		// then finalize the namespace.
		for _, obj := range []client.Object{&v1.CatalogLane{}, &v1.LanePlacement{}, &v1.PrewarmPolicy{}} {
			Expect(admin.DeleteAllOf(ctx, obj, client.InNamespace(ns))).To(Succeed())
		}
		Eventually(func(g Gomega) {
			var ps v1.LanePlacementList
			g.Expect(admin.List(ctx, &ps, client.InNamespace(ns))).To(Succeed())
			g.Expect(ps.Items).To(BeEmpty(), "placements stuck in the deleted namespace")
			var lanes v1.CatalogLaneList
			g.Expect(admin.List(ctx, &lanes, client.InNamespace(ns))).To(Succeed())
			g.Expect(lanes.Items).To(BeEmpty())
		}).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		cs := kubernetes.NewForConfigOrDie(env.Config)
		nsObj, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		Expect(err).NotTo(HaveOccurred())
		nsObj.Spec.Finalizers = nil
		_, err = cs.CoreV1().Namespaces().Finalize(ctx, nsObj, metav1.UpdateOptions{})
		Expect(err).NotTo(HaveOccurred())
		Eventually(gone(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})).WithTimeout(20 * time.Second).Should(Succeed())
	})

	It("follows the documented uninstall path to the end with nothing stuck", func() {
		other := namespace()
		lane("default", id, 2)
		lane(other, id, 3)
		second := identity()
		lane(other, second, 1)
		Eventually(func(g Gomega) {
			var ps v1.LanePlacementList
			g.Expect(admin.List(ctx, &ps)).To(Succeed())
			g.Expect(len(ps.Items)).To(BeNumerically(">=", 6))
		}).WithTimeout(20 * time.Second).Should(Succeed())

		By("kubectl delete cataloglanes --all -A --wait (the garbage collector deletes their placements)")
		var lanes v1.CatalogLaneList
		Expect(admin.List(ctx, &lanes)).To(Succeed())
		for i := range lanes.Items {
			Expect(admin.Delete(ctx, &lanes.Items[i])).To(Succeed())
		}
		Eventually(func(g Gomega) {
			collectGarbage()
			var ps v1.LanePlacementList
			g.Expect(admin.List(ctx, &ps)).To(Succeed())
			g.Expect(ps.Items).To(BeEmpty(), "placements stuck after their lanes were deleted")
			var ls v1.CatalogLaneList
			g.Expect(admin.List(ctx, &ls)).To(Succeed())
			g.Expect(ls.Items).To(BeEmpty())
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())

		By("kubectl delete certifiedidentities --all --wait")
		var ids v1.CertifiedIdentityList
		Expect(admin.List(ctx, &ids)).To(Succeed())
		for i := range ids.Items {
			Expect(admin.Delete(ctx, &ids.Items[i])).To(Succeed())
			Eventually(gone(&ids.Items[i])).WithTimeout(20 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		}

		By("kubectl delete macnodes --all --wait")
		stopMacs()
		var nodes v1.MacNodeList
		Expect(admin.List(ctx, &nodes)).To(Succeed())
		for i := range nodes.Items {
			Expect(admin.Delete(ctx, &nodes.Items[i])).To(Succeed())
			Eventually(gone(&nodes.Items[i])).WithTimeout(20 * time.Second).Should(Succeed())
		}

		By("helm uninstall: the controller stops; then the CRDs, which helm leaves, are deleted")
		stopManager()
		<-managerDone
		var crds apiextensionsv1.CustomResourceDefinitionList
		Expect(admin.List(ctx, &crds)).To(Succeed())
		deleted := 0
		for i := range crds.Items {
			if crds.Items[i].Spec.Group != v1.GroupVersion.Group {
				continue
			}
			Expect(admin.Delete(ctx, &crds.Items[i])).To(Succeed())
			deleted++
			Eventually(gone(&crds.Items[i])).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(Succeed(),
				"a CRD's deletion waits for objects whose finalizers nobody will remove")
		}
		Expect(deleted).To(Equal(5))
	})
})
