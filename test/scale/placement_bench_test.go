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

// Package scale measures the controllers against a real API server at fleet scale.
package scale

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

func env(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// BenchmarkPlacementAtScale places M lanes (SCALE_LANES, default 500) of one replica on N
// MacNodes (SCALE_NODES, default 100) through a real API server, reconciling every lane once by
// hand with the controller fed by informers as the manager feeds it, and reports the time
// until every lane is placed, the API requests per placement, and the writes of a resync with
// nothing to change (the goal is zero). Before any figure it checks where the lanes went: every
// lane placed, no node charged past its budget, and lanes per node within one of even.
//
// The controller reads through an informer cache, as it does in the manager: only its writes
// reach the API server, and the reads it makes of the cache are reported apart.
func BenchmarkPlacementAtScale(b *testing.B) {
	nodes, lanes := env("SCALE_NODES", 100), env("SCALE_LANES", 500)
	const layers, budget = 12, 100 // eight shapes fit a node; five lanes a node is even
	te, err := testenv.Start()
	if err != nil {
		b.Fatal(err)
	}
	defer te.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var reads, writes atomic.Int64
	informers, err := cache.New(te.Config, cache.Options{Scheme: te.Scheme})
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = informers.Start(ctx) }()
	c, err := client.New(te.Config, client.Options{Scheme: te.Scheme, Cache: &client.CacheOptions{Reader: informers}})
	if err != nil {
		b.Fatal(err)
	}
	kube := testenv.Counting(client.WithWatch(withWatch{c}), &reads, &writes)
	ctl := placement.NewController(clocktesting.NewFakeClock(time.Now()), kube, events.NewFakeRecorder(lanes*4))
	for _, o := range []client.Object{&v1.CatalogLane{}, &v1.LanePlacement{}, &v1.MacNode{}, &v1.CertifiedIdentity{}, &v1.PrewarmPolicy{}} {
		inf, err := informers.GetInformer(ctx, o)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := inf.AddEventHandler(feed{ctl}); err != nil {
			b.Fatal(err)
		}
	}
	if !informers.WaitForCacheSync(ctx) {
		b.Fatal("the informer cache did not sync")
	}

	digest := v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 42))
	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "gte"}, Spec: v1.CertifiedIdentitySpec{
		Worker: v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Model: v1.ModelIdentity{Name: "gte", Revision: "r", Layers: layers, HiddenSize: 768, EmbeddingDimensions: 768,
			CheckpointDigest: digest}, ConversionPolicy: v1.ConversionPolicy{Name: "p", Digest: digest}, MacOSBuild: "25B78", VectorSpaceID: "gte"}}
	if err := te.Client.Create(ctx, id); err != nil {
		b.Fatal(err)
	}
	for i := range nodes {
		n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("mac-%04d", i)}}
		if err := te.Client.Create(ctx, n); err != nil {
			b.Fatal(err)
		}
		n.Status = v1.MacNodeStatus{Platform: v1.Platform{MacOSBuild: "25B78"},
			Worker:   v1.NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
			Capacity: v1.ExecutableBudget{LayerExecutables: budget},
			Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed,
				LastTransitionTime: metav1.Now()}}}
		if err := te.Client.Status().Update(ctx, n); err != nil {
			b.Fatal(err)
		}
	}
	var reqs []reconcile.Request
	for i := range lanes {
		l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lane-%05d", i), Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
				Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		if err := te.Client.Create(ctx, l); err != nil {
			b.Fatal(err)
		}
		reqs = append(reqs, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(l)})
	}

	// Every object the reconciles will read is in the cache before the clock starts.
	gomega.NewWithT(b).Eventually(func(g gomega.Gomega) {
		var ns v1.MacNodeList
		g.Expect(kube.List(ctx, &ns)).To(gomega.Succeed())
		g.Expect(ns.Items).To(gomega.HaveLen(nodes))
		for _, n := range ns.Items {
			g.Expect(n.Status.Conditions).NotTo(gomega.BeEmpty())
		}
		var ls v1.CatalogLaneList
		g.Expect(kube.List(ctx, &ls)).To(gomega.Succeed())
		g.Expect(ls.Items).To(gomega.HaveLen(lanes))
	}).WithTimeout(time.Minute).Should(gomega.Succeed())
	reads.Store(0)
	b.ResetTimer()
	start := time.Now()
	for _, r := range reqs {
		if _, err := ctl.Reconcile(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	placedIn := time.Since(start)
	b.StopTimer()
	placedReads, placedWrites := reads.Load(), writes.Load()

	var ps v1.LanePlacementList
	if err := te.Client.List(ctx, &ps); err != nil {
		b.Fatal(err)
	}
	if len(ps.Items) != lanes {
		b.Fatalf("%d placements for %d lanes", len(ps.Items), lanes)
	}
	if err := checkSpread(ps.Items, nodes, layers, budget); err != nil {
		b.Fatal(err)
	}
	// The resync reads what the first pass wrote: wait until the cache has all of it.
	gomega.NewWithT(b).Eventually(func(g gomega.Gomega) {
		var cachedPs v1.LanePlacementList
		g.Expect(kube.List(ctx, &cachedPs)).To(gomega.Succeed())
		g.Expect(cachedPs.Items).To(gomega.HaveLen(lanes))
		var ls v1.CatalogLaneList
		g.Expect(kube.List(ctx, &ls)).To(gomega.Succeed())
		for _, l := range ls.Items {
			g.Expect(l.Status.Replicas).To(gomega.BeEquivalentTo(1))
		}
	}).WithTimeout(time.Minute).Should(gomega.Succeed())
	writes.Store(0)
	for _, r := range reqs {
		if _, err := ctl.Reconcile(ctx, r); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(placedIn.Seconds(), "s-to-place-all")
	b.ReportMetric(float64(placedReads)/float64(lanes), "cache-reads/placement")
	b.ReportMetric(float64(placedWrites)/float64(lanes), "writes/placement")
	b.ReportMetric(float64(writes.Load()), "idle-resync-writes")
}

// checkSpread checks where single-replica lanes of one identity went: no node charged past its
// budget, and lanes per node within one of even when the budget allows it.
func checkSpread(ps []v1.LanePlacement, nodes int, layers, budget int32) error {
	perNode := map[string]int{}
	for _, p := range ps {
		perNode[p.Spec.Node]++
	}
	lo, hi := len(ps), 0
	for i := range nodes {
		k := perNode[fmt.Sprintf("mac-%04d", i)]
		lo, hi = min(lo, k), max(hi, k)
		if int32(k)*layers > budget {
			return fmt.Errorf("node mac-%04d holds %d lanes: %d executables of its %d", i, k, int32(k)*layers, budget)
		}
	}
	if fits := int(budget/layers) * nodes; len(ps) <= fits && hi-lo > 1 {
		return fmt.Errorf("lanes per node range from %d to %d: not within one of even", lo, hi)
	}
	return nil
}

// feed hands an informer's events to the controller, as its event handlers do in the manager.
type feed struct{ ctl *placement.Controller }

func (f feed) OnAdd(o any, _ bool) { f.observe(o) }
func (f feed) OnUpdate(_, o any)   { f.observe(o) }
func (f feed) OnDelete(o any) {
	if t, ok := o.(toolscache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if obj, ok := o.(client.Object); ok {
		f.ctl.Gone(obj)
	}
}
func (f feed) observe(o any) {
	if obj, ok := o.(client.Object); ok {
		f.ctl.Observe(obj)
	}
}

// withWatch makes a cache-backed client a client.WithWatch for testenv.Counting; the benchmark
// never watches through it.
type withWatch struct{ client.Client }

func (withWatch) Watch(context.Context, client.ObjectList, ...client.ListOption) (watch.Interface, error) {
	return nil, errors.New("not used")
}
