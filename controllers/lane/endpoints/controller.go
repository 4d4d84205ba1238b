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

// Package endpoints keeps, per CatalogLane, a selector-less Service and EndpointSlices listing
// the lane's Ready placements' node addresses and serving ports, so in-cluster clients call
// http://<lane>.<namespace>.svc/v1/embeddings and reach only nodes that serve the lane.
package endpoints

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=discovery.k8s.io,resources=endpointslices,verbs=get;list;watch;create;update;patch;delete

const (
	// ServicePort is the lane Service's port; it forwards to each node's serving port.
	ServicePort = 80
	managedBy   = "synapse-controller.fleet.synapse.dev"
)

// Controller keeps lanes' Services and EndpointSlices.
type Controller struct{ kube client.Client }

// NewController returns the endpoints controller.
func NewController(kube client.Client) *Controller { return &Controller{kube: kube} }

// Name of the controller.
func (c *Controller) Name() string { return "lane.endpoints" }

// Register watches lanes, their placements (readiness) and nodes (addresses).
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	laneOf := handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
		if lane := o.GetLabels()[v1.LabelLane]; lane != "" {
			return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: lane}}}
		}
		return nil
	})
	lanesOnNode := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		var ps v1.LanePlacementList
		if err := c.kube.List(ctx, &ps, client.MatchingLabels{v1.LabelNode: o.GetName()}); err != nil {
			return nil
		}
		var out []reconcile.Request
		for _, p := range ps.Items {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: p.Namespace, Name: p.Spec.Lane}})
		}
		return out
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.CatalogLane{}).
		Owns(&corev1.Service{}).
		Owns(&discoveryv1.EndpointSlice{}).
		Watches(&v1.LanePlacement{}, laneOf).
		Watches(&v1.MacNode{}, lanesOnNode).
		Complete(c)
}

// Reconcile writes one lane's Service and EndpointSlices.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lane := &v1.CatalogLane{}
	if err := c.kube.Get(ctx, req.NamespacedName, lane); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !lane.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	if err := c.service(ctx, lane); err != nil {
		return reconcile.Result{}, err
	}
	byPort, err := c.readyEndpoints(ctx, lane)
	if err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{}, c.slices(ctx, lane, byPort)
}

func (c *Controller) service(ctx context.Context, lane *v1.CatalogLane) error {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: lane.Name, Namespace: lane.Namespace}}
	_, err := controllerutil.CreateOrPatch(ctx, c.kube, svc, func() error {
		svc.Labels = map[string]string{v1.LabelLane: lane.Name}
		// No selector: the endpoints are Macs, not Pods; this controller writes them.
		svc.Spec.Selector = nil
		svc.Spec.Ports = []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: ServicePort, TargetPort: intstr.FromString("http")}}
		return controllerutil.SetControllerReference(lane, svc, c.kube.Scheme())
	})
	return err
}

// readyEndpoints groups the IPv4 addresses of the nodes whose placement of lane is Ready by
// their serving port (one EndpointSlice carries one set of ports).
func (c *Controller) readyEndpoints(ctx context.Context, lane *v1.CatalogLane) (map[int32][]string, error) {
	var ps v1.LanePlacementList
	if err := c.kube.List(ctx, &ps, client.InNamespace(lane.Namespace), client.MatchingLabels{v1.LabelLane: lane.Name}); err != nil {
		return nil, err
	}
	out := map[int32][]string{}
	for _, p := range ps.Items {
		if p.Status.Phase != v1.PhaseReady || !p.DeletionTimestamp.IsZero() {
			continue
		}
		node := &v1.MacNode{}
		if err := c.kube.Get(ctx, client.ObjectKey{Name: p.Spec.Node}, node); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return nil, err
		}
		if node.Status.ServingPort == 0 {
			continue
		}
		for _, a := range node.Status.Addresses {
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || !ip.Is4() || a.Type != "InternalIP" {
				continue
			}
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() || ip.IsUnspecified() {
				// An EndpointSlice may not hold these; no in-cluster client could reach them.
				log.FromContext(ctx).Info("a Ready node's address cannot be an endpoint", "node", node.Name, "address", a.Address)
				continue
			}
			out[node.Status.ServingPort] = append(out[node.Status.ServingPort], a.Address)
			break
		}
	}
	for port := range out {
		slices.Sort(out[port])
	}
	return out, nil
}

// slices writes one EndpointSlice per serving port and deletes the ones no longer needed.
func (c *Controller) slices(ctx context.Context, lane *v1.CatalogLane, byPort map[int32][]string) error {
	var existing discoveryv1.EndpointSliceList
	if err := c.kube.List(ctx, &existing, client.InNamespace(lane.Namespace),
		client.MatchingLabels{discoveryv1.LabelServiceName: lane.Name, discoveryv1.LabelManagedBy: managedBy}); err != nil {
		return err
	}
	wanted := map[string]bool{}
	for port, addrs := range byPort {
		name := fmt.Sprintf("%s-%d", lane.Name, port)
		wanted[name] = true
		slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: lane.Namespace}}
		_, err := controllerutil.CreateOrPatch(ctx, c.kube, slice, func() error {
			slice.Labels = map[string]string{discoveryv1.LabelServiceName: lane.Name, discoveryv1.LabelManagedBy: managedBy, v1.LabelLane: lane.Name}
			slice.AddressType = discoveryv1.AddressTypeIPv4
			slice.Ports = []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(port)}}
			var eps []discoveryv1.Endpoint
			for _, a := range addrs {
				eps = append(eps, discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})
			}
			slice.Endpoints = eps
			return controllerutil.SetControllerReference(lane, slice, c.kube.Scheme())
		})
		if err != nil {
			return err
		}
	}
	for _, s := range existing.Items {
		if !wanted[s.Name] && strings.HasPrefix(s.Name, lane.Name+"-") {
			if err := c.kube.Delete(ctx, &s); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}
