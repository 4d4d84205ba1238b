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
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

var (
	testDigest   = v1.Sha256Digest("sha256:" + strings.Repeat("ab", 32))
	testIdentity = &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "tiny"}, Spec: v1.CertifiedIdentitySpec{Worker: v1.WorkerIdentity{Backend: v1.BackendSim},
		Model:            v1.ModelIdentity{Name: "tiny", Revision: "r1", CheckpointDigest: testDigest, Layers: 2, EmbeddingDimensions: 16},
		ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: testDigest}, MacOSBuild: "25B78"}}
)

// installArtifact builds testIdentity's sim artifact under root.
func installArtifact(t *testing.T, root string) string {
	t.Helper()
	dir, err := artifact.Path(root, "tiny", "r1", "ane-fp16-v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := artifact.BuildSim(dir, artifact.SimSpec{Model: "tiny", Revision: "r1", CheckpointDigest: string(testDigest),
		ConversionPolicy: artifact.ConversionPolicy{Name: "ane-fp16-v1", Digest: string(testDigest)}, ConverterVersion: artifact.SimConverterVersion,
		Platform: artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}, Rungs: []int{128, 256}, Layers: 2, Dimensions: 16, Seed: "tiny"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

func testPlacement(lane string) *v1.LanePlacement {
	return &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: lane + "-mac-1", Namespace: "default", Generation: 1},
		Spec: v1.LanePlacementSpec{Lane: lane, Node: "mac-1", Identity: "tiny", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
}

// newTestAgent runs an agent's supervisor over real sim workers, its status writer on a fake clock, and a fake
// API server holding its MacNode and the given placements; writes counts the status patches.
func newTestAgent(t *testing.T, placements ...*v1.LanePlacement) (*Agent, *clocktesting.FakeClock, *atomic.Int64) {
	return newTestAgentWithEnv(t, nil, placements...)
}

// newTestAgentWithEnv is newTestAgent whose workers get env.
func newTestAgentWithEnv(t *testing.T, env []string, placements ...*v1.LanePlacement) (*Agent, *clocktesting.FakeClock, *atomic.Int64) {
	t.Helper()
	clk := clocktesting.NewFakeClock(epoch)
	scheme := k8sruntime.NewScheme()
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	objs := []client.Object{&v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "mac-1"}}}
	for _, p := range placements {
		objs = append(objs, p)
	}
	var writes atomic.Int64
	// The node's status is applied server-side: the fake merges it by the CRDs' schema, as the
	// API server does.
	types, err := testenv.TypeConverter()
	if err != nil {
		t.Fatal(err)
	}
	kube := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&v1.MacNode{}, &v1.LanePlacement{}).
		WithTypeConverters(types).WithObjects(objs...).Build(), interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			writes.Add(1)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	// The supervisor, the workers and their simulated device run on real time (the supervisor's
	// own rules are tested on a fake clock in its package); the status writer's interval runs
	// on the fake clock.
	host := workerhost.New(workerhost.Config{Binary: workerBinary, Backend: "sim", StateDir: t.TempDir(), SimScale: 1e-6, Log: logr.Discard(),
		Env: func(string, int64) []string { return env }})
	root := t.TempDir()
	installArtifact(t, root)
	a := New(Config{NodeName: "mac-1", Clock: clock.RealClock{}, Log: testr.New(t), Host: host, Auth: apiauth.Anonymous{}, StatusInterval: time.Second,
		ArtifactRoot: root, ChipFamily: "M4", ConverterVersion: artifact.SimConverterVersion,
		Platform: v1.Platform{MacOSBuild: "25B78"}, Worker: v1.NodeWorker{Backend: v1.BackendSim}, Address: "10.0.0.1"})
	a.cfg.Clock = clk
	a.kube = kube
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.sup.Run(ctx) }()
	t.Cleanup(func() {
		a.retireAll(context.Background())
		cancel()
		<-done
	})
	return a, clk, &writes
}

// waitState waits until l reaches state.
func waitState(t *testing.T, a *Agent, l *lane, state laneState) {
	t.Helper()
	gomega.NewWithT(t).Eventually(func() laneState {
		a.mu.Lock()
		defer a.mu.Unlock()
		return l.state
	}).WithTimeout(10 * time.Second).Should(gomega.Equal(state))
}

