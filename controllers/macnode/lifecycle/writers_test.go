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

package lifecycle_test

import (
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// agentWrites writes the node's status as its agent does (the agent's own write path,
// statusapply.ApplyAgentStatus), from from: a copy of the node the agent read, stale or not,
// which may carry a Ready condition someone else wrote.
func agentWrites(from *v1.MacNode, lanes int, paused bool) {
	GinkgoHelper()
	st := from.Status.DeepCopy()
	st.Platform = v1.Platform{Chip: "M4", MacOSBuild: "25B78"}
	st.Lanes = int32(lanes)
	now := metav1.NewTime(clk.Now())
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.NodeConditionAgentReady, Status: metav1.ConditionTrue,
		Reason: v1.NodeReasonAgentRunning, Message: fmt.Sprintf("the agent is running; %d lanes loaded", lanes), LastTransitionTime: now})
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.NodeConditionANEAvailable, Status: metav1.ConditionTrue,
		Reason: "BackendSim", Message: "workers run the sim backend", LastTransitionTime: now})
	pausedStatus, reason := metav1.ConditionFalse, "NotPaused"
	if paused {
		pausedStatus, reason = metav1.ConditionTrue, "PausedBySpec"
	}
	meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.NodeConditionPaused, Status: pausedStatus, Reason: reason,
		Message: "as the spec says", LastTransitionTime: now})
	Expect(statusapply.ApplyAgentStatus(ctx, kube, from.Name, *st)).To(Succeed())
}

func read(n *v1.MacNode) *v1.MacNode {
	GinkgoHelper()
	got := &v1.MacNode{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(n), got)).To(Succeed())
	return got
}

// conditionsOf are the node's conditions of the given types, as stored.
func conditionsOf(n *v1.MacNode, types ...string) []metav1.Condition {
	var out []metav1.Condition
	for _, c := range n.Status.Conditions {
		for _, t := range types {
			if c.Type == t {
				out = append(out, c)
			}
		}
	}
	return out
}

// owner is the field manager whose managed fields hold the condition of type typ.
func owner(n *v1.MacNode, typ string) []string {
	var out []string
	key := fmt.Sprintf(`"k:{\"type\":\"%s\"}"`, typ)
	for _, m := range n.ManagedFields {
		if m.Subresource == "status" && m.FieldsV1 != nil && strings.Contains(string(m.FieldsV1.Raw), key) {
			out = append(out, m.Manager)
		}
	}
	return out
}

