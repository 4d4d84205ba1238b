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

// Package e2e runs the whole system as processes: the control plane, synapse-controller and
// four simulated Macs (synapse-agent with real sim worker processes), driven through the API
// server and the agents' HTTP API, with faults injected by killing processes.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/localfleet"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

func TestE2E(t *testing.T) {
	testenv.RunSpecs(t, "End to end")
}

const (
	// identity is a small certified model: 4 layers of width 64, 32-dimensional vectors.
	identity = "tiny-25b78"
	// coldIdentity is the same model under another identity: nothing of it is in any Mac's
	// aned cache until a spec compiles it.
	coldIdentity = "tiny-cold-25b78"
	dims         = 32
	layers       = 4
)

var (
	fleet *localfleet.Fleet
	kube  client.Client
	ctx   = context.Background()
	out   = &syncBuffer{}
	// matching are the Macs on the identity's macOS build; other runs another build.
	matching = []string{"mac-a", "mac-b", "mac-d"}
	other    = "mac-c"
	macs     = map[string]localfleet.Mac{}
	// token is the suite's own caller's: a ServiceAccount of namespace default that may call
	// that namespace's lanes and read the Macs' metrics, as RBAC grants them.
	token string
)

var _ = BeforeSuite(func() {
	ctrllog.SetLogger(GinkgoLogr)
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	Expect(assets).NotTo(BeEmpty(), "run 'make test' so that KUBEBUILDER_ASSETS points at the control-plane binaries")
	bin := GinkgoT().TempDir()
	Expect(localfleet.Build(bin)).To(Succeed())
	for _, m := range []localfleet.Mac{{Name: "mac-a", MacOSBuild: "25B78"}, {Name: "mac-b", MacOSBuild: "25B78"},
		{Name: "mac-c", MacOSBuild: "25C56"}, {Name: "mac-d", MacOSBuild: "25B78"}} {
		macs[m.Name] = m
	}
	var err error
	fleet, err = localfleet.Start(ctx, localfleet.Options{
		Assets: assets, Config: testenv.ConfigDir(), Bin: bin, Dir: GinkgoT().TempDir(), SimScale: 0.01, Out: out,
		Macs:          []localfleet.Mac{macs["mac-a"], macs["mac-b"], macs["mac-c"], macs["mac-d"]},
		LeaseDuration: 3 * time.Second, StatusInterval: 200 * time.Millisecond,
		// The compiles here take a second or two: their layers are reported as they go.
		PlacementProgressInterval: 200 * time.Millisecond,
		// Short, so a lost Mac is noticed in seconds; the eviction timeout outlasts an API server
		// restart, during which no Lease can be renewed.
		NodeGracePeriod: 4 * time.Second, NodeEvictionTimeout: 20 * time.Second,
		// Each Mac on addresses of its own and one port they share, as a real fleet's: a lane's
		// endpoints are then one EndpointSlice, whose updates the rollout spec follows.
		OwnAddresses: true,
	})
	Expect(err).NotTo(HaveOccurred(), out.String())
	kube = fleet.Client
	token, err = fleet.Caller(ctx, "default", "e2e-client", true, true)
	Expect(err).NotTo(HaveOccurred())
	for _, name := range []string{identity, coldIdentity} {
		createIdentity(name, "1")
	}
})

// createIdentity certifies the tiny model at revision rev under name, and installs its
// artifact on the Macs of its macOS build.
func createIdentity(name, rev string) *v1.CertifiedIdentity {
	GinkgoHelper()
	return createIdentityOf(name, "tiny", rev)
}

// createIdentityOf is createIdentity for a model of another name.
func createIdentityOf(name, model, rev string) *v1.CertifiedIdentity {
	GinkgoHelper()
	digest := fleet.WorkerDigest
	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.CertifiedIdentitySpec{
		Worker:           v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Model:            v1.ModelIdentity{Name: model, Revision: rev, CheckpointDigest: digest, Layers: layers, HiddenSize: 64, EmbeddingDimensions: dims},
		ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: digest}, MacOSBuild: "25B78", VectorSpaceID: model + "/" + rev}}
	Expect(kube.Create(ctx, id)).To(Succeed())
	Expect(fleet.InstallArtifact(id)).To(Succeed())
	return id
}

