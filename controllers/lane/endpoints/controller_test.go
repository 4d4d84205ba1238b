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
	"errors"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
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

// endpointsSpace is the vector space, and its generation, the lane's status says its
// EndpointSlices were written for, as "<space>@<generation>".
func endpointsSpace(lane *v1.CatalogLane) string {
	GinkgoHelper()
	got := &v1.CatalogLane{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
	if got.Status.EndpointsVectorSpaceID == "" && got.Status.EndpointsVectorSpaceGeneration == 0 {
		return ""
	}
	return fmt.Sprintf("%s@%d", got.Status.EndpointsVectorSpaceID, got.Status.EndpointsVectorSpaceGeneration)
}

// laneOf creates a one-rung embed lane of replicas.
func laneOf(replicas int32) *v1.CatalogLane {
	GinkgoHelper()
	seq++
	lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-%d", seq), Namespace: "default"},
		Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
			Rungs: []v1.Rung{128}, Replicas: replicas, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	Expect(kube.Create(ctx, lane)).To(Succeed())
	return lane
}

// readyInSpace places the lane on n with an identity of vector space space, Ready.
func readyInSpace(lane *v1.CatalogLane, n *v1.MacNode, space string) {
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

// switchSpace has the lane answer in space and reconciles its endpoints through c.
func switchSpace(c client.Client, lane *v1.CatalogLane, space string) {
	GinkgoHelper()
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), lane)).To(Succeed())
	if lane.Status.VectorSpaceID != "" && lane.Status.VectorSpaceID != space {
		lane.Status.VectorSpaceGeneration++ // as the placement controller counts switches
	}
	lane.Status.VectorSpaceID = space
	Expect(kube.Status().Update(ctx, lane)).To(Succeed())
	_, err := reconcileLane(c, lane)
	Expect(err).NotTo(HaveOccurred())
}

