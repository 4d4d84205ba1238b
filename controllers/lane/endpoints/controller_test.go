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
	"fmt"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

var seq int

func node(ip string, port int32) *v1.MacNode {
	GinkgoHelper()
	seq++
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("mac-%d", seq)}}
	Expect(kube.Create(ctx, n)).To(Succeed())
	n.Status.Addresses = []v1.NodeAddress{{Type: "Hostname", Address: n.Name + ".local"}, {Type: "InternalIP", Address: ip}}
	n.Status.ServingPort = port
	Expect(kube.Status().Update(ctx, n)).To(Succeed())
	return n
}

func placement(lane *v1.CatalogLane, n *v1.MacNode, phase v1.PlacementPhase) *v1.LanePlacement {
	GinkgoHelper()
	p := &v1.LanePlacement{
		ObjectMeta: metav1.ObjectMeta{Name: lane.Name + "-" + n.Name, Namespace: lane.Namespace, Labels: map[string]string{v1.LabelLane: lane.Name, v1.LabelNode: n.Name}},
		Spec: v1.LanePlacementSpec{Lane: lane.Name, Node: n.Name, Identity: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30},
	}
	Expect(kube.Create(ctx, p)).To(Succeed())
	p.Status.Phase = phase
	Expect(kube.Status().Update(ctx, p)).To(Succeed())
	return p
}

func endpointIPs(lane *v1.CatalogLane) map[int32][]string {
	GinkgoHelper()
	var list discoveryv1.EndpointSliceList
	Expect(kube.List(ctx, &list, client.InNamespace(lane.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: lane.Name})).To(Succeed())
	out := map[int32][]string{}
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			out[*s.Ports[0].Port] = append(out[*s.Ports[0].Port], e.Addresses...)
		}
	}
	return out
}

func newLane() *v1.CatalogLane {
	GinkgoHelper()
	seq++
	lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-%d", seq), Namespace: "default"},
		Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
			Rungs: []v1.Rung{128}, Replicas: 3, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	Expect(kube.Create(ctx, lane)).To(Succeed())
	return lane
}

