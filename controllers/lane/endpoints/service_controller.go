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

package endpoints

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// +kubebuilder:rbac:groups="",resources=services,verbs=get;list;watch;create;update;patch

// ServiceController keeps each lane's Service, apart from its EndpointSlices (Controller). The
// API server allocates ClusterIPs one at a time, cluster-wide: its allocator holds one lock
// across the creation of the address's IPAddress object, itself a request to the API server
// (kubernetes/kubernetes, pkg/registry/core/service/ipallocator/cidrallocator.go,
// MetaAllocator.AllocateNextService). On an idle envtest API server Services of a ClusterIP
// were created at 108 to 140 a second whether 1, 16 or 64 were asked at once, headless ones at
// 225 to 1,363; on the API server of make scale's rollout, at 2 to 4 a second, 4.3 s each at
// the median. In the endpoints controller's workers a burst of new lanes' Services held every
// lane's EndpointSlices behind them: at 300 Macs, 650 lanes' slices listed fewer endpoints
// than their Ready placements 10 s after every lane was Ready, and their writes waited until
// the last Service was created. Here the Services wait in their own queue.
type ServiceController struct {
	clk  clock.PassiveClock
	kube client.Client
	// reader reads the API server past the cache (the manager's, once registered; kube until
	// then): a create that finds the name taken may have met our own Service, just created and
	// not in the cache yet.
	reader client.Reader
}

// NewServiceController returns the lanes' Service controller.
func NewServiceController(clk clock.PassiveClock, kube client.Client) *ServiceController {
	return &ServiceController{clk: clk, kube: kube, reader: kube}
}

// WithAPIReader has the controller read past its client's cache with r after a create finds
// the name taken (Register sets the manager's).
func (c *ServiceController) WithAPIReader(r client.Reader) *ServiceController {
	c.reader = r
	return c
}

// Name of the controller.
func (c *ServiceController) Name() string { return "lane.service" }

// ServiceWorkers: a Service's create waits on the API server, at its allocator's lock and, on a
// busy API server, for the rest of the request as well, so several are kept in flight, as many
// as the endpoints controller had before the split. At full size (1,000 Macs, 5,000 lanes)
// make scale created 1.7 a second while the lanes were placed with 4 at once, and 1.1 to 2 a
// second with 16: at that load the allocator, not the workers, sets the pace.
const ServiceWorkers = 16

// TakenRetry is how often a lane whose Service name is another's tries it again: the cache
// holds only this controller's Services, so no event says that the other is gone.
const TakenRetry = 30 * time.Second

// Register watches lanes (a lane's Service depends on its name and UID alone, so only its
// creation, deletion and spec changes) and their Services.
func (c *ServiceController) Register(_ context.Context, mgr ctrl.Manager) error {
	c.reader = mgr.GetAPIReader()
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.CatalogLane{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Owns(&corev1.Service{}).
		WithOptions(controller.Options{MaxConcurrentReconciles: ServiceWorkers}).
		Complete(c)
}

// Reconcile creates or mends one lane's Service, or says on the lane's ServiceReady condition
// that its name is another's.
func (c *ServiceController) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	lane := &v1.CatalogLane{}
	if err := c.kube.Get(ctx, req.NamespacedName, lane); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !lane.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	err := c.service(ctx, lane)
	var refused *createRefused
	switch {
	case errors.Is(err, errNotCachedYet):
		return reconcile.Result{RequeueAfter: NotCachedRetry}, nil
	case errors.Is(err, errNameTaken):
		// The endpoints controller, finding no Service of ours, keeps the lane without slices.
		return reconcile.Result{RequeueAfter: TakenRetry}, setServiceCondition(ctx, c.kube, lane, serviceCondition(c.clk, lane, v1.LaneReasonServiceNameTaken, err), nil)
	case errors.As(err, &refused):
		// Said on the lane (a quota, a webhook, a full service range: the user's to fix), and
		// tried again with the workqueue's backoff.
		if err := setServiceCondition(ctx, c.kube, lane, serviceCondition(c.clk, lane, v1.LaneReasonServiceFailed, refused.err), nil); err != nil {
			return reconcile.Result{}, err
		}
	}
	return reconcile.Result{}, err
}

