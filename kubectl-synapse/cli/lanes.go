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

package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

func (s *session) listOptions() []client.ListOption {
	if s.allNamespaces {
		return nil
	}
	return []client.ListOption{client.InNamespace(s.namespace)}
}

// lanes prints each lane's replicas, vector space and rollout, and, for a lane that is not
// Ready, the reason and message that say why.
func lanes(ctx context.Context, s *session, _ []string) error {
	var list v1.CatalogLaneList
	if err := s.kube.List(ctx, &list, s.listOptions()...); err != nil {
		return fmt.Errorf("listing lanes: %w", err)
	}
	slices.SortFunc(list.Items, func(a, b v1.CatalogLane) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	t := newTable(s.out, "NAMESPACE", "LANE", "READY", "UP-TO-DATE", "SPACE", "ROLLOUT", "WHY NOT READY")
	for _, l := range list.Items {
		t.row(l.Namespace, l.Name, fmt.Sprintf("%d/%d", l.Status.ReadyReplicas, l.Spec.Replicas),
			fmt.Sprint(l.Status.UpdatedReplicas), l.Status.VectorSpaceID,
			reasonOf(l.Status.Conditions, v1.LaneConditionProgressing), whyNot(l.Status.Conditions, v1.ConditionReady))
	}
	return t.flush()
}

func reasonOf(conds []metav1.Condition, typ string) string {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return c.Reason
	}
	return ""
}

// whyNot is "Reason: message" of a condition that is not True, "" when it is True, and says
// so when the condition is not there yet.
func whyNot(conds []metav1.Condition, typ string) string {
	c := meta.FindStatusCondition(conds, typ)
	switch {
	case c == nil:
		return "no " + typ + " condition yet (is the controller running?)"
	case c.Status == metav1.ConditionTrue:
		return ""
	}
	return c.Reason + ": " + c.Message
}