func serviceCondition(lane *v1.CatalogLane) *metav1.Condition {
	GinkgoHelper()
	got := &v1.CatalogLane{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
	return meta.FindStatusCondition(got.Status.Conditions, v1.LaneConditionServiceReady)
}

var _ = Describe("Endpoints", func() {
	Context("when a Service of the lane's name exists that the controller did not create", func() {
		It("should not take it over, give the lane no endpoints, say so, and take the name once it is free", func() {
			seq++
			name := fmt.Sprintf("clash-%d", seq)
			foreign := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "theirs"}},
				Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "theirs"}, Ports: []corev1.ServicePort{{Name: "web", Port: 8443}}}}
			Expect(kube.Create(ctx, foreign)).To(Succeed())
			lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
				Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
					Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
			Expect(kube.Create(ctx, lane)).To(Succeed())
			placement(lane, node("192.0.2.30", 8080), v1.PhaseReady)

			_, err := newController().Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
			c := serviceCondition(lane)
			Expect(c.Status).To(Equal(metav1.ConditionFalse))
			Expect(c.Reason).To(Equal(v1.LaneReasonServiceNameTaken))
			Expect(c.Message).To(ContainSubstring("Service default/" + name))
			svc := &corev1.Service{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(foreign), svc)).To(Succeed())
			Expect(svc.Spec.Selector).To(Equal(foreign.Spec.Selector), "the foreign Service was changed")
			Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(8443))
			Expect(metav1.GetControllerOf(svc)).To(BeNil())
			Expect(endpointIPs(lane)).To(BeEmpty(), "endpoints were attached to a Service the controller does not own")

			// A foreign Service that forges the controller's label is still not taken.
			svc.Labels[endpoints.ServiceManagedByLabel] = endpoints.ManagedBy
			Expect(kube.Update(ctx, svc)).To(Succeed())
			_, err = newController().Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
			Expect(serviceCondition(lane).Reason).To(Equal(v1.LaneReasonServiceNameTaken))
			Expect(endpointIPs(lane)).To(BeEmpty())

			Expect(kube.Delete(ctx, svc)).To(Succeed())
			_, err = newController().Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
			Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue))
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(foreign), svc)).To(Succeed())
			Expect(metav1.IsControlledBy(svc, lane)).To(BeTrue())
			Expect(svc.Labels).To(HaveKeyWithValue(endpoints.ServiceManagedByLabel, endpoints.ManagedBy))
			Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.30"}}))
		})
	})

	It("should give a lane a selector-less Service whose endpoints follow its Ready placements", func() {
		seq++
		lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-%d", seq), Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
				Rungs: []v1.Rung{128}, Replicas: 3, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, lane)).To(Succeed())
		a, b, c := node("192.0.2.1", 8080), node("192.0.2.2", 8080), node("192.0.2.3", 9090)
		pa := placement(lane, a, v1.PhaseReady)
		placement(lane, b, v1.PhaseCompiling)
		placement(lane, c, v1.PhaseReady)

		ctl := newController()
		_, err := ctl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
		Expect(err).NotTo(HaveOccurred())
		svc := &corev1.Service{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), svc)).To(Succeed())
		Expect(svc.Spec.Selector).To(BeEmpty())
		Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(endpoints.ServicePort))
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.1"}, 9090: {"192.0.2.3"}}))

		// A placement that stops being Ready leaves the endpoints.
		pa.Status.Phase = v1.PhaseFailed
		Expect(kube.Status().Update(ctx, pa)).To(Succeed())
		_, err = ctl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{9090: {"192.0.2.3"}}))
	})

	It("should leave out addresses an EndpointSlice cannot hold, and still list the others", func() {
		seq++
		lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-%d", seq), Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
				Rungs: []v1.Rung{128}, Replicas: 3, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, lane)).To(Succeed())
		placement(lane, node("127.0.0.1", 8080), v1.PhaseReady)
		placement(lane, node("169.254.1.1", 8080), v1.PhaseReady)
		placement(lane, node("192.0.2.9", 8080), v1.PhaseReady)

		_, err := newController().Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.9"}}))
	})

	It("should list only the placements of the lane's vector space, and switch to another in one EndpointSlice update", func() {
		seq++
		lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-%d", seq), Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
				Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, lane)).To(Succeed())
		inSpace := func(n *v1.MacNode, space string) {
			GinkgoHelper()
			p := &v1.LanePlacement{
				ObjectMeta: metav1.ObjectMeta{Name: lane.Name + "-" + n.Name, Namespace: lane.Namespace, Labels: map[string]string{v1.LabelLane: lane.Name, v1.LabelNode: n.Name}},
				Spec: v1.LanePlacementSpec{Lane: lane.Name, Node: n.Name, Identity: "gte-" + space, VectorSpaceID: space, Task: v1.TaskEmbed, Device: v1.DeviceANE,
					Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30},
			}
			Expect(kube.Create(ctx, p)).To(Succeed())
			p.Status.Phase = v1.PhaseReady
			Expect(kube.Status().Update(ctx, p)).To(Succeed())
		}
		inSpace(node("192.0.2.41", 8080), "gte-v1")
		inSpace(node("192.0.2.42", 8080), "gte-v2")
		setSpace := func(space string) {
			GinkgoHelper()
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), lane)).To(Succeed())
			lane.Status.VectorSpaceID = space
			Expect(kube.Status().Update(ctx, lane)).To(Succeed())
			_, err := newController().Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)})
			Expect(err).NotTo(HaveOccurred())
		}
		setSpace("gte-v1")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.41"}}), "the new space is Ready but the lane has not switched")
		slice := &discoveryv1.EndpointSlice{}
		Expect(kube.Get(ctx, client.ObjectKey{Namespace: lane.Namespace, Name: lane.Name + "-8080"}, slice)).To(Succeed())
		before := slice.Generation

		setSpace("gte-v2")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.42"}}))
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(slice), slice)).To(Succeed())
		Expect(slice.Generation).To(Equal(before+1), "the switch is one update of the slice")
	})
})
