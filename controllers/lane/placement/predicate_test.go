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

package placement

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

func TestOnlyNodeChangesThatPlacementReadsReconcileTheLanes(t *testing.T) {
	base := func() *v1.MacNode {
		return &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "mac-1", Labels: map[string]string{"pool": "a"}},
			Status: v1.MacNodeStatus{
				Platform:   v1.Platform{MacOSBuild: "25B78"},
				Worker:     v1.NodeWorker{SigningIdentifier: "synapse-ane-worker"},
				Capacity:   v1.ExecutableBudget{LayerExecutables: 100},
				Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: "AgentReady"}}}}
	}
	for name, tc := range map[string]struct {
		change func(*v1.MacNode)
		want   bool
	}{
		"nothing":       {func(*v1.MacNode) {}, false},
		"compile queue": {func(n *v1.MacNode) { n.Status.CompileQueue.Length = 3 }, false},
		"addresses":     {func(n *v1.MacNode) { n.Status.Addresses = []v1.NodeAddress{{Address: "10.0.0.2"}} }, false},
		"ready message": {func(n *v1.MacNode) { n.Status.Conditions[0].Message = "still fine" }, false},
		"ready status":  {func(n *v1.MacNode) { n.Status.Conditions[0].Status = metav1.ConditionUnknown }, true},
		"labels":        {func(n *v1.MacNode) { n.Labels["pool"] = "b" }, true},
		"cordoned":      {func(n *v1.MacNode) { n.Spec.Unschedulable = true }, true},
		"macOS build":   {func(n *v1.MacNode) { n.Status.Platform.MacOSBuild = "25C56" }, true},
		"worker":        {func(n *v1.MacNode) { n.Status.Worker.BinaryDigest = "sha256:ab" }, true},
		"allocated":     {func(n *v1.MacNode) { n.Status.Allocated.LayerExecutables = 22 }, true},
		"cached rungs":  {func(n *v1.MacNode) { n.Status.CachedRungs = []v1.CachedRungs{{Identity: "gte", Rungs: []v1.Rung{128}}} }, true},
	} {
		cur := base()
		tc.change(cur)
		if got := nodeChanges.Update(event.UpdateEvent{ObjectOld: base(), ObjectNew: cur}); got != tc.want {
			t.Errorf("%s: reconcile %t, want %t", name, got, tc.want)
		}
	}
	if !nodeChanges.Create(event.CreateEvent{Object: base()}) || !nodeChanges.Delete(event.DeleteEvent{Object: base()}) {
		t.Error("a node's arrival or departure must reconcile the lanes")
	}
}
