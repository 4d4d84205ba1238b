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
	"io"
	"slices"
	"strings"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// why prints the chain that explains a lane's state, from the top down: the lane's conditions,
// then each placement's phase, the conditions that are not True and its last fault, with its
// Mac's Ready, then the events about the lane and its placements, oldest first. Each reason is
// explained in docs/troubleshooting.md.
func why(ctx context.Context, s *session, args []string) error {
	key := types.NamespacedName{Namespace: s.namespace, Name: args[0]}
	var lane v1.CatalogLane
	if err := s.kube.Get(ctx, key, &lane); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("lane %s not found in namespace %s", key.Name, key.Namespace)
		}
		return fmt.Errorf("reading lane %s: %w", key, err)
	}
	var placements v1.LanePlacementList
	if err := s.kube.List(ctx, &placements, client.InNamespace(key.Namespace), client.MatchingLabels{v1.LabelLane: key.Name}); err != nil {
		return fmt.Errorf("listing the lane's placements: %w", err)
	}
	slices.SortFunc(placements.Items, func(a, b v1.LanePlacement) int { return strings.Compare(a.Name, b.Name) })
	var events eventsv1.EventList
	if err := s.kube.List(ctx, &events, client.InNamespace(key.Namespace)); err != nil {
		return fmt.Errorf("listing the lane's events: %w", err)
	}
	now := s.clock.Now()
	w := s.out

	fmt.Fprintf(w, "Lane %s: %d of %d replicas Ready\n", key, lane.Status.ReadyReplicas, lane.Spec.Replicas)
	if lane.Status.ObservedGeneration != lane.Generation {
		fmt.Fprintf(w, "  the controller has not observed generation %d yet (it last saw %d)\n", lane.Generation, lane.Status.ObservedGeneration)
	}
	conditions(w, "  ", lane.Status.Conditions, true)

	fmt.Fprintf(w, "Placements (%d):\n", len(placements.Items))
	for _, p := range placements.Items {
		fmt.Fprintf(w, "  %s on %s: %s\n", p.Name, p.Spec.Node, orDash(string(p.Status.Phase)))
		conditions(w, "    ", p.Status.Conditions, false)
		if c := p.Status.Compile; c != nil {
			fmt.Fprintf(w, "    compiling rung %d: %d of %d layers, ready %s\n", c.Rung, c.LayersDone, c.LayersTotal, in(now, c.PredictedReadyTime))
		}
		if f := p.Status.LastFault; f != nil {
			fmt.Fprintf(w, "    last fault %s (%s ago): %s\n", f.Code, ago(now, f.Time), f.Message)
		}
		var node v1.MacNode
		switch err := s.kube.Get(ctx, types.NamespacedName{Name: p.Spec.Node}, &node); {
		case apierrors.IsNotFound(err):
			fmt.Fprintf(w, "    Mac %s: its MacNode does not exist\n", p.Spec.Node)
		case err != nil:
			return fmt.Errorf("reading MacNode %s: %w", p.Spec.Node, err)
		default:
			fmt.Fprintf(w, "    Mac %s: Ready %s\n", node.Name, condition(node.Status.Conditions, v1.ConditionReady))
		}
	}

	about := map[string]bool{"CatalogLane/" + lane.Name: true}
	for _, p := range placements.Items {
		about["LanePlacement/"+p.Name] = true
	}
	var mine []eventsv1.Event
	for _, e := range events.Items {
		if about[e.Regarding.Kind+"/"+e.Regarding.Name] {
			mine = append(mine, e)
		}
	}
	slices.SortFunc(mine, func(a, b eventsv1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	fmt.Fprintf(w, "Events (%d):\n", len(mine))
	for _, e := range mine {
		count := ""
		if e.Series != nil && e.Series.Count > 1 {
			count = fmt.Sprintf(" (x%d)", e.Series.Count)
		}
		fmt.Fprintf(w, "  %s ago  %s  %s  %s/%s: %s%s\n", ago(now, metav1.Time{Time: eventTime(e)}), e.Type, e.Reason,
			e.Regarding.Kind, e.Regarding.Name, e.Note, count)
	}
	fmt.Fprintln(w, "Every reason is explained in docs/troubleshooting.md.")
	return nil
}

// conditions prints each condition as "Type Status Reason: message"; all of them, or only
// Ready and those that are not True.
func conditions(w io.Writer, indent string, conds []metav1.Condition, all bool) {
	for _, c := range conds {
		if !all && c.Type != v1.ConditionReady && c.Status == metav1.ConditionTrue {
			continue
		}
		fmt.Fprintf(w, "%s%s %s %s: %s\n", indent, c.Type, c.Status, c.Reason, c.Message)
	}
	if all && meta.FindStatusCondition(conds, v1.ConditionReady) == nil {
		fmt.Fprintf(w, "%sno Ready condition yet: is the controller running?\n", indent)
	}
}

// eventTime is when an event last happened: its series' last time, or its own.
func eventTime(e eventsv1.Event) time.Time {
	switch {
	case e.Series != nil:
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.DeprecatedLastTimestamp.Time
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