// createRefused is the API server's refusal of the Service's creation, other than its name
// being taken.
type createRefused struct{ err error }

func (e *createRefused) Error() string { return e.err.Error() }
func (e *createRefused) Unwrap() error { return e.err }

// service creates or updates the lane's Service. A Service of that name this controller did
// not create is errNameTaken: the manager's cache holds only this controller's Services, so a
// foreign one shows as a Create that finds the name taken.
func (c *ServiceController) service(ctx context.Context, lane *v1.CatalogLane) error {
	key := client.ObjectKeyFromObject(lane)
	svc := &corev1.Service{}
	err := c.kube.Get(ctx, key, svc)
	switch {
	case apierrors.IsNotFound(err):
		svc = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: lane.Name, Namespace: lane.Namespace}}
		if err := c.desiredService(lane, svc); err != nil {
			return err
		}
		err := c.kube.Create(ctx, svc)
		switch {
		case apierrors.IsAlreadyExists(err):
			return takenBy(ctx, c.reader, lane, "Service", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: lane.Name, Namespace: lane.Namespace}}, ServiceManagedByLabel)
		case apierrors.IsForbidden(err), apierrors.IsInvalid(err), apierrors.IsInternalError(err), apierrors.IsBadRequest(err):
			return &createRefused{err}
		}
		return err
	case err != nil:
		return err
	}
	if !LaneService(svc, lane.Name) {
		return fmt.Errorf("Service %s: %w", key, errNameTaken)
	}
	stored := svc.DeepCopy()
	if err := c.desiredService(lane, svc); err != nil {
		return err
	}
	if equality.Semantic.DeepEqual(stored, svc) {
		return nil
	}
	return c.kube.Patch(ctx, svc, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{}))
}

// LaneService reports whether svc is the Service of a lane named lane, as this controller
// marks the Services it writes: the agents' serving certificates name only such Services.
func LaneService(svc *corev1.Service, lane string) bool {
	return svc.Labels[ServiceManagedByLabel] == ManagedBy && ownedByLaneNamed(svc, lane)
}

// ownedByLaneNamed reports whether o's controller is a CatalogLane of that name: this lane, or
// an earlier lane of the same name whose Service the garbage collector has not removed yet.
func ownedByLaneNamed(o metav1.Object, name string) bool {
	ref := metav1.GetControllerOf(o)
	return ref != nil && ref.Kind == "CatalogLane" && ref.Name == name && strings.HasPrefix(ref.APIVersion, v1.GroupVersion.Group+"/")
}

// desiredService sets what the lane's Service must hold; an earlier lane's controller
// reference is replaced by this lane's.
func (c *ServiceController) desiredService(lane *v1.CatalogLane, svc *corev1.Service) error {
	if svc.Labels == nil {
		svc.Labels = map[string]string{}
	}
	svc.Labels[v1.LabelLane] = lane.Name
	svc.Labels[ServiceManagedByLabel] = ManagedBy
	// No selector: the endpoints are Macs, not Pods; the endpoints controller writes them.
	svc.Spec.Selector = nil
	svc.Spec.Ports = []corev1.ServicePort{{Name: PortName, Protocol: corev1.ProtocolTCP, AppProtocol: ptr.To(AppProtocol), Port: ServicePort, TargetPort: intstr.FromString(PortName)}}
	if ref := metav1.GetControllerOf(svc); ref != nil && ref.UID != lane.UID {
		svc.OwnerReferences = slices.DeleteFunc(svc.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == ref.UID })
	}
	return controllerutil.SetControllerReference(lane, svc, c.kube.Scheme())
}
