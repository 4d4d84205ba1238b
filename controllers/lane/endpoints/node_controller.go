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

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/enqueue"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes/status,verbs=get;update;patch

// AddressController sets each MacNode's AddressAllowed condition: whether the lanes'
// EndpointSlices may list the address its agent reports, and if not, why. The lane controller
// applies the same AddressPolicy; this one makes a refusal visible on the node.
type AddressController struct {
	clk    clock.PassiveClock
	kube   client.Client
	policy AddressPolicy
}

// NewAddressController returns the MacNode address controller.
func NewAddressController(clk clock.PassiveClock, kube client.Client, policy AddressPolicy) *AddressController {
	return &AddressController{clk: clk, kube: kube, policy: policy}
}

// Name of the controller.
func (c *AddressController) Name() string { return "macnode.address" }

// Register watches MacNodes, and the cluster's own ranges (ServiceCIDRs, and Nodes whose pod
// CIDRs or addresses change), which can turn an allowed address into a refused one.
func (c *AddressController) Register(_ context.Context, mgr ctrl.Manager) error {
	all := enqueue.All(c.kube, func() client.ObjectList { return &v1.MacNodeList{} }, false)
	return ctrl.NewControllerManagedBy(mgr).
		Named(c.Name()).
		For(&v1.MacNode{}, builder.WithPredicates(AddressChanges)).
		Watches(&networkingv1.ServiceCIDR{}, all).
		Watches(&corev1.Node{}, all, builder.WithPredicates(nodeRangeChanges)).
		Complete(c)
}

// AddressChanges passes MacNode events that can change the condition: a new node, another
// address, or a condition someone else's status write dropped, and a change of the condition
// itself. The last is the controller's own write coming back: the pass it brings reads a cache
// that shows that write. Without it, a pass that ran before the cache showed the write (the
// cluster's ranges changed and changed back within a moment) compared against the condition
// as it stood before, found nothing to change, and the condition stayed as written.
var AddressChanges = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*v1.MacNode)
	cur, ok2 := e.ObjectNew.(*v1.MacNode)
	if !ok1 || !ok2 {
		return true
	}
	was := meta.FindStatusCondition(old.Status.Conditions, v1.NodeConditionAddressAllowed)
	is := meta.FindStatusCondition(cur.Status.Conditions, v1.NodeConditionAddressAllowed)
	return !equality.Semantic.DeepEqual(old.Status.Addresses, cur.Status.Addresses) || is == nil ||
		was == nil || was.Status != is.Status || was.Reason != is.Reason || was.Message != is.Message
}}

// nodeRangeChanges passes Node events that change the cluster's ranges; kubelets update their
// Nodes often for other reasons.
var nodeRangeChanges = predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
	old, ok1 := e.ObjectOld.(*corev1.Node)
	cur, ok2 := e.ObjectNew.(*corev1.Node)
	if !ok1 || !ok2 {
		return true
	}
	return !equality.Semantic.DeepEqual(old.Spec.PodCIDRs, cur.Spec.PodCIDRs) ||
		!equality.Semantic.DeepEqual(old.Status.Addresses, cur.Status.Addresses)
}}

// Reconcile sets one MacNode's AddressAllowed condition.
func (c *AddressController) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	node := &v1.MacNode{}
	if err := c.kube.Get(ctx, req.NamespacedName, node); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	cluster, err := ClusterRanges(ctx, c.kube)
	if err != nil {
		return reconcile.Result{}, err
	}
	cond := metav1.Condition{Type: v1.NodeConditionAddressAllowed, ObservedGeneration: node.Generation,
		LastTransitionTime: metav1.NewTime(c.clk.Now())}
	ip, err := c.policy.nodeAddress(node, cluster)
	var refused *AddressRefusedError
	switch {
	case err == nil:
		cond.Status, cond.Reason = metav1.ConditionTrue, v1.NodeReasonAddressAllowed
		cond.Message = fmt.Sprintf("address %s is inside the allowed CIDRs; the lanes' EndpointSlices list it", ip)
	case errors.As(err, &refused):
		cond.Status, cond.Reason = metav1.ConditionFalse, refused.Reason
		cond.Message = refused.Error() + "; the lanes' EndpointSlices leave this node out"
	default:
		return reconcile.Result{}, err
	}
	if !statusapply.Changed(node.Status.Conditions, cond) {
		return reconcile.Result{}, nil
	}
	// Applied on its own: the agent's and the lifecycle controller's conditions are theirs
	// (internal/statusapply).
	cond = statusapply.Next(node.Status.Conditions, cond)
	return reconcile.Result{}, statusapply.ApplyCondition(ctx, c.kube, node.Name,
		statusapply.Manager(statusapply.AddressManager, v1.NodeConditionAddressAllowed), cond)
}
