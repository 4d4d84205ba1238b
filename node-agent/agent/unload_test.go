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
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/onsi/gomega"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
)

// TestUnloadAnswersInFlightCallsLaneRetiredWithinTheShutdownBudget: unloading a lane refuses
// new calls at once, answers the calls waiting for an admission lane_retired without waiting for
// it, lets an exchange in flight drain with its reply, and gives up its own wait when the
// shutdown budget ends, never waiting for the admission of minutes still on the worker.
func TestUnloadAnswersInFlightCallsLaneRetiredWithinTheShutdownBudget(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	sp := fakeworker.New(clk)
	sp.Progress = supervisor.ReportProgress
	sp.Configure = func(w *fakeworker.Worker) {
		w.AdmitCost[256] = 10 * time.Minute // a compile of minutes
		w.Reply = func(_ int, payload []byte) ([]byte, error) {
			e := &pb.Execute{}
			if err := proto.Unmarshal(payload, e); err != nil {
				return nil, err
			}
			reply := &pb.Reply{}
			for _, s := range e.Sequences {
				reply.Vectors = append(reply.Vectors, &pb.Vector{Values: worker.Embed("tiny", 16, s.TokenIds)})
			}
			return proto.Marshal(reply)
		}
	}
	a := New(Config{NodeName: "mac-1", Clock: clk, Log: testr.New(t), Host: sp})
	runCtx, stop := context.WithCancel(context.Background())
	supDone := make(chan struct{})
	go func() { defer close(supDone); _ = a.sup.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-supDone })

	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "tiny"}, Spec: v1.CertifiedIdentitySpec{
		Model: v1.ModelIdentity{Name: "tiny", Layers: 2, EmbeddingDimensions: 16}}}
	spec := v1.LanePlacementSpec{Lane: "slow", Node: "mac-1", Identity: "tiny", Task: v1.TaskEmbed, Device: v1.DeviceANE,
		Rungs: []v1.Rung{128, 256}, Ceiling: 256, MaxResidentShapes: 2, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 900}
	key := "default/slow"
	if err := a.sup.LoadModel(runCtx, modelSpec(key, spec, id, "")); err != nil {
		t.Fatal(err)
	}
	a.serve.AddLane(servingLane(key, spec, id))
	call := func(tokens int) <-chan error {
		out := make(chan error, 1)
		seq := make([]uint32, tokens)
		for i := range seq {
			seq[i] = uint32(100 + i)
		}
		go func() {
			_, err := a.serve.Run(context.Background(), key, "embed", [][]uint32{seq}, time.Time{})
			out <- err
		}()
		return out
	}
	g := gomega.NewWithT(t)
	// 128 resident, then an exchange on it held in flight.
	first := call(10)
	g.Eventually(func() bool { return clk.HasWaiters() }).Should(gomega.BeTrue())
	clk.Step(50 * time.Millisecond)
	g.Eventually(first).WithTimeout(10 * time.Second).Should(gomega.Receive(gomega.BeNil()))
	w := sp.Get(t, key, 1)
	gate := make(chan struct{})
	w.Lock()
	w.ExchangeGate = gate
	w.Unlock()
	inExchange := call(10)
	g.Eventually(w.Exchanging).Should(gomega.Equal(1))
	// A call waits for 256's admission, which takes minutes on the worker.
	waiting := call(200)
	g.Eventually(func() int { return a.sup.Node().QueueLength }).Should(gomega.Equal(1))
	clk.Step(50 * time.Millisecond)
	// (It waits for the worker's stream, which the exchange holds.)
	g.Eventually(func() string { return a.sup.Node().Running }).Should(gomega.Equal(key + "@256"))

	budget, spent := context.WithCancel(context.Background())
	unloaded := make(chan struct{})
	go func() { a.unloadLane(budget, key); close(unloaded) }()

	// Without the fake clock moving: the waiting call is answered lane_retired...
	var err error
	g.Eventually(waiting).WithTimeout(10 * time.Second).Should(gomega.Receive(&err))
	if refusal.CodeOf(err) != refusal.LaneRetired {
		t.Fatalf("the call waiting for an admission got %v, want lane_retired", err)
	}
	// ...a new call is refused at once...
	if err := <-call(10); refusal.CodeOf(err) != refusal.LaneRetired {
		t.Fatalf("a new call got %v, want lane_retired", err)
	}
	// ...and the exchange in flight drains with its reply, not cut short.
	close(gate)
	g.Eventually(inExchange).WithTimeout(10 * time.Second).Should(gomega.Receive(gomega.BeNil()))
	select {
	case <-unloaded:
		t.Fatal("the unload finished before the worker's admission did: its exit cannot be confirmed yet")
	default:
	}
	// The shutdown budget ends: the unload gives up waiting and returns.
	spent()
	g.Eventually(unloaded).WithTimeout(10 * time.Second).Should(gomega.BeClosed())
	if snap, ok := a.sup.Snapshot(key); !ok || !snap.Retiring {
		t.Fatalf("snapshot %+v: the lane should still be retiring, its worker draining", snap)
	}
	// The retirement goes on without anyone waiting: the admission ends, the worker exits.
	g.Eventually(w.Calls).Should(gomega.ContainElement("admit 256")) // its timer is set
	clk.Step(10 * time.Minute)
	g.Eventually(a.sup.Lanes).WithTimeout(10 * time.Second).Should(gomega.BeEmpty())
	if calls := w.Calls(); !slices.Contains(calls, "close") {
		t.Fatalf("worker calls %v: want it closed after its admission drained", calls)
	}
	if used := a.sup.Used(); used != 0 {
		t.Fatalf("charged %d after the retirement, want 0", used)
	}
}
