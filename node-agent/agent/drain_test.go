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

package agent

import (
	"context"
	"testing"
	"time"

	"github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// A stopping agent says its placements are terminating and waits, answering, until the
// endpoints controller confirms they left the lanes' endpoints; only a confirmation (or the
// bounded drain timeout, on the agent's clock) lets it go on to close its server.
func TestAStoppingAgentMarksItsPlacementsTerminatingAndWaitsForThemToLeaveTheEndpoints(t *testing.T) {
	for _, confirmed := range []bool{true, false} {
		p := testPlacement("gte")
		a, clk, _ := newTestAgent(t, p)
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		loadReady(t, a, p)

		done := make(chan []types.NamespacedName, 1)
		go func() { done <- a.drain(context.Background(), a.kube) }()
		g := gomega.NewWithT(t)
		g.Eventually(clk.HasWaiters).WithTimeout(10 * time.Second).Should(gomega.BeTrue())
		got := &v1.LanePlacement{}
		if err := a.kube.Get(context.Background(), key, got); err != nil {
			t.Fatal(err)
		}
		if !meta.IsStatusConditionTrue(got.Status.Conditions, v1.PlacementConditionTerminating) || got.Status.Phase != v1.PhaseReady {
			t.Fatalf("a stopping agent's placement says %+v: want Terminating while still Ready", got.Status.Conditions)
		}
		select {
		case <-done:
			t.Fatal("the drain ended before the endpoints confirmed it")
		default:
		}
		if confirmed {
			meta.SetStatusCondition(&got.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionDrained, Status: metav1.ConditionTrue, Reason: v1.PlacementReasonNotAnEndpoint,
				LastTransitionTime: metav1.NewTime(clk.Now())})
			if err := a.kube.Status().Update(context.Background(), got); err != nil {
				t.Fatal(err)
			}
			clk.Step(drainPoll)
			if left := <-done; len(left) != 0 {
				t.Fatalf("confirmed, yet %v still waiting", left)
			}
			continue
		}
		// Never confirmed: the wait is bounded. Each step waits until the drain either ended or
		// sleeps on the clock again.
		var left []types.NamespacedName
		ended := false
		for steps := 0; !ended; steps++ {
			if steps > 100 {
				t.Fatal("the drain never gave up")
			}
			clk.Step(drainPoll)
			g.Eventually(func() bool {
				select {
				case left = <-done:
					ended = true
					return true
				default:
					return clk.HasWaiters()
				}
			}).WithTimeout(10 * time.Second).Should(gomega.BeTrue())
		}
		if len(left) != 1 || left[0] != key {
			t.Fatalf("gave up waiting for %v", left)
		}
		if clk.Now().Sub(epoch) > a.cfg.DrainTimeout+drainPoll {
			t.Fatalf("the drain waited %s, past its %s bound", clk.Now().Sub(epoch), a.cfg.DrainTimeout)
		}
	}
}