// afterSliceWrites is the suite's client, calling written after each EndpointSlice write the
// API server accepted ("create", "patch" or "delete"), in order.
func afterSliceWrites(written func(verb string, o client.Object)) client.Client {
	after := func(verb string, o client.Object, err error) error {
		if _, ok := o.(*discoveryv1.EndpointSlice); ok && err == nil {
			written(verb, o)
		}
		return err
	}
	return interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			return after("create", o, c.Create(ctx, o, opts...))
		},
		Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
			return after("patch", o, c.Patch(ctx, o, p, opts...))
		},
		Delete: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.DeleteOption) error {
			return after("delete", o, c.Delete(ctx, o, opts...))
		},
	})
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

			_, err := reconcileLane(kube, lane)
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
			_, err = reconcileLane(kube, lane)
			Expect(err).NotTo(HaveOccurred())
			Expect(serviceCondition(lane).Reason).To(Equal(v1.LaneReasonServiceNameTaken))
			Expect(endpointIPs(lane)).To(BeEmpty())

			Expect(kube.Delete(ctx, svc)).To(Succeed())
			_, err = reconcileLane(kube, lane)
			Expect(err).NotTo(HaveOccurred())
			Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue))
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(foreign), svc)).To(Succeed())
			Expect(metav1.IsControlledBy(svc, lane)).To(BeTrue())
			Expect(svc.Labels).To(HaveKeyWithValue(endpoints.ServiceManagedByLabel, endpoints.ManagedBy))
			Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.30"}}))
		})
	})

	It("should not take its own Service and EndpointSlice, just created and not yet in its cache, for another's", func() {
		lane := laneOf(1)
		readyInSpace(lane, node("192.0.2.60", 8080), "gte-v1")
		switchSpace(kube, lane, "gte-v1")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.60"}}))
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue))
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)}

		// A cache a moment behind, that does not show the Service yet.
		noService := interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*corev1.Service); ok {
					return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
				}
				return c.Get(ctx, key, o, opts...)
			},
		})
		res, err := endpoints.NewServiceController(clk, noService).WithAPIReader(kube).Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.RequeueAfter).To(Equal(endpoints.NotCachedRetry), "the lane comes back once the cache shows it")
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue), "its own Service is not another's")

		// One that does not show the EndpointSlice yet.
		noSlice := interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
				if _, ok := o.(*discoveryv1.EndpointSlice); ok {
					return apierrors.NewNotFound(schema.GroupResource{}, key.Name)
				}
				return c.Get(ctx, key, o, opts...)
			},
			List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
				if _, ok := list.(*discoveryv1.EndpointSliceList); ok {
					return nil
				}
				return c.List(ctx, list, opts...)
			},
		})
		res, err = endpoints.NewController(clk, noSlice, policy).WithAPIReader(kube).Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.RequeueAfter).To(Equal(endpoints.NotCachedRetry), "the lane comes back once the cache shows it")
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue), "its own EndpointSlice is not another's")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.60"}}))
	})

	It("should write no EndpointSlice for a lane until its Service is there, and then at once", func() {
		lane := laneOf(1)
		placement(lane, node("192.0.2.61", 8080), v1.PhaseReady)
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)}
		_, err := newController().Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(BeEmpty(), "a slice of the lane's name would feed whatever Service takes the name")
		Expect(serviceCondition(lane)).To(BeNil())

		_, err = endpoints.NewServiceController(clk, kube).Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(BeEmpty(), "the Service controller writes the Service alone")
		_, err = newController().Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.61"}}))
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue))

		// Its Service deleted: the slices go with it, and the lane says so.
		Expect(kube.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: lane.Name, Namespace: lane.Namespace}})).To(Succeed())
		_, err = newController().Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(BeEmpty())
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionFalse))
		Expect(serviceCondition(lane).Reason).To(Equal(v1.LaneReasonServiceMissing))
		Expect(serviceCondition(lane).Message).To(ContainSubstring("Service default/" + lane.Name + " is gone"))
		_, err = reconcileLane(kube, lane) // made again
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.61"}}))
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue))

		// Deleted again, and the name taken by another's before it is made again.
		Expect(kube.Delete(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: lane.Name, Namespace: lane.Namespace}})).To(Succeed())
		Expect(kube.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: lane.Name, Namespace: lane.Namespace},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "web", Port: 8443}}}})).To(Succeed())
		_, err = newController().Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(BeEmpty())
		res, err := endpoints.NewServiceController(clk, kube).Reconcile(ctx, req)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.RequeueAfter).To(Equal(endpoints.TakenRetry), "no event says when the other's Service goes")
		Expect(serviceCondition(lane).Reason).To(Equal(v1.LaneReasonServiceNameTaken))
	})

	It("should leave out a lane whose EndpointSlice name is another's, say so, and try the name again", func() {
		lane := laneOf(1)
		theirs := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: lane.Name + "-8080", Namespace: lane.Namespace},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"198.51.100.7"}}}}
		Expect(kube.Create(ctx, theirs)).To(Succeed())
		placement(lane, node("192.0.2.63", 8080), v1.PhaseReady)
		res, err := reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.RequeueAfter).To(Equal(endpoints.TakenRetry), "no event says when the other's slice goes")
		c := serviceCondition(lane)
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(v1.LaneReasonServiceNameTaken))
		Expect(c.Message).To(ContainSubstring("EndpointSlice default/" + theirs.Name))
		got := &discoveryv1.EndpointSlice{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(theirs), got)).To(Succeed())
		Expect(got.Endpoints).To(Equal(theirs.Endpoints), "another's slice was changed")

		Expect(kube.Delete(ctx, theirs)).To(Succeed())
		res, err = reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.RequeueAfter).To(BeZero())
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue))
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.63"}}))
	})

	It("should say on the lane why the API server refused its Service, and make it once it may", func() {
		lane := laneOf(1)
		placement(lane, node("192.0.2.62", 8080), v1.PhaseReady)
		req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)}
		quota := apierrors.NewForbidden(schema.GroupResource{Resource: "services"}, lane.Name, errors.New("exceeded quota: services, requested: services=1, used: services=10, limited: services=10"))
		refusing := interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
			Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
				if _, ok := o.(*corev1.Service); ok {
					return quota
				}
				return c.Create(ctx, o, opts...)
			},
		})
		_, err := endpoints.NewServiceController(clk, refusing).Reconcile(ctx, req)
		Expect(err).To(MatchError(ContainSubstring("exceeded quota")), "returned, for the workqueue to try again with its backoff")
		c := serviceCondition(lane)
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(v1.LaneReasonServiceFailed))
		Expect(c.Message).To(ContainSubstring("exceeded quota: services"))
		Expect(endpointIPs(lane)).To(BeEmpty())

		_, err = reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		Expect(serviceCondition(lane).Status).To(Equal(metav1.ConditionTrue))
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.62"}}))
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

		_, err := reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		svc := &corev1.Service{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), svc)).To(Succeed())
		Expect(svc.Spec.Selector).To(BeEmpty())
		Expect(svc.Spec.Ports[0].Port).To(BeEquivalentTo(endpoints.ServicePort))
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.1"}, 9090: {"192.0.2.3"}}))
		// The port says it is TLS, in the Service and in every slice, under the name kube-proxy
		// matches them by.
		Expect(svc.Spec.Ports[0].AppProtocol).To(HaveValue(Equal("https")))
		var slices discoveryv1.EndpointSliceList
		Expect(kube.List(ctx, &slices, client.InNamespace(lane.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: lane.Name})).To(Succeed())
		Expect(slices.Items).To(HaveLen(2))
		for _, s := range slices.Items {
			Expect(s.Ports).To(HaveLen(1))
			Expect(s.Ports[0].AppProtocol).To(HaveValue(Equal("https")))
			Expect(s.Ports[0].Name).To(HaveValue(Equal(svc.Spec.Ports[0].Name)))
		}

		// A placement that stops being Ready leaves the endpoints.
		pa.Status.Phase = v1.PhaseFailed
		Expect(kube.Status().Update(ctx, pa)).To(Succeed())
		_, err = reconcileLane(kube, lane)
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

		_, err := reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.9"}}))
	})

	It("should list only the placements of the lane's vector space, and switch to another in one EndpointSlice update", func() {
		lane := laneOf(1)
		readyInSpace(lane, node("192.0.2.41", 8080), "gte-v1")
		readyInSpace(lane, node("192.0.2.42", 8080), "gte-v2")
		setSpace := func(space string) { GinkgoHelper(); switchSpace(kube, lane, space) }
		setSpace("gte-v1")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.41"}}), "the new space is Ready but the lane has not switched")
		slice := &discoveryv1.EndpointSlice{}
		Expect(kube.Get(ctx, client.ObjectKey{Namespace: lane.Namespace, Name: lane.Name + "-8080"}, slice)).To(Succeed())
		before := slice.Generation

		setSpace("gte-v2")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.42"}}))
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(slice), slice)).To(Succeed())
		Expect(slice.Generation).To(Equal(before+1), "the switch is one update of the slice")
		Expect(endpointsSpace(lane)).To(Equal("gte-v2@1"), "the lane says its slices follow the switch: its old placements may drain")
	})

	It("should list a placement made before placements carried their vector space only in its identity's space", func() {
		id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-legacy-%d", seq)},
			Spec: v1.CertifiedIdentitySpec{
				Worker: v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: "sha256:1111111111111111111111111111111111111111111111111111111111111111", ProtocolVersion: 3, Backend: v1.BackendSim},
				Model: v1.ModelIdentity{Name: "gte-modernbert-base", Revision: "e7f32e3", Layers: 22, HiddenSize: 768, EmbeddingDimensions: 768,
					CheckpointDigest: "sha256:0d3b4c1f8e2a7b6c5d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"},
				ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: "sha256:9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"},
				MacOSBuild:       "25B78", VectorSpaceID: "gte-v1"}}
		Expect(kube.Create(ctx, id)).To(Succeed())
		lane := laneOf(1)
		n := node("192.0.2.48", 8080)
		// No spec.vectorSpaceID: made by an older controller.
		legacy := &v1.LanePlacement{
			ObjectMeta: metav1.ObjectMeta{Name: lane.Name + "-" + n.Name, Namespace: lane.Namespace, Labels: map[string]string{v1.LabelLane: lane.Name, v1.LabelNode: n.Name}},
			Spec: v1.LanePlacementSpec{Lane: lane.Name, Node: n.Name, Identity: id.Name, Task: v1.TaskEmbed, Device: v1.DeviceANE,
				Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, legacy)).To(Succeed())
		legacy.Status.Phase = v1.PhaseReady
		Expect(kube.Status().Update(ctx, legacy)).To(Succeed())
		readyInSpace(lane, node("192.0.2.49", 8080), "gte-v2")
		switchSpace(kube, lane, "gte-v1")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.48"}}))
		switchSpace(kube, lane, "gte-v2")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.49"}}), "the legacy placement answers in its identity's space, not the new one")
	})

	It("should write nothing of its endpoints' vector space for a lane that never switched spaces: there is nothing to drain", func() {
		lane := laneOf(1)
		readyInSpace(lane, node("192.0.2.47", 8080), "gte-v1")
		switchSpace(kube, lane, "gte-v1")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.47"}}))
		Expect(endpointsSpace(lane)).To(BeEmpty())
	})

	It("should say its EndpointSlices follow a switch of the lane's vector space only once they are written", func() {
		lane := laneOf(1)
		readyInSpace(lane, node("192.0.2.45", 8080), "gte-v1")
		readyInSpace(lane, node("192.0.2.46", 8080), "gte-v2")
		switchSpace(kube, lane, "gte-v1")
		Expect(endpointsSpace(lane)).To(BeEmpty(), "a lane's first space is no switch")

		// The slice's update fails (the API server busy, a webhook down): the old placements
		// may still be listed, so the lane must not say the slices follow.
		refused := errors.New("the API server is busy")
		failing := interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
			Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
				if _, ok := o.(*discoveryv1.EndpointSlice); ok {
					return refused
				}
				return c.Patch(ctx, o, p, opts...)
			},
		})
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), lane)).To(Succeed())
		lane.Status.VectorSpaceID, lane.Status.VectorSpaceGeneration = "gte-v2", 1
		Expect(kube.Status().Update(ctx, lane)).To(Succeed())
		_, err := reconcileLane(failing, lane)
		Expect(err).To(MatchError(refused))
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.45"}}))
		Expect(endpointsSpace(lane)).To(BeEmpty(), "the slices still list the old space")

		_, err = reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.46"}}))
		Expect(endpointsSpace(lane)).To(Equal("gte-v2@1"))

		// Back to the first space (a rollback): a new generation, which the slices follow too.
		switchSpace(kube, lane, "gte-v1")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.45"}}))
		Expect(endpointsSpace(lane)).To(Equal("gte-v1@2"))
	})

	It("should never list two vector spaces at once when the spaces serve on different ports: the old space's slice goes before the new one's is written", func() {
		lane := laneOf(1)
		readyInSpace(lane, node("192.0.2.43", 8081), "gte-v1")
		readyInSpace(lane, node("192.0.2.44", 8082), "gte-v2")
		// The slices' writes, in order, as the API server receives them.
		var writes []string
		watched := afterSliceWrites(func(verb string, o client.Object) { writes = append(writes, verb+" "+o.GetName()) })
		setSpace := func(space string) { GinkgoHelper(); switchSpace(watched, lane, space) }
		setSpace("gte-v1")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8081: {"192.0.2.43"}}))
		writes = nil
		setSpace("gte-v2")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8082: {"192.0.2.44"}}))
		Expect(writes).To(Equal([]string{"delete " + lane.Name + "-8081", "create " + lane.Name + "-8082"}),
			"the old space leaves before the new arrives: no moment lists both")
	})

	It("should never list two vector spaces at once when both spaces serve on the same several ports, after any one of its writes", func() {
		lane := laneOf(2)
		space := map[string]string{}
		for _, m := range []struct {
			ip    string
			port  int32
			space string
		}{{"192.0.2.51", 8093, "gte-v1"}, {"192.0.2.52", 8094, "gte-v1"}, {"192.0.2.53", 8093, "gte-v2"}, {"192.0.2.54", 8094, "gte-v2"}} {
			space[m.ip] = m.space
			readyInSpace(lane, node(m.ip, m.port), m.space)
		}
		// After every write to a slice, what a client listing the slices sees: the spaces of the
		// addresses listed.
		var seen []map[string]bool
		look := func() {
			spaces := map[string]bool{}
			for _, addrs := range endpointIPs(lane) {
				for _, a := range addrs {
					spaces[space[a]] = true
				}
			}
			seen = append(seen, spaces)
		}
		watched := afterSliceWrites(func(string, client.Object) { look() })
		setSpace := func(space string) { GinkgoHelper(); switchSpace(watched, lane, space) }
		setSpace("gte-v1")
		Expect(endpointIPs(lane)).To(HaveLen(2))
		seen = nil
		setSpace("gte-v2")
		Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8093: {"192.0.2.53"}, 8094: {"192.0.2.54"}}))
		Expect(seen).NotTo(BeEmpty())
		for i, spaces := range seen {
			Expect(len(spaces)).To(BeNumerically("<=", 1), "after write %d of %d a client saw the spaces %v", i+1, len(seen), spaces)
		}
	})

	Context("when a node is lost", func() {
		It("should drop its endpoint as the node goes Unknown, on the lifecycle controller's fake clock, not at the eviction", func() {
			Expect(client.IgnoreAlreadyExists(kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lifecycle.LeaseNamespace}}))).To(Succeed())
			lane := newLane()
			alive, dying := node("192.0.2.51", 8080), node("192.0.2.52", 8080)
			for _, n := range []*v1.MacNode{alive, dying} {
				n.Status.Conditions = []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed,
					LastTransitionTime: metav1.NewTime(clk.Now())}}
				Expect(kube.Status().Update(ctx, n)).To(Succeed())
				Expect(kube.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Namespace: lifecycle.LeaseNamespace},
					Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(n.Name), RenewTime: ptr.To(metav1.NewMicroTime(clk.Now()))}})).To(Succeed())
				placement(lane, n, v1.PhaseReady)
			}
			lc := lifecycle.NewController(clk, kube, events.NewFakeRecorder(10))
			reconcileBoth := func() {
				GinkgoHelper()
				for _, n := range []*v1.MacNode{alive, dying} {
					_, err := lc.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(n)})
					Expect(err).NotTo(HaveOccurred())
				}
				_, err := reconcileLane(kube, lane)
				Expect(err).NotTo(HaveOccurred())
			}
			reconcileBoth()
			Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.51", "192.0.2.52"}}))

			// The agent of one renews; the other's Lease runs out.
			clk.Step(lifecycle.DefaultGracePeriod + time.Second)
			lease := &coordinationv1.Lease{}
			Expect(kube.Get(ctx, client.ObjectKey{Namespace: lifecycle.LeaseNamespace, Name: alive.Name}, lease)).To(Succeed())
			lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(clk.Now()))
			Expect(kube.Update(ctx, lease)).To(Succeed())
			reconcileBoth()
			Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {"192.0.2.51"}}), "the lost node left at the grace period")
			p := &v1.LanePlacement{}
			Expect(kube.Get(ctx, client.ObjectKey{Namespace: lane.Namespace, Name: lane.Name + "-" + dying.Name}, p)).To(Succeed())
			Expect(p.DeletionTimestamp).To(BeNil(), "its placement is kept until the eviction timeout")
			Expect(meta.IsStatusConditionFalse(p.Status.Conditions, v1.PlacementConditionNodeReady)).To(BeTrue())
		})
	})

	It("should list a placement being deleted, or whose agent is stopping, as terminating: serving, not ready", func() {
		lane := newLane()
		stopping, deleted, serving := node("192.0.2.61", 8080), node("192.0.2.62", 8080), node("192.0.2.63", 8080)
		ps := placement(lane, stopping, v1.PhaseReady)
		ps.Status.Conditions = []metav1.Condition{{Type: v1.PlacementConditionTerminating, Status: metav1.ConditionTrue, Reason: v1.PlacementReasonAgentStopping,
			Message: "stopping", LastTransitionTime: metav1.NewTime(clk.Now())}}
		Expect(kube.Status().Update(ctx, ps)).To(Succeed())
		pd := placement(lane, deleted, v1.PhaseReady)
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(pd), pd)).To(Succeed())
		pd.Finalizers = []string{v1.FinalizerRetirement}
		Expect(kube.Update(ctx, pd)).To(Succeed())
		Expect(kube.Delete(ctx, pd)).To(Succeed())
		placement(lane, serving, v1.PhaseReady)
		_, err := reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())

		var list discoveryv1.EndpointSliceList
		Expect(kube.List(ctx, &list, client.InNamespace(lane.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: lane.Name})).To(Succeed())
		Expect(list.Items).To(HaveLen(1))
		got := map[string][3]bool{}
		for _, e := range list.Items[0].Endpoints {
			got[e.Addresses[0]] = [3]bool{*e.Conditions.Ready, *e.Conditions.Serving, *e.Conditions.Terminating}
		}
		Expect(got).To(Equal(map[string][3]bool{"192.0.2.61": {false, true, true}, "192.0.2.62": {false, true, true}, "192.0.2.63": {true, true, false}}))
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(ps), ps)).To(Succeed())
		Expect(meta.IsStatusConditionTrue(ps.Status.Conditions, v1.PlacementConditionDrained)).To(BeTrue(),
			"the stopping agent is told it may close its server once the slice lists it not ready")

		// The agent runs again: no longer terminating, the confirmation is cleared.
		meta.RemoveStatusCondition(&ps.Status.Conditions, v1.PlacementConditionTerminating)
		Expect(kube.Status().Update(ctx, ps)).To(Succeed())
		_, err = reconcileLane(kube, lane)
		Expect(err).NotTo(HaveOccurred())
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(ps), ps)).To(Succeed())
		Expect(meta.FindStatusCondition(ps.Status.Conditions, v1.PlacementConditionDrained)).To(BeNil())
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(pd), pd)).To(Succeed())
		pd.Finalizers = nil
		Expect(kube.Update(ctx, pd)).To(Succeed())
	})
})
