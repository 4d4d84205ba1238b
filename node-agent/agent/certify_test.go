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
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/certify"
	"github.com/ck-synapse/synapse-fleet/node-agent/internal/fakeworker"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// TestCertifyObservationIsRecordedByTheAgentAndCoversRecoveringLanes: an agent with certify
// observation on writes observations synapse-certify reads; a lane whose worker is recovering
// is in it, without an inventory and saying why (so the gate fails), never left out or shown
// empty; and giving up on an observation does not cut a serving worker's call short.
func TestCertifyObservationIsRecordedByTheAgentAndCoversRecoveringLanes(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	sp := fakeworker.New(clk)
	sp.Progress = supervisor.ReportProgress
	exit := make(chan struct{})
	sp.Configure = func(w *fakeworker.Worker) {
		if w.Lane == "default/b" && w.Gen == 1 {
			w.ExitGate = exit // b's first worker takes its time to exit
		}
	}
	path := filepath.Join(t.TempDir(), "observation.json")
	a := New(Config{NodeName: "mac-1", Clock: clk, Log: testr.New(t), Host: sp, CertifyObservation: path})
	ctx, stop := context.WithCancel(context.Background())
	supDone := make(chan struct{})
	go func() { defer close(supDone); _ = a.sup.Run(ctx) }()
	t.Cleanup(func() { stop(); <-supDone })
	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "tiny"}, Spec: v1.CertifiedIdentitySpec{
		Model: v1.ModelIdentity{Name: "tiny", Layers: 2, EmbeddingDimensions: 16}}}
	spec := v1.LanePlacementSpec{Task: v1.TaskEmbed, Device: v1.DeviceANE, Rungs: []v1.Rung{128, 256}, Ceiling: 256,
		MaxResidentShapes: 2, AdmissionBoundSeconds: 600}
	for _, key := range []string{"default/a", "default/b"} {
		if err := a.sup.LoadModel(ctx, modelSpec(key, spec, id, "")); err != nil {
			t.Fatal(err)
		}
	}
	g := gomega.NewWithT(t)
	lease := func(key string) supervisor.Lease {
		t.Helper()
		out := make(chan supervisor.Lease, 1)
		go func() {
			l, err := a.sup.Acquire(ctx, key, 128, time.Time{})
			if err != nil {
				t.Error(err)
			}
			out <- l
		}()
		var l supervisor.Lease
		g.Eventually(func() bool {
			select {
			case l = <-out:
				return true
			default:
			}
			if a.sup.Node().QueueLength == 1 && clk.HasWaiters() {
				clk.Step(50 * time.Millisecond) // past the admission's start hold
			}
			return false
		}).WithTimeout(10 * time.Second).Should(gomega.BeTrue())
		return l
	}
	la := lease("default/a")
	la.Release()
	lb := lease("default/b")
	// b's worker faults; its exit is not confirmed yet: b is recovering.
	w := sp.Get(t, "default/b", 1)
	w.Lock()
	w.NextExchangeErr = fakeworker.ErrBrokenPipe
	w.Unlock()
	if _, err := lb.Exchange(ctx, nil); err == nil {
		t.Fatal("the exchange did not fail")
	}
	lb.Release()
	g.Eventually(func() bool { s, _ := a.sup.Snapshot("default/b"); return s.Recovering }).Should(gomega.BeTrue())

	read := func() certify.Observation {
		t.Helper()
		if err := a.recordObservation(ctx); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		obs, err := certify.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		return obs
	}
	obs := read()
	if len(obs.Workers) != 2 || obs.Workers[0].Lane != "default/a" || obs.Workers[1].Lane != "default/b" {
		t.Fatalf("workers %+v: want both lanes, the recovering one included", obs.Workers)
	}
	if b := obs.Workers[1]; b.Inventory != nil || !strings.Contains(b.Error, "recovering") {
		t.Fatalf("the recovering lane %+v: want no inventory and the reason", b)
	}
	if err := certify.Validate(obs); !errors.Is(err, certify.ErrInventoryOmitted) {
		t.Fatalf("the gate answered %v for an observation missing a recovering lane's inventory", err)
	}

	// Once b's replacement runs, the observation is complete and passes the gate.
	close(exit)
	g.Eventually(func() bool { s, _ := a.sup.Snapshot("default/b"); return s.Running && s.Generation == 2 }).
		WithTimeout(10 * time.Second).Should(gomega.BeTrue())
	obs = read()
	if err := certify.Validate(obs); err != nil || obs.AdmittedShapes != 1 {
		t.Fatalf("observation %+v: %v, want a complete observation of a's one shape", obs, err)
	}

	// An observation whose caller gives up does not cut the workers' calls short.
	wa := sp.Get(t, "default/a", 1)
	hold := make(chan struct{})
	wa.Lock()
	wa.InventoryGate = hold
	wa.Unlock()
	gaveUp, cancel := context.WithCancel(ctx)
	observed := make(chan error, 1)
	go func() { _, err := a.sup.Observe(gaveUp); observed <- err }()
	g.Eventually(wa.InventoryWaiting).Should(gomega.BeTrue())
	cancel()
	if err := <-observed; !errors.Is(err, context.Canceled) {
		t.Fatalf("the abandoned observation returned %v", err)
	}
	close(hold)
	g.Eventually(wa.InventoryWaiting).Should(gomega.BeFalse())
	if err := wa.LastInventoryCtxErr(); err != nil {
		t.Fatalf("the worker's inventory call was cancelled with its observer (%v): a process worker would be killed", err)
	}
	l := lease("default/a")
	if _, err := l.Exchange(ctx, nil); err != nil {
		t.Fatalf("a's worker no longer serves: %v", err)
	}
	l.Release()
}
