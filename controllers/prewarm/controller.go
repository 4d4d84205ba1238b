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
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/enqueue"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/names"
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

// Register watches policies and the lanes of their namespace, for the changes that can move
// which policy applies to which lane (PolicyChanges, LaneChanges): the status writes of lanes
// and policies, many a second while lanes roll out, reconcile no policy.
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	policiesOf := enqueue.All(c.kube, func() client.ObjectList { return &v1.PrewarmPolicyList{} }, true)
	return ctrl.NewControllerManagedBy(mgr).Named(c.Name()).
		For(&v1.PrewarmPolicy{}, builder.WithPredicates(PolicyChanges)).
		Watches(&v1.CatalogLane{}, policiesOf, builder.WithPredicates(LaneChanges)).
		Watches(&v1.PrewarmPolicy{}, policiesOf, builder.WithPredicates(PolicyChanges)).
		Complete(c)
}

// PolicyChanges passes a policy's creation, deletion and spec changes (its rungs, its lane
// selector): what Resolve reads of it. Its status, which this controller writes, passes nothing.
var PolicyChanges predicate.Predicate = predicate.GenerationChangedPredicate{}

// LaneChanges passes a lane's creation, deletion, spec changes (its prewarmPolicyRef) and label
// changes (what a laneSelector matches): what Resolve reads of it. Its status passes nothing.
var LaneChanges = predicate.Or[client.Object](predicate.GenerationChangedPredicate{}, predicate.LabelChangedPredicate{})

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
		conflict.Message = "other policies also select some lanes and win by name order: " + lostTo(lost)
	}
	meta.SetStatusCondition(&policy.Status.Conditions, conflict)
	meta.SetStatusCondition(&policy.Status.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue,
		Reason: "Resolved", Message: fmt.Sprintf("applies to %d lanes", selected), ObservedGeneration: policy.Generation, LastTransitionTime: now})
	if equality.Semantic.DeepEqual(stored.Status, policy.Status) {
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, c.kube.Status().Patch(ctx, policy, client.MergeFrom(stored))
}

// lostTo lists the lanes a policy lost, by the policy that won them, both in name order: the
// cache lists lanes in no order, and a message in its order was written again on every pass.
func lostTo(lost map[string][]string) string {
	var parts []string
	for _, winner := range slices.Sorted(maps.Keys(lost)) {
		parts = append(parts, fmt.Sprintf("%s:[%s]", winner, names.Some(slices.Sorted(slices.Values(lost[winner])))))
	}
	return strings.Join(parts, "; ")
}