// loadReady loads p's lane as the reconciler does and waits until its self-check passed.
func loadReady(t *testing.T, a *Agent, p *v1.LanePlacement) *lane {
	t.Helper()
	l := a.entry(p)
	if _, err := (&reconciler{a: a}).load(context.Background(), l, p, testIdentity); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, l, laneReady)
	return l
}

func TestStatusWritesAreCoalescedAndOnlyWhenSomethingChanged(t *testing.T) {
	p := testPlacement("gte")
	a, clk, writes := newTestAgent(t, p)
	l := loadReady(t, a, p)
	ctx := context.Background()
	book := newStatusBook()

	if n := a.statusPass(ctx, book); n != 2 {
		t.Fatalf("the first pass wrote %d objects, want the node and the placement", n)
	}
	got := &v1.LanePlacement{}
	if err := a.kube.Get(ctx, types.NamespacedName{Namespace: "default", Name: p.Name}, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1.PhaseReady || got.Status.WorkerGeneration != 1 || !meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady) {
		t.Fatalf("written status %+v", got.Status)
	}

	// Nothing changed: nothing is written, however often the writer wakes.
	clk.Step(5 * time.Second)
	for range 3 {
		if n := a.statusPass(ctx, book); n != 0 {
			t.Fatalf("a pass with nothing changed wrote %d objects", n)
		}
	}

	// A burst of changes within one interval is one write, of the last state.
	a.setState(l, lanePaused, nil)
	if n := a.statusPass(ctx, book); n != 1 {
		t.Fatalf("the change wrote %d objects", n)
	}
	a.setState(l, laneReady, nil)
	a.setState(l, lanePaused, nil)
	a.setState(l, laneRetiring, nil)
	clk.Step(500 * time.Millisecond)
	if n := a.statusPass(ctx, book); n != 0 {
		t.Fatalf("a second write within the interval: %d", n)
	}
	clk.Step(500 * time.Millisecond)
	before := writes.Load()
	if n := a.statusPass(ctx, book); n != 1 || writes.Load() != before+1 {
		t.Fatalf("after the interval: %d writes", n)
	}
	if err := a.kube.Get(ctx, types.NamespacedName{Namespace: "default", Name: p.Name}, got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != v1.PhaseRetiring {
		t.Fatalf("phase %s, want the burst's last state, Retiring", got.Status.Phase)
	}
}

// freezeCachedPlacement reads the placement key as it is now and, while the returned flag is
// set, has the agent's client answer that copy for it: a cache that has not seen what the
// agent wrote since.
func freezeCachedPlacement(t *testing.T, a *Agent, key types.NamespacedName) (*v1.LanePlacement, *atomic.Bool) {
	t.Helper()
	before := &v1.LanePlacement{}
	if err := a.kube.Get(context.Background(), key, before); err != nil {
		t.Fatal(err)
	}
	var stale atomic.Bool
	a.kube = interceptor.NewClient(a.kube.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, k client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if pl, ok := obj.(*v1.LanePlacement); ok && stale.Load() && k == key {
				before.DeepCopyInto(pl)
				return nil
			}
			return c.Get(ctx, k, obj, opts...)
		},
	})
	return before, &stale
}