var _ = AfterSuite(func() {
	if fleet != nil {
		Expect(fleet.Stop()).To(Succeed())
	}
})

var _ = ReportAfterEach(func(r SpecReport) {
	if r.Failed() {
		AddReportEntry("fleet output", out.String())
	}
})

// syncBuffer collects the processes' output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	if len(s) > 20000 {
		s = "...\n" + s[len(s)-20000:]
	}
	return s
}

var laneSeq int

// newLane creates a lane of the tiny identity; opts adjust its spec.
func newLane(task v1.Task, replicas int32, opts ...func(*v1.CatalogLaneSpec)) *v1.CatalogLane {
	GinkgoHelper()
	laneSeq++
	l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lane-%d", laneSeq), Namespace: "default"},
		Spec: v1.CatalogLaneSpec{Model: "tiny", Task: task, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: identity},
			Rungs: []v1.Rung{128, 512, 8192}, Replicas: replicas, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	for _, o := range opts {
		o(&l.Spec)
	}
	Expect(kube.Create(ctx, l)).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(kube.Delete(ctx, l))).To(Succeed())
		// What the garbage collector, which envtest does not run, does for the lane's placements
		// (its owned objects): without it the Macs would keep every finished spec's lanes loaded.
		Expect(kube.DeleteAllOf(ctx, &v1.LanePlacement{}, client.InNamespace(l.Namespace), client.MatchingLabels{v1.LabelLane: l.Name})).To(Succeed())
	})
	return l
}

func placements(l *v1.CatalogLane) []v1.LanePlacement {
	GinkgoHelper()
	var ps v1.LanePlacementList
	Expect(kube.List(ctx, &ps, client.InNamespace(l.Namespace), client.MatchingLabels{v1.LabelLane: l.Name})).To(Succeed())
	return ps.Items
}

func placementOn(l *v1.CatalogLane, node string) *v1.LanePlacement {
	GinkgoHelper()
	for _, p := range placements(l) {
		if p.Spec.Node == node {
			return &p
		}
	}
	return nil
}

// readyOn waits until the lane is Ready with a Ready placement on each of its nodes, and returns
// the nodes.
func readyOn(l *v1.CatalogLane) []string {
	GinkgoHelper()
	var nodes []string
	Eventually(func(g Gomega) {
		got := &v1.CatalogLane{}
		g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), got)).To(Succeed())
		ps := placements(l)
		// What a failure says: each placement's phase and why, and the lane's Ready condition,
		// so a timeout shows which side (the agent's status or the controller's count) lags.
		seen := describeReadiness(got, ps)
		g.Expect(ps).To(HaveLen(int(got.Spec.Replicas)), seen)
		nodes = nil
		for _, p := range ps {
			g.Expect(p.Status.Phase).To(Equal(v1.PhaseReady), "placement %s; %s", p.Name, seen)
			nodes = append(nodes, p.Spec.Node)
		}
		g.Expect(got.Status.ReadyReplicas).To(Equal(got.Spec.Replicas), seen)
	}).WithTimeout(60 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
	return nodes
}

// describeReadiness says, for a failure message, where a lane and its placements stand.
func describeReadiness(l *v1.CatalogLane, ps []v1.LanePlacement) string {
	var b strings.Builder
	fmt.Fprintf(&b, "lane %s: generation %d, observed %d, ready replicas %d of %d", l.Name, l.Generation, l.Status.ObservedGeneration,
		l.Status.ReadyReplicas, l.Spec.Replicas)
	if c := meta.FindStatusCondition(l.Status.Conditions, v1.ConditionReady); c != nil {
		fmt.Fprintf(&b, ", Ready=%s %s: %s", c.Status, c.Reason, c.Message)
	}
	for _, p := range ps {
		fmt.Fprintf(&b, "; placement %s on %s: phase %s, resource version %s", p.Name, p.Spec.Node, p.Status.Phase, p.ResourceVersion)
		if c := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionReady); c != nil {
			fmt.Fprintf(&b, ", Ready=%s %s: %s", c.Status, c.Reason, c.Message)
		}
	}
	return b.String()
}