var _ = Describe("One writer per fact", func() {
	agentTypes := []string{v1.NodeConditionAgentReady, v1.NodeConditionANEAvailable, v1.NodeConditionPaused}

	Context("when the agent and the controllers write the conditions of one node", func() {
		It("should leave each writer's conditions as that writer wrote them", func() {
			n := heartbeatingNode()
			stale := read(n) // the agent's cached copy: Ready True
			Expect(ready(stale)).To(Equal(metav1.ConditionTrue))
			readyBefore := *meta.FindStatusCondition(stale.Status.Conditions, v1.ConditionReady)

			agentWrites(stale, 1, false)
			got := read(n)
			Expect(*meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady)).To(Equal(readyBefore),
				"the agent's write changed the controller's Ready")
			Expect(conditionsOf(got, agentTypes...)).To(HaveLen(3))
			Expect(statusapply.ApplyCondition(ctx, kube, n.Name, statusapply.Manager(statusapply.AddressManager, v1.NodeConditionAddressAllowed),
				metav1.Condition{Type: v1.NodeConditionAddressAllowed, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAddressAllowed,
					Message: "inside the allowed CIDRs", LastTransitionTime: metav1.NewTime(clk.Now())})).To(Succeed())
			agentBefore := conditionsOf(read(n), agentTypes...)

			// The controller turns Ready Unknown: the agent's conditions stay as they were.
			clk.Step(41 * time.Second)
			_, got = reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionUnknown))
			Expect(conditionsOf(got, agentTypes...)).To(Equal(agentBefore), "the controller's write changed the agent's conditions")
			readyUnknown := *meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady)

			// The agent writes again from its stale copy, which still says Ready True: Ready
			// stays Unknown, the address condition stays, the agent's own change is written.
			agentWrites(stale, 2, true)
			got = read(n)
			Expect(*meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady)).To(Equal(readyUnknown),
				"the agent's write from a stale copy reverted the controller's Ready")
			Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.NodeConditionAddressAllowed)).To(BeTrue())
			Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.NodeConditionPaused)).To(BeTrue())
			Expect(got.Status.Lanes).To(Equal(int32(2)))

			// Each condition is held by its writer's field manager alone.
			Expect(owner(got, v1.ConditionReady)).To(ConsistOf(statusapply.Manager(statusapply.LifecycleManager, v1.ConditionReady)))
			Expect(owner(got, v1.NodeConditionAddressAllowed)).To(ConsistOf(statusapply.Manager(statusapply.AddressManager, v1.NodeConditionAddressAllowed)))
			for _, t := range agentTypes {
				Expect(owner(got, t)).To(ConsistOf(statusapply.AgentManager), "condition %s", t)
			}

			// The Lease is renewed: Ready True again, the agent's conditions untouched.
			agentAfter := conditionsOf(got, agentTypes...)
			renew(n)
			_, got = reconcileNode(n)
			Expect(ready(got)).To(Equal(metav1.ConditionTrue))
			Expect(conditionsOf(got, agentTypes...)).To(Equal(agentAfter))
			Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.NodeConditionAddressAllowed)).To(BeTrue())
		})
	})

	Context("when the Lease renewals fail while the agent's status writes succeed", func() {
		It("should turn the node Unknown once, after the grace period, and evict only what the eviction timeout says", func() {
			n := heartbeatingNode()
			alive := []*v1.MacNode{heartbeatingNode(), heartbeatingNode()} // the rest of the fleet heartbeats
			p := placementOn(n)                                            // placed while the node was Ready
			lastRenewal := clk.Now()
			cached := read(n) // what the agent's cache holds: Ready True

			const step = 5 * time.Second
			var transitions []string
			was := metav1.ConditionTrue
			wentUnknownAt := time.Duration(-1)
			evictedAt := time.Duration(-1)
			for elapsed := step; elapsed <= 40*time.Second+5*time.Minute+30*time.Second; elapsed += step {
				clk.Step(step)
				for _, a := range alive {
					renew(a)
				}
				// The agent's status write succeeds (from its cached copy, Ready True and all)
				// and, as the MacNode watch would, the controller looks at the node after it.
				// Ready is looked at after each write, as the placement and endpoints
				// controllers' watches see it.
				observe := func(got *v1.MacNode) {
					if now := ready(got); now != was {
						transitions = append(transitions, fmt.Sprintf("%s->%s at %s", was, now, elapsed))
						if now == metav1.ConditionUnknown && wentUnknownAt < 0 {
							wentUnknownAt = elapsed
						}
						was = now
					}
				}
				agentWrites(cached, int(elapsed/step), false)
				observe(read(n))
				_, got := reconcileNode(n)
				observe(got)
				Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.NodeConditionAgentReady)).To(BeTrue(),
					"the agent's own report is written all along")
				if err := kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{}); apierrors.IsNotFound(err) && evictedAt < 0 {
					evictedAt = elapsed
				}
			}

			// Ready moved once: the placement controller, which places only on Ready nodes,
			// never saw the lost node Ready again, so nothing was placed there between flips.
			Expect(transitions).To(HaveLen(1), "Ready flapped: %v", transitions)
			Expect(transitions[0]).To(HavePrefix("True->Unknown"))
			Expect(wentUnknownAt).To(BeNumerically(">=", 40*time.Second), "Unknown before the grace period ran out")
			Expect(wentUnknownAt).To(BeNumerically("<=", 40*time.Second+step), "Unknown later than the first look after the grace period")
			expired := 0
			for len(recorder.Events) > 0 {
				if strings.Contains(<-recorder.Events, v1.NodeReasonLeaseExpired) {
					expired++
				}
			}
			Expect(expired).To(Equal(1), "one LeaseExpired event per outage")

			// The placement made while the node was Ready went at the eviction timeout, counted
			// from the last renewal, not at any flip.
			Expect(evictedAt).To(BeNumerically(">", 0), "the lost node's placement was never evicted")
			Expect(lastRenewal.Add(evictedAt)).To(BeTemporally(">=", lastRenewal.Add(40*time.Second+5*time.Minute)))
		})
	})
})