// While the cache shows a placement from before the agent's own last write of its status (the
// watch runs behind under load), the agent compares with what it wrote, not with the stale copy:
// the same status is not applied again, a change is, and once the cache has caught up a status
// someone else changed is compared as it now is.
func TestAStatusIsNotAppliedAgainWhileTheCacheShowsThePlacementFromBeforeIt(t *testing.T) {
	p := testPlacement("gte")
	a, clk, writes := newTestAgent(t, p)
	l := loadReady(t, a, p)
	ctx := context.Background()
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	_, stale := freezeCachedPlacement(t, a, key)
	book := newStatusBook()
	if n := a.statusPass(ctx, book); n != 2 {
		t.Fatalf("the first pass wrote %d objects, want the node and the placement", n)
	}
	stale.Store(true)
	for range 3 {
		clk.Step(2 * time.Second)
		if n := a.statusPass(ctx, book); n != 0 {
			t.Fatalf("with the cache behind the agent's write and nothing changed, a pass wrote %d objects", n)
		}
	}

	// A change is written, stale cache or not, and then not again.
	a.setState(l, lanePaused, nil)
	clk.Step(2 * time.Second)
	w := writes.Load()
	if n := a.statusPass(ctx, book); n != 1 || writes.Load() != w+1 {
		t.Fatalf("a change with the cache behind: %d objects written, %d writes", n, writes.Load()-w)
	}
	clk.Step(2 * time.Second)
	if n := a.statusPass(ctx, book); n != 0 {
		t.Fatalf("the change was applied again: %d", n)
	}

	// The cache caught up, and then someone else cleared the agent's phase: compared with the
	// placement as it now is, the status is applied again.
	stale.Store(false)
	clk.Step(2 * time.Second)
	if n := a.statusPass(ctx, book); n != 0 {
		t.Fatalf("the caught-up cache shows what was written, yet a pass wrote %d", n)
	}
	cur := &v1.LanePlacement{}
	if err := a.kube.Get(ctx, key, cur); err != nil {
		t.Fatal(err)
	}
	if cur.Status.Phase != v1.PhasePaused {
		t.Fatalf("phase %s written, want Paused", cur.Status.Phase)
	}
	cur.Status.Phase = ""
	if err := a.kube.Status().Update(ctx, cur); err != nil {
		t.Fatal(err)
	}
	clk.Step(2 * time.Second)
	if n := a.statusPass(ctx, book); n != 1 {
		t.Fatalf("a status changed by someone else was not written again: %d", n)
	}
	if err := a.kube.Get(ctx, key, cur); err != nil {
		t.Fatal(err)
	}
	if cur.Status.Phase != v1.PhasePaused {
		t.Fatalf("phase %q after the rewrite, want Paused", cur.Status.Phase)
	}
}

// The agent's own last write stands in for a stale cache only for the placement it was written
// to (not one recreated under the same name), only for SaidFor, and a write that finishes after
// a later one does not replace the later one's record.
func TestTheAgentsLastWriteStandsInOnlyForItsPlacementBrieflyAndTheLaterWriteIsKept(t *testing.T) {
	p := testPlacement("gte")
	a, clk, _ := newTestAgent(t, p)
	l := loadReady(t, a, p)
	ctx := context.Background()
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	before, stale := freezeCachedPlacement(t, a, key)
	stale.Store(true) // the cache never catches up
	said := func() saidStatus {
		a.mu.Lock()
		defer a.mu.Unlock()
		if l.said == nil {
			t.Fatal("no write recorded")
		}
		return *l.said
	}
	if wrote, err := a.writePlacementStatus(ctx, key, true); !wrote || err != nil {
		t.Fatalf("the first write: %v, %v", wrote, err)
	}
	if s := said(); s.uid != before.UID || s.rv == "" || !s.at.Equal(clk.Now()) {
		t.Fatalf("recorded %+v, want the placement's UID, the write's resourceVersion and now", s)
	}

	// Within SaidFor the stale cache is read as the write: nothing to write.
	clk.Step(SaidFor - time.Second)
	if wrote, err := a.writePlacementStatus(ctx, key, true); wrote || err != nil {
		t.Fatalf("within SaidFor: %v, %v", wrote, err)
	}
	// Past it the cache is compared as it is: written once more, and trusted again from then.
	clk.Step(time.Second)
	if wrote, err := a.writePlacementStatus(ctx, key, true); !wrote || err != nil {
		t.Fatalf("past SaidFor, the status compared with the stale cache was not written: %v, %v", wrote, err)
	}
	if wrote, _ := a.writePlacementStatus(ctx, key, true); wrote {
		t.Fatal("the write just made is not trusted")
	}

	// A record of another placement of that name is not used.
	a.mu.Lock()
	l.said.uid = "an-earlier-placement"
	a.mu.Unlock()
	if wrote, err := a.writePlacementStatus(ctx, key, true); !wrote || err != nil {
		t.Fatalf("another placement's record stood in for this one's: %v, %v", wrote, err)
	}
	if s := said(); s.uid != before.UID {
		t.Fatalf("recorded for %s, want the placement written, %s", s.uid, before.UID)
	}

	// A write that ends after a later one (a drain's and the writer's crossing) leaves the
	// later one's record.
	a.mu.Lock()
	l.said.rv = "999999999"
	a.mu.Unlock()
	a.setState(l, lanePaused, nil)
	if wrote, err := a.writePlacementStatus(ctx, key, true); !wrote || err != nil {
		t.Fatalf("a change: %v, %v", wrote, err)
	}
	if s := said(); s.rv != "999999999" || s.status.Phase == v1.PhasePaused {
		t.Fatalf("the earlier write replaced the later one's record: %+v", s)
	}
}

