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

package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
)

func key(l *v1.CatalogLane) string { return l.Namespace + "/" + l.Name }

// tokens is n token ids.
func tokens(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1 + i%1000
	}
	return out
}

var _ = Describe("The fleet", func() {
	It("should place a lane on the Macs its identity certifies only, and answer embeddings in input order with the right dimensions", func() {
		l := newLane(v1.TaskEmbed, 3)
		nodes := readyOn(l)
		Expect(nodes).To(ConsistOf(matching))

		inputs := []string{"the first input", "a second, different input", "third"}
		var first []any
		for _, node := range nodes {
			status, h, body := call(node, "/v1/embeddings", map[string]any{"model": key(l), "input": inputs})
			Expect(status).To(Equal(200), "%v", body)
			data := body["data"].([]any)
			Expect(data).To(HaveLen(len(inputs)))
			for i, d := range data {
				d := d.(map[string]any)
				Expect(d["index"]).To(BeEquivalentTo(i))
				Expect(d["embedding"]).To(HaveLen(dims))
			}
			Expect(data[0]).NotTo(Equal(data[1]), "two different inputs got the same vector")
			// Every certified Mac computes the same vector for the same input.
			if first == nil {
				first = data
			} else {
				Expect(data).To(Equal(first))
			}
			Expect(h.Get("X-Synapse-Node")).To(Equal(node))
			Expect(h.Get("X-Synapse-Buckets")).To(Equal("128"))
			// Its smallest rung was probed on the device before it turned Ready.
			probes := placementOn(l, node).Status.Probes
			Expect(probes).NotTo(BeEmpty())
			Expect(probes[0].Rung).To(BeEquivalentTo(128))
			Expect(probes[0].Ratio).To(Equal("0.40"))
			Expect(body["synapse"]).To(HaveKeyWithValue("lane", key(l)))
		}

		// The Mac on another macOS build has no placement and refuses the lane.
		status, _, body := call(other, "/v1/embeddings", map[string]any{"model": key(l), "input": "x"})
		Expect(status).To(Equal(404))
		Expect(errorCode(body)).To(Equal("unknown_lane"))
	})

	It("should refuse and quarantine a corrupt artifact on one Mac, and say so on its placement, while the others serve", func() {
		id := createIdentity("tiny-corrupt-25b78", "corrupt")
		dir, err := artifact.Path(fleet.ArtifactRoot("mac-a"), "tiny", "corrupt", "ane-fp16-v1")
		Expect(err).NotTo(HaveOccurred())
		params := filepath.Join(dir, "params.json")
		data, err := os.ReadFile(params)
		Expect(err).NotTo(HaveOccurred())
		data[len(data)-2] ^= 1
		Expect(os.WriteFile(params, data, 0o644)).To(Succeed())

		l := newLane(v1.TaskEmbed, 3, func(s *v1.CatalogLaneSpec) { s.IdentityRef.Name = id.Name })
		Eventually(func(g Gomega) {
			p := placementOn(l, "mac-a")
			g.Expect(p).NotTo(BeNil())
			g.Expect(p.Status.Phase).To(Equal(v1.PhaseFailed))
			c := meta.FindStatusCondition(p.Status.Conditions, v1.PlacementConditionArtifactVerified)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal("ArtifactQuarantined"))
			g.Expect(c.Message).To(ContainSubstring("params.json"))
			for _, node := range []string{"mac-b", "mac-d"} {
				g.Expect(placementOn(l, node).Status.Phase).To(Equal(v1.PhaseReady))
			}
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		_, err = os.Stat(dir)
		Expect(os.IsNotExist(err)).To(BeTrue(), "the corrupt artifact stayed in place")
		Expect(laneWorkers("mac-a", key(l))).To(BeEmpty(), "a worker started on an unverified artifact")
		status, _, body := call("mac-a", "/v1/embeddings", map[string]any{"model": key(l), "input": "x"})
		Expect(status).To(Equal(503))
		Expect(body["error"].(map[string]any)["message"]).To(ContainSubstring("ArtifactIntegrityError"))
	})

	It("should route a request that names a model to the lane whose bucket fits it, and say why", func() {
		id := createIdentityOf("routed-25b78", "routed", "1")
		short := newLane(v1.TaskEmbed, 3, func(s *v1.CatalogLaneSpec) {
			s.IdentityRef.Name, s.Model, s.Rungs = id.Name, "routed", []v1.Rung{128, 512}
		})
		long := newLane(v1.TaskEmbed, 3, func(s *v1.CatalogLaneSpec) {
			s.IdentityRef.Name, s.Model, s.Rungs = id.Name, "routed", []v1.Rung{1024, 2048}
		})
		readyOn(short)
		readyOn(long)
		for _, tc := range []struct {
			tokens int
			lane   *v1.CatalogLane
			reason string
			status int
			bucket string
		}{
			{300, short, "smallest_fitting_bucket/smallest_fitting_bucket", 200, "512"},
			{900, long, "only_lane_that_fits/smallest_fitting_bucket", 200, "1024"},
			{3000, nil, "", 422, ""},
		} {
			status, h, body := call("mac-a", "/v1/embeddings", map[string]any{"model": "routed", "input": tokens(tc.tokens)})
			Expect(status).To(Equal(tc.status), "%d tokens: %v", tc.tokens, body)
			if tc.lane == nil {
				Expect(errorCode(body)).To(Equal("unsupported_shape"))
				continue
			}
			Expect(h.Get("X-Synapse-Lane")).To(Equal(key(tc.lane)), "%d tokens", tc.tokens)
			Expect(h.Get("X-Synapse-Routing-Reason")).To(Equal(tc.reason))
			Expect(h.Get("X-Synapse-Buckets")).To(Equal(tc.bucket))
			Expect(body["synapse"]).To(HaveKeyWithValue("routing_reason", tc.reason))
		}
		Expect(metric("mac-a", "synapse_agent_routing_decisions_total", map[string]string{"reason": "only_lane_that_fits/smallest_fitting_bucket"})).To(BeNumerically(">=", 1))
	})

	It("should rerank documents by relevance with each document's input index", func() {
		l := newLane(v1.TaskRerank, 1)
		node := readyOn(l)[0]
		docs := []string{"apple silicon neural engine", "weather report for today", "the neural engine of a mac", "recipes"}
		status, _, body := call(node, "/v1/rerank", map[string]any{"model": key(l), "query": "neural engine", "documents": docs, "return_documents": true})
		Expect(status).To(Equal(200), "%v", body)
		results := body["results"].([]any)
		Expect(results).To(HaveLen(len(docs)))
		var seen []int
		prev := 2.0
		for _, r := range results {
			r := r.(map[string]any)
			i := int(r["index"].(float64))
			score := r["relevance_score"].(float64)
			Expect(score).To(BeNumerically("<=", prev))
			Expect(r["document"]).To(HaveKeyWithValue("text", docs[i]))
			prev = score
			seen = append(seen, i)
		}
		slices.Sort(seen)
		Expect(seen).To(Equal([]int{0, 1, 2, 3}))
	})

	It("should refuse an input over the ceiling before any inference", func() {
		l := newLane(v1.TaskEmbed, 1, func(s *v1.CatalogLaneSpec) { s.Ceiling = ptrTo(int32(8000)) })
		node := readyOn(l)[0]
		compiled := metric(node, "synapse_agent_admissions_compiled_total", nil)
		loaded := metric(node, "synapse_agent_admissions_cache_hits_total", nil)
		resident := placementOn(l, node).Status.ResidentShapes

		status, _, body := call(node, "/v1/embeddings", map[string]any{"model": key(l), "input": tokens(8001)})
		Expect(status).To(Equal(422), "%v", body)
		Expect(errorCode(body)).To(Equal("unsupported_shape"))
		Expect(body["error"].(map[string]any)["message"]).To(ContainSubstring("8001 tokens"))

		// Nothing was admitted for it, and the lane's resident shapes did not change.
		Expect(metric(node, "synapse_agent_admissions_compiled_total", nil)).To(Equal(compiled))
		Expect(metric(node, "synapse_agent_admissions_cache_hits_total", nil)).To(Equal(loaded))
		Expect(placementOn(l, node).Status.ResidentShapes).To(Equal(resident))
		Expect(metric(node, "synapse_agent_requests_total", map[string]string{"lane": key(l), "code": "unsupported_shape"})).To(Equal(1.0))
	})

	It("should answer a cold shape shape_compiling with a retry time that holds", func() {
		// A one-second admission bound: the 8192 rung's cold compile is predicted longer. The
		// identity is cold everywhere, so the self-check compiles and the agent learns how fast
		// its Mac compiles: the retry time is a prediction from this machine, not the seed's.
		l := newLane(v1.TaskEmbed, 1, func(s *v1.CatalogLaneSpec) {
			s.AdmissionBoundSeconds = 1
			s.IdentityRef.Name = coldIdentity
		})
		node := readyOn(l)[0]
		req := map[string]any{"model": key(l), "input": tokens(5000)}
		status, h, body := call(node, "/v1/embeddings", req)
		Expect(status).To(Equal(503), "%v", body)
		Expect(errorCode(body)).To(Equal("shape_compiling"))
		retry := time.Duration(body["error"].(map[string]any)["retry_after_ms"].(float64)) * time.Millisecond
		Expect(retry).To(BeNumerically(">", 0))
		Expect(retry).To(BeNumerically("<", 30*time.Second), "the retry time is predicted from this Mac's own compiles")
		Expect(h.Get("Retry-After")).NotTo(BeEmpty())

		// The placement shows the compile's progress meanwhile.
		Eventually(func(g Gomega) {
			p := placementOn(l, node)
			g.Expect(p.Status.Compile).NotTo(BeNil())
			g.Expect(p.Status.Compile.Rung).To(BeEquivalentTo(8192))
			g.Expect(p.Status.Compile.LayersTotal).To(BeEquivalentTo(layers))
			g.Expect(p.Status.Compile.LayersDone).To(BeNumerically(">=", 1), "the worker reports each layer as it compiles")
			g.Expect(p.Status.Compile.PredictedReadyTime).NotTo(BeNil())
		}).WithTimeout(retry).WithPolling(50 * time.Millisecond).Should(Succeed())

		// A client that waits as told is served, on the 8192 bucket.
		<-time.After(time.Until(time.Now().Add(retry))) // the client honouring retry_after_ms
		status, h, body = call(node, "/v1/embeddings", req)
		Expect(status).To(Equal(200), "%v", body)
		Expect(h.Get("X-Synapse-Buckets")).To(Equal("8192"))
	})

	It("should restart a killed worker exactly once and report it on the placement", func() {
		l := newLane(v1.TaskEmbed, 1)
		node := readyOn(l)[0]
		pids := laneWorkers(node, key(l))
		Expect(pids).To(HaveLen(1))
		Expect(syscall.Kill(pids[0], syscall.SIGKILL)).To(Succeed())

		// The request that meets the dead worker fails; the replacement serves the next ones.
		Eventually(func(g Gomega) {
			status, _, body := call(node, "/v1/embeddings", map[string]any{"model": key(l), "input": "after the crash"})
			g.Expect(status).To(Equal(200), "%v", body)
			g.Expect(body["synapse"].(map[string]any)["worker_generations"]).To(Equal([]any{2.0}))
		}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		Eventually(func(g Gomega) {
			p := placementOn(l, node)
			g.Expect(p.Status.WorkerGeneration).To(BeEquivalentTo(2))
			g.Expect(p.Status.LastFault).NotTo(BeNil())
			g.Expect(p.Status.LastFault.Code).To(Equal("engine_crashed"))
			g.Expect(p.Status.Phase).To(Equal(v1.PhaseReady))
		}).WithTimeout(10 * time.Second).Should(Succeed())
		Expect(metric(node, "synapse_agent_lane_worker_restarts_total", map[string]string{"lane": key(l)})).To(Equal(1.0))
		Consistently(func(g Gomega) {
			g.Expect(laneWorkers(node, key(l))).To(HaveLen(1))
			g.Expect(metric(node, "synapse_agent_worker_generation", map[string]string{"lane": key(l)})).To(Equal(2.0))
		}).WithTimeout(2 * time.Second).Should(Succeed())
	})

	It("should mark a stopped Mac Unknown and re-place its lanes on the others", func() {
		l := newLane(v1.TaskEmbed, 2)
		nodes := readyOn(l)
		victim := nodes[0]
		fleet.KillMac(victim)
		DeferCleanup(restartMac, victim)

		Eventually(func(g Gomega) {
			n := &v1.MacNode{}
			g.Expect(kube.Get(ctx, client.ObjectKey{Name: victim}, n)).To(Succeed())
			g.Expect(readyStatus(n)).To(Equal(metav1.ConditionUnknown))
		}).WithTimeout(20 * time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			ps := placements(l)
			g.Expect(ps).To(HaveLen(2))
			for _, p := range ps {
				g.Expect(p.Spec.Node).NotTo(Equal(victim))
				g.Expect(p.Status.Phase).To(Equal(v1.PhaseReady))
			}
		}).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	})

	It("should unload a paused Mac's lanes, keep its placements, and load them again on resume", func() {
		l := newLane(v1.TaskEmbed, 3)
		readyOn(l)
		node := matching[0]
		pause := func(paused bool) {
			n := &v1.MacNode{}
			Expect(kube.Get(ctx, client.ObjectKey{Name: node}, n)).To(Succeed())
			stored := n.DeepCopy()
			n.Spec.Paused = paused
			Expect(kube.Patch(ctx, n, client.MergeFrom(stored))).To(Succeed())
		}
		pause(true)
		DeferCleanup(pause, false)
		Eventually(func(g Gomega) {
			p := placementOn(l, node)
			g.Expect(p).NotTo(BeNil())
			g.Expect(p.Status.Phase).To(Equal(v1.PhasePaused))
			g.Expect(laneWorkers(node, key(l))).To(BeEmpty())
		}).WithTimeout(20 * time.Second).Should(Succeed())
		status, _, body := call(node, "/v1/embeddings", map[string]any{"model": key(l), "input": "x"})
		Expect(status).To(Equal(503))
		Expect(errorCode(body)).To(Equal("node_paused"))
		Expect(placements(l)).To(HaveLen(3))

		pause(false)
		Expect(readyOn(l)).To(ContainElement(node))
		Expect(laneWorkers(node, key(l))).To(HaveLen(1))
	})

	It("should retire a scaled-down placement's worker before the placement disappears", func() {
		l := newLane(v1.TaskEmbed, 2)
		readyOn(l)
		before := placements(l)
		got := &v1.CatalogLane{}
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), got)).To(Succeed())
		stored := got.DeepCopy()
		got.Spec.Replicas = 1
		Expect(kube.Patch(ctx, got, client.MergeFrom(stored))).To(Succeed())

		var gone *v1.LanePlacement
		Eventually(func(g Gomega) {
			for i := range before {
				p := &v1.LanePlacement{}
				err := kube.Get(ctx, types.NamespacedName{Namespace: l.Namespace, Name: before[i].Name}, p)
				if client.IgnoreNotFound(err) == nil && err != nil {
					gone = &before[i]
				}
			}
			g.Expect(gone).NotTo(BeNil())
		}).WithTimeout(30 * time.Second).WithPolling(20 * time.Millisecond).Should(Succeed())
		// By the time the placement is gone its worker has exited and the lane is unloaded.
		Expect(laneWorkers(gone.Spec.Node, key(l))).To(BeEmpty())
		_, loaded := sample(gone.Spec.Node, "synapse_agent_worker_generation", map[string]string{"lane": key(l)})
		Expect(loaded).To(BeFalse())
		Expect(readyOn(l)).To(HaveLen(1))
	})

	It("should lose nothing when the API server restarts, and catch status up when it returns", func() {
		l := newLane(v1.TaskEmbed, 2)
		nodes := readyOn(l)
		before := map[string]types.UID{}
		for _, p := range placements(l) {
			before[p.Name] = p.UID
		}
		// A caller the Mac has let in just now (its token's review is kept 2 minutes, its
		// access 5), and one it has not seen.
		known, err := fleet.Caller(ctx, "default", "e2e-client", true, true)
		Expect(err).NotTo(HaveOccurred())
		status, _, body := callAs(known, nodes[0], "/v1/embeddings", map[string]any{"model": key(l), "input": "before the API server goes"})
		Expect(status).To(Equal(200), "%v", body)
		unseen, err := fleet.Caller(ctx, "default", "e2e-client", true, true)
		Expect(err).NotTo(HaveOccurred())
		Expect(fleet.RestartAPIServer(func() {
			// While it is away the agents keep serving the callers whose decisions they hold,
			// and a worker crash is handled locally; a caller the Mac cannot review now is
			// told to retry, neither let in nor refused.
			status, h, body := callAs(unseen, nodes[0], "/v1/embeddings", map[string]any{"model": key(l), "input": "x"})
			Expect(status).To(Equal(503), "%v", body)
			Expect(errorCode(body)).To(Equal("auth_unavailable"))
			Expect(h.Get("Retry-After")).NotTo(BeEmpty())
			status, _, body = callAs(known, nodes[0], "/v1/embeddings", map[string]any{"model": key(l), "input": "while the API server is away"})
			Expect(status).To(Equal(200), "%v", body)
			pids := laneWorkers(nodes[0], key(l))
			Expect(pids).To(HaveLen(1))
			Expect(syscall.Kill(pids[0], syscall.SIGKILL)).To(Succeed())
			Eventually(func(g Gomega) {
				status, _, body := callAs(known, nodes[0], "/v1/embeddings", map[string]any{"model": key(l), "input": "after the crash"})
				g.Expect(status).To(Equal(200), "%v", body)
			}).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).Should(Succeed())
		})).To(Succeed())

		Eventually(func(g Gomega) {
			ps := placements(l)
			g.Expect(ps).To(HaveLen(2))
			for _, p := range ps {
				g.Expect(before).To(HaveKeyWithValue(p.Name, p.UID), "placement %s was replaced", p.Name)
				g.Expect(p.Status.Phase).To(Equal(v1.PhaseReady))
				if p.Spec.Node == nodes[0] {
					g.Expect(p.Status.WorkerGeneration).To(BeEquivalentTo(2), "the crash during the outage is reported")
				}
			}
			got := &v1.CatalogLane{}
			g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), got)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady)).To(BeTrue())
		}).WithTimeout(60 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
	})

	It("should re-adopt its placements when an agent restarts, without duplicating them", func() {
		l := newLane(v1.TaskEmbed, 1)
		node := readyOn(l)[0]
		p := placementOn(l, node)
		Expect(fleet.StopMac(node)).To(Succeed())
		// A stopped agent says so: its placement is no longer Ready.
		Expect(placementOn(l, node).Status.Phase).To(Equal(v1.PhasePending))
		restartMac(node)
		Expect(readyOn(l)).To(Equal([]string{node}))
		Expect(placements(l)).To(HaveLen(1))
		Expect(placementOn(l, node).UID).To(Equal(p.UID))
		Expect(laneWorkers(node, key(l))).To(HaveLen(1))
	})
})

func ptrTo[T any](v T) *T { return &v }