// call posts a JSON body to a Mac's API, as the suite's caller, and decodes the answer.
func call(node, path string, body any) (int, http.Header, map[string]any) {
	GinkgoHelper()
	return callAs(token, node, path, body)
}

// callAs is call with another caller's token.
func callAs(token, node, path string, body any) (int, http.Header, map[string]any) {
	GinkgoHelper()
	data, err := json.Marshal(body)
	Expect(err).NotTo(HaveOccurred())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fleet.URL(node)+path, bytes.NewReader(data))
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient(node).Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	var m map[string]any
	Expect(json.Unmarshal(raw, &m)).To(Succeed(), string(raw))
	return resp.StatusCode, resp.Header, m
}

// httpClient is a client of a Mac's API: it trusts the fleet's CA bundle, read from the
// ClusterTrustBundle, and expects the Mac's name in its certificate (the suite calls the
// loopback).
func httpClient(node string) *http.Client {
	GinkgoHelper()
	c, err := fleet.HTTPClient(ctx, node)
	Expect(err).NotTo(HaveOccurred())
	return c
}

func errorCode(body map[string]any) string {
	if e, ok := body["error"].(map[string]any); ok {
		s, _ := e["code"].(string)
		return s
	}
	return ""
}

// metric reads one sample of a Mac's /metrics, 0 if it has none.
func metric(node, name string, labels map[string]string) float64 {
	GinkgoHelper()
	v, _ := sample(node, name, labels)
	return v
}

// sample reads one sample of a Mac's /metrics; ok is false if it has none.
func sample(node, name string, labels map[string]string) (float64, bool) {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fleet.URL(node)+"/metrics", nil)
	Expect(err).NotTo(HaveOccurred())
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := httpClient(node).Do(req)
	Expect(err).NotTo(HaveOccurred())
	Expect(resp.StatusCode).To(Equal(http.StatusOK))
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	fam := families[name]
	if fam == nil {
		return 0, false
	}
	for _, m := range fam.Metric {
		if matches(m, labels) {
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue(), true
			case m.Counter != nil:
				return m.Counter.GetValue(), true
			}
		}
	}
	return 0, false
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.Label {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

// workers lists the worker processes a Mac's agent runs: its children, which any of its
// threads may have started.
func workers(node string) []int {
	GinkgoHelper()
	pid := fleet.PID(node)
	Expect(pid).NotTo(BeZero())
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
	Expect(err).NotTo(HaveOccurred())
	var out []int
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue // the thread ended
		}
		for _, f := range strings.Fields(string(data)) {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
	}
	return out
}

// restartMac starts a stopped Mac again and waits until its node is Ready.
func restartMac(name string) {
	GinkgoHelper()
	Expect(fleet.StartMac(ctx, macs[name])).To(Succeed())
	Eventually(func(g Gomega) {
		n := &v1.MacNode{}
		g.Expect(kube.Get(ctx, client.ObjectKey{Name: name}, n)).To(Succeed())
		g.Expect(metav1.ConditionTrue).To(Equal(readyStatus(n)))
	}).WithTimeout(30 * time.Second).Should(Succeed())
}

func readyStatus(n *v1.MacNode) metav1.ConditionStatus {
	for _, c := range n.Status.Conditions {
		if c.Type == v1.ConditionReady {
			return c.Status
		}
	}
	return ""
}

// laneWorkers lists the worker processes of a lane (namespace/name) on a Mac, by the
// SYNAPSE_LANE the agent sets in each worker's environment.
func laneWorkers(node, lane string) []int {
	GinkgoHelper()
	var out []int
	for _, pid := range workers(node) {
		env, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
		if err != nil {
			continue // it exited meanwhile
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if kv == "SYNAPSE_LANE="+lane {
				out = append(out, pid)
			}
		}
	}
	return out
}