// A status the API server refuses (here as invalid) is tried again after StatusInterval, then
// after a wait that doubles, however many passes the agent's state changes run meanwhile, and
// written when it is accepted.
func TestARefusedStatusWriteIsRetriedAfterAGrowingWait(t *testing.T) {
	p := testPlacement("gte")
	a, clk, _ := newTestAgent(t, p)
	loadReady(t, a, p)
	ctx := context.Background()
	var refusing atomic.Bool
	var attempts atomic.Int64
	refusing.Store(true)
	a.kube = interceptor.NewClient(a.kube.(client.WithWatch), interceptor.Funcs{
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			attempts.Add(1)
			if refusing.Load() {
				return apierrors.NewInvalid(schema.GroupKind{Group: v1.GroupVersion.Group, Kind: "MacNode"}, obj.GetName(), nil)
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
	book := newStatusBook()
	if n := a.statusPass(ctx, book); n != 0 || attempts.Load() != 2 {
		t.Fatalf("the first pass wrote %d and tried %d objects, want 0 written of the node and the placement tried", n, attempts.Load())
	}
	for range 5 { // kicks within the interval
		clk.Step(100 * time.Millisecond)
		if a.statusPass(ctx, book); attempts.Load() != 2 {
			t.Fatalf("%d attempts within the interval after a refusal, want none more", attempts.Load()-2)
		}
	}
	clk.Step(500 * time.Millisecond)
	a.statusPass(ctx, book)
	if attempts.Load() != 4 {
		t.Fatalf("%d attempts once the interval passed, want each object tried once more", attempts.Load()-2)
	}
	// Refused again: the next attempt waits twice as long (within a tenth).
	clk.Step(1800 * time.Millisecond)
	if a.statusPass(ctx, book); attempts.Load() != 4 {
		t.Fatalf("%d attempts 1.8 s after a second refusal, want none before the doubled wait", attempts.Load()-4)
	}
	refusing.Store(false)
	clk.Step(500 * time.Millisecond)
	if n := a.statusPass(ctx, book); n != 2 {
		t.Fatalf("accepted again, the pass wrote %d objects, want both", n)
	}
	if len(book.failed) != 0 {
		t.Fatalf("the book still holds failures: %v", book.failed)
	}
}

// A placement that leaves the node leaves the status writer's book too: a churn of placements
// does not grow it, and a gone placement's failed write is not retried.
func TestTheStatusBookForgetsPlacementsThatAreGone(t *testing.T) {
	p := testPlacement("gte")
	a, clk, _ := newTestAgent(t, p)
	loadReady(t, a, p)
	ctx := context.Background()
	book := newStatusBook()
	a.statusPass(ctx, book)
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}.String()
	book.failed[key] = failedWrite{at: clk.Now(), retry: time.Minute}
	if _, ok := book.wrote[key]; !ok {
		t.Fatalf("the placement's write is not in the book: %v", book.wrote)
	}
	a.mu.Lock()
	delete(a.lanes, types.NamespacedName{Namespace: p.Namespace, Name: p.Name})
	a.mu.Unlock()
	clk.Step(time.Second)
	a.statusPass(ctx, book)
	if _, ok := book.wrote[key]; ok {
		t.Errorf("the gone placement's last write is still in the book")
	}
	if _, ok := book.failed[key]; ok {
		t.Errorf("the gone placement's failed write is still in the book")
	}
	if _, ok := book.wrote["node"]; !ok {
		t.Errorf("the node's entry was forgotten with the placement")
	}
}

func TestPlacementStatusSaysWhyALaneIsNotReady(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	cond := func(st *v1.LanePlacementStatus, typ string) metav1.Condition {
		c := meta.FindStatusCondition(st.Conditions, typ)
		if c == nil {
			t.Fatalf("no %s condition in %+v", typ, st.Conditions)
		}
		return *c
	}

	l := a.entry(p)
	a.fail(l, "IdentityMismatch", "node mac-1 does not run identity tiny")
	got := p.DeepCopy()
	a.placementStatus(key, got)
	if got.Status.Phase != v1.PhaseFailed || cond(&got.Status, v1.PlacementConditionArtifactVerified).Reason != "IdentityMismatch" ||
		got.Status.LastFault == nil || got.Status.LastFault.Code != "IdentityMismatch" {
		t.Fatalf("a mismatched identity: %+v", got.Status)
	}
	if c := cond(&got.Status, v1.ConditionReady); c.Status != metav1.ConditionFalse || c.Message == "" {
		t.Fatalf("Ready %+v", c)
	}

	loadReady(t, a, p)
	got = p.DeepCopy()
	a.placementStatus(key, got)
	if got.Status.Phase != v1.PhaseReady || cond(&got.Status, v1.PlacementConditionWorkerRunning).Status != metav1.ConditionTrue ||
		cond(&got.Status, v1.PlacementConditionSelfChecked).Status != metav1.ConditionTrue ||
		cond(&got.Status, v1.PlacementConditionArtifactVerified).Reason != "Verified" || len(got.Status.ResidentShapes) != 1 {
		t.Fatalf("a ready lane: %+v", got.Status)
	}

	a.unload(context.Background(), key, false)
	a.setState(l, lanePaused, nil)
	got = p.DeepCopy()
	a.placementStatus(key, got)
	if got.Status.Phase != v1.PhasePaused || cond(&got.Status, v1.PlacementConditionWorkerRunning).Reason != "Paused" || got.Status.ResidentShapes != nil {
		t.Fatalf("a paused lane: %+v", got.Status)
	}
}

func TestNothingLoadsFromACorruptArtifactAndThePlacementSaysWhy(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	dir, _ := artifact.Path(a.cfg.ArtifactRoot, "tiny", "r1", "ane-fp16-v1")
	params := filepath.Join(dir, "params.json")
	data, _ := os.ReadFile(params)
	if err := os.WriteFile(params, append(data, ' '), 0o644); err != nil {
		t.Fatal(err)
	}
	l := a.entry(p)
	if _, err := (&reconciler{a: a}).load(context.Background(), l, p, testIdentity); err != nil {
		t.Fatal(err)
	}
	if lanes := a.sup.Lanes(); len(lanes) != 0 {
		t.Fatalf("lanes %v were loaded from a corrupt artifact", lanes)
	}
	got := p.DeepCopy()
	a.placementStatus(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, got)
	c := meta.FindStatusCondition(got.Status.Conditions, v1.PlacementConditionArtifactVerified)
	if got.Status.Phase != v1.PhaseFailed || c == nil || c.Reason != "ArtifactQuarantined" || !strings.Contains(c.Message, "params.json") {
		t.Fatalf("status %+v", got.Status)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatal("the corrupt artifact is still in place")
	}
}

func TestThePlacementProbeGatesReadinessAndIsReported(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	loadReady(t, a, p)
	got := p.DeepCopy()
	a.placementStatus(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, got)
	if len(got.Status.Probes) != 1 || got.Status.Probes[0].Rung != 128 || got.Status.Probes[0].Ratio != "0.40" || got.Status.Probes[0].WorkerGeneration != 1 {
		t.Fatalf("probes %+v, want rung 128 at 0.40 on generation 1", got.Status.Probes)
	}
}

func TestALaneWhoseProbeSaysItRunsOnTheCPUIsUnloadedAndFails(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgentWithEnv(t, []string{"SYNAPSE_SIM_PROBE_RATIO=0.97"}, p)
	l := a.entry(p)
	if _, err := (&reconciler{a: a}).load(context.Background(), l, p, testIdentity); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, l, laneFailed)
	if lanes := a.sup.Lanes(); len(lanes) != 0 {
		t.Fatalf("lanes %v are still loaded", lanes)
	}
	got := p.DeepCopy()
	a.placementStatus(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, got)
	if got.Status.Phase != v1.PhaseFailed || got.Status.LastFault == nil || got.Status.LastFault.Code != "ComputeUnitMismatch" ||
		!strings.Contains(got.Status.LastFault.Message, "ComputeUnitMismatchError") || !strings.Contains(got.Status.LastFault.Message, "0.97") {
		t.Fatalf("status %+v (fault %+v)", got.Status, got.Status.LastFault)
	}
	if _, _, err := a.Lookup("default/gte"); refusal.CodeOf(err) != refusal.EngineCrashed || !strings.Contains(err.Error(), "ComputeUnitMismatchError") {
		t.Fatalf("a request for the lane: %v", err)
	}
}

func TestARungWhoseProbeFailsAfterTheLaneIsReadyServesNoRequestAndFailsTheLane(t *testing.T) {
	p := testPlacement("gte")
	p.Spec.Rungs, p.Spec.Ceiling, p.Spec.MaxResidentShapes = []v1.Rung{128, 256}, 256, 2
	a, _, _ := newTestAgentWithEnv(t, []string{"SYNAPSE_SIM_PROBE_RATIO=256=0.97"}, p)
	l := loadReady(t, a, p)

	// The first request for rung 256 loads it; its probe runs before the request does, and
	// the request is refused rather than run on a shape that is not on the device.
	seq := make([]uint32, 200)
	for i := range seq {
		seq[i] = uint32(i + 1)
	}
	_, err := a.serve.Run(context.Background(), l.key, "embed", [][]uint32{seq}, time.Now().Add(30*time.Second))
	if refusal.CodeOf(err) != refusal.ComputeUnitMismatch || !strings.Contains(err.Error(), "rung 256") {
		t.Fatalf("a request for rung 256: %v, want compute_unit_mismatch naming the rung", err)
	}
	waitState(t, a, l, laneFailed)
	if lanes := a.sup.Lanes(); len(lanes) != 0 {
		t.Fatalf("lanes %v are still loaded", lanes)
	}
	got := p.DeepCopy()
	a.placementStatus(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, got)
	if got.Status.LastFault == nil || got.Status.LastFault.Code != "ComputeUnitMismatch" || !strings.Contains(got.Status.LastFault.Message, "rung 256") {
		t.Fatalf("fault %+v", got.Status.LastFault)
	}
	if len(got.Status.Probes) != 2 || got.Status.Probes[0].Ratio != "0.40" || got.Status.Probes[1].Rung != 256 || got.Status.Probes[1].Ratio != "0.97" {
		t.Fatalf("probes %+v, want rung 128 at 0.40 and rung 256 at 0.97", got.Status.Probes)
	}
}

func TestLookupResolvesLaneNamesAndSaysWhyALaneCannotServe(t *testing.T) {
	a, _, _ := newTestAgent(t)
	add := func(ns, lane string, state laneState, loaded bool) {
		p := testPlacement(lane)
		p.Namespace = ns
		l := a.entry(p)
		l.state, l.loaded, l.identity = state, loaded, testIdentity
		l.api.Namespace, l.api.Name = ns, lane
	}
	add("team-a", "search", laneReady, true)
	add("team-b", "search", laneReady, true)
	add("team-a", "docs", laneReady, true)
	add("team-a", "paused", lanePaused, false)
	add("team-a", "going", laneRetiring, true)
	add("team-a", "starting", laneLoading, false)

	if l, byName, err := a.Lookup("docs"); err != nil || !byName || l[0].Name != "docs" {
		t.Fatalf("a unique name: %+v, %v", l, err)
	}
	if l, byName, err := a.Lookup("team-b/search"); err != nil || !byName || l[0].Namespace != "team-b" {
		t.Fatalf("namespace/name: %+v, %v", l, err)
	}
	// By model: the servable lanes of the model, for the API to route among.
	if l, byName, err := a.Lookup("tiny"); err != nil || byName || len(l) != 3 {
		t.Fatalf("by model: %d lanes, by name %v, %v", len(l), byName, err)
	}
	for model, want := range map[string]refusal.Code{
		"search": refusal.InvalidRequest, "team-c/search": refusal.UnknownLane, "nothing": refusal.UnknownLane,
		"paused": refusal.NodePaused, "going": refusal.LaneRetired, "starting": refusal.EngineCrashed,
	} {
		if _, _, err := a.Lookup(model); refusal.CodeOf(err) != want {
			t.Errorf("%s: %v, want %s", model, err, want)
		}
	}
}

func TestALaneTokenizesWithItsArtifactsOwnTokenizer(t *testing.T) {
	dir := t.TempDir()
	sim := &artifact.Verified{Dir: dir, Manifest: &artifact.Manifest{Backend: "sim"}}
	if tok, err := laneTokenizer(sim); err != nil || tok != (tokenizer.Sim{}) {
		t.Fatalf("a sim artifact without a tokenizer: %v, %v", tok, err)
	}
	ane := &artifact.Verified{Dir: dir, Manifest: &artifact.Manifest{Backend: "ane"}}
	if tok, err := laneTokenizer(ane); err != nil || tok != nil {
		t.Fatalf("an ane artifact without a tokenizer: %v, %v; want none (token ids only)", tok, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tinymodel.Tokenizer, 0o644); err != nil {
		t.Fatal(err)
	}
	tok, err := laneTokenizer(ane)
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := tok.EncodeContext(context.Background(), "hello world!", 0); err != nil || !slices.Equal(ids, []uint32{0, 13, 17, 18, 1}) {
		t.Fatalf("the artifact's tokenizer gave %v, %v", ids, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := laneTokenizer(ane); err == nil {
		t.Fatal("an unreadable tokenizer was accepted")
	}
}

// On the sim backend every answer and the placement say sim, and the probe is reported as
// simulated with no times; an identity approved for the ane backend never loads on a sim node.
func TestAnswersAndStatusSayWhichBackendRanAndAnAneIdentityNeverMatchesASimNode(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	loadReady(t, a, p)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/v1/embeddings", "application/json", strings.NewReader(`{"model": "default/gte", "input": [[1, 2, 3]]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Synapse struct{ Device string } `json:"synapse"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %v", resp.StatusCode, err)
	}
	if h := resp.Header.Get("X-Synapse-Device"); h != "sim" || body.Synapse.Device != "sim" {
		t.Fatalf("a sim worker's answer says device %q (header) and %q (body); want sim", h, body.Synapse.Device)
	}
	got := p.DeepCopy()
	a.placementStatus(types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, got)
	if got.Status.Backend != v1.BackendSim {
		t.Fatalf("the placement says backend %q", got.Status.Backend)
	}
	if pr := got.Status.Probes; len(pr) != 1 || !pr[0].Simulated || pr[0].DeviceMicroseconds != 0 || pr[0].CPUMicroseconds != 0 || pr[0].Ratio != "0.40" {
		t.Fatalf("probes %+v: a simulated probe must say so and report no times", pr)
	}
	// The gauge is the ratio of the two times the worker reports for its configured ratio, so it
	// carries their rounding (seen as 0.40008 on a quiet machine).
	if n := testutil.ToFloat64(a.probeRatio.WithLabelValues("default/gte", "128", "simulated")); math.Abs(n-0.4) > 1e-3 {
		t.Fatalf("the simulated probe's gauge is %v", n)
	}

	// An identity that approves the same binary on the ane backend.
	ane := testIdentity.DeepCopy()
	ane.Name, ane.Spec.Worker.Backend = "tiny-ane", v1.BackendANE
	q := testPlacement("other")
	q.Spec.Identity = "tiny-ane"
	ctx := context.Background()
	for _, o := range []client.Object{ane, q} {
		if err := a.kube.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	key := types.NamespacedName{Namespace: q.Namespace, Name: q.Name}
	if _, err := (&reconciler{a: a}).Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(a.sup.Lanes(), "default/other") {
		t.Fatal("a lane of an ane identity was loaded on a sim node")
	}
	a.placementStatus(key, q)
	if q.Status.Phase != v1.PhaseFailed || q.Status.LastFault == nil || q.Status.LastFault.Code != "IdentityMismatch" {
		t.Fatalf("status %+v (fault %+v)", q.Status, q.Status.LastFault)
	}
}

// A worker's warning lines (here an injected crash's) reach the placement's status and a metric;
// its own progress lines (admissions, cache checks, probes) are not warnings.
func TestWorkerWarningsReachThePlacementStatusAndAMetric(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgentWithEnv(t, []string{"SYNAPSE_WORKER_FAULTS=crash:execute:2"}, p)
	l := loadReady(t, a, p)
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	got := p.DeepCopy()
	a.placementStatus(key, got)
	if got.Status.WorkerWarnings != nil {
		t.Fatalf("a healthy worker's progress lines were taken for warnings: %+v", got.Status.WorkerWarnings)
	}
	// The second execution crashes the worker.
	if _, err := a.serve.Run(context.Background(), l.key, "embed", [][]uint32{{1, 2, 3}}, time.Now().Add(30*time.Second)); refusal.CodeOf(err) != refusal.EngineCrashed {
		t.Fatalf("the crashing request: %v", err)
	}
	gomega.NewWithT(t).Eventually(func(g gomega.Gomega) {
		got := p.DeepCopy()
		a.placementStatus(key, got)
		w := got.Status.WorkerWarnings
		g.Expect(w).NotTo(gomega.BeNil())
		g.Expect(w.Count).To(gomega.BeEquivalentTo(1))
		g.Expect(w.Recent).To(gomega.Equal([]string{"injected fault: crash at execute"}))
		g.Expect(w.LastTime).NotTo(gomega.BeNil())
	}).WithTimeout(10 * time.Second).Should(gomega.Succeed())
	if n := testutil.ToFloat64(a.workerWarnings.WithLabelValues("default/gte")); n != 1 {
		t.Fatalf("synapse_agent_worker_warnings_total is %v", n)
	}
}

func TestOnlyAWorkersOwnProgressLinesAreNotWarnings(t *testing.T) {
	for line, warning := range map[string]bool{
		"ane-direct shape admission: shape=128 layers_loaded=2 cache_hit=0 compiled=2 total_ms=1.0 outcome=admitted": false,
		"ane-direct compile cache check: model_ref=tiny cached=[] checked=2 total_ms=0.1":                            false,
		"ane-direct placement probe: shape=128 device_ms=0.010 cpu_ms=0.025 ratio=0.40":                              false,
		"ane-direct placement probe: shape=128 simulated ratio=0.40":                                                 false,
		"":                               false,
		"injected fault: crash at admit": true,
		"ane-direct device timeout: context deadline exceeded; exiting":             true,
		"2026-11-29 12:00:00.000 synapse-ane-worker[123:456] +[_ANEClient] warning": true,
		"panic: runtime error: index out of range":                                  true,
	} {
		if got := isWorkerWarning(line); got != warning {
			t.Errorf("%q: warning %v, want %v", line, got, warning)
		}
	}
}

// A placement's request deadline is applied to the next call with the worker kept.
func TestADeadlineEditIsAppliedInPlaceWithoutRestartingTheWorker(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	ctx := context.Background()
	if err := a.kube.Create(ctx, testIdentity.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	r := &reconciler{a: a}
	if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatal(err)
	}
	l := a.entry(p)
	waitState(t, a, l, laneReady)

	edit := func(change func(*v1.LanePlacementSpec)) {
		t.Helper()
		got := &v1.LanePlacement{}
		if err := a.kube.Get(ctx, key, got); err != nil {
			t.Fatal(err)
		}
		change(&got.Spec)
		if err := a.kube.Update(ctx, got); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
			t.Fatal(err)
		}
	}
	edit(func(s *v1.LanePlacementSpec) { s.RequestDeadlineSeconds = 5 })
	a.mu.Lock()
	state, loaded := l.state, l.loaded
	a.mu.Unlock()
	if state != laneReady || !loaded {
		t.Fatalf("a deadline edit left the lane in state %d (loaded %v): it must not restart the worker", state, loaded)
	}
	lanes, _, err := a.Lookup("gte")
	if err != nil || len(lanes) != 1 || lanes[0].Deadline != 5*time.Second {
		t.Fatalf("lookup %+v, %v: want the 5 s deadline", lanes, err)
	}

}
