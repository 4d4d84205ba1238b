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

package prewarm

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/enqueue"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=prewarmpolicies,verbs=get;list;watch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=prewarmpolicies/status,verbs=get;update;patch

// Controller reports on each PrewarmPolicy the lanes it applies to and its conflicts.
type Controller struct {
	clk  clock.PassiveClock
	kube client.Client
}

// NewController returns the prewarm policy controller.
func NewController(clk clock.PassiveClock, kube client.Client) *Controller {
	return &Controller{clk: clk, kube: kube}
}

// Name of the controller.
func (c *Controller) Name() string { return "prewarm" }

// Register watches policies and the lanes of their namespace.
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	policiesOf := enqueue.All(c.kube, func() client.ObjectList { return &v1.PrewarmPolicyList{} }, true)
	return ctrl.NewControllerManagedBy(mgr).Named(c.Name()).
		For(&v1.PrewarmPolicy{}).
		Watches(&v1.CatalogLane{}, policiesOf).
		Watches(&v1.PrewarmPolicy{}, policiesOf).
		Complete(c)
}

// Reconcile updates one policy's status.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	policy := &v1.PrewarmPolicy{}
	if err := c.kube.Get(ctx, req.NamespacedName, policy); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var policies v1.PrewarmPolicyList
	if err := c.kube.List(ctx, &policies, client.InNamespace(policy.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	var lanes v1.CatalogLaneList
	if err := c.kube.List(ctx, &lanes, client.InNamespace(policy.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	stored := policy.DeepCopy()
	selected := int32(0)
	lost := map[string][]string{} // winner -> lanes this policy lost to it
	for i := range lanes.Items {
		r := Resolve(&lanes.Items[i], policies.Items)
		switch {
		case r.Policy == policy.Name:
			selected++
		case slices.Contains(r.Losers, policy.Name):
			lost[r.Policy] = append(lost[r.Policy], lanes.Items[i].Name)
		}
	}
	policy.Status.ObservedGeneration, policy.Status.SelectedLanes = policy.Generation, selected
	now := metav1.NewTime(c.clk.Now())
	conflict := metav1.Condition{Type: v1.PrewarmConditionConflict, Status: metav1.ConditionFalse, Reason: "NoConflict",
		Message: "no other policy selects the lanes this one selects", ObservedGeneration: policy.Generation, LastTransitionTime: now}
	if len(lost) > 0 {
		conflict.Status, conflict.Reason = metav1.ConditionTrue, "LostByName"
		conflict.Message = fmt.Sprintf("other policies also select some lanes and win by name order: %v", lost)
	}
	meta.SetStatusCondition(&policy.Status.Conditions, conflict)
	meta.SetStatusCondition(&policy.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue,
		Reason: "Resolved", Message: fmt.Sprintf("applies to %d lanes", selected), ObservedGeneration: policy.Generation, LastTransitionTime: now})
	if equality.Semantic.DeepEqual(stored.Status, policy.Status) {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, c.kube.Status().Patch(ctx, policy, client.MergeFrom(stored))
}
