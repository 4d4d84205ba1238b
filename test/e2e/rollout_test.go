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
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// answer is one call of the rollout's client: the vector space its answer came from, or its
// error.
type answer struct {
	space string
	err   error
}

// endpointNodes are the Macs the EndpointSlices of the lane named by key list as ready, as a
// client that balances over the slices (kube-proxy, a mesh) sees them: each Mac of this
// one-machine fleet serves on its own port, which names it. It takes the lane's key, not the
// lane, because the client's goroutine reads it while the spec updates the lane.
func endpointNodes(key client.ObjectKey) ([]string, error) {
	var slices discoveryv1.EndpointSliceList
	if err := kube.List(ctx, &slices, client.InNamespace(key.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: key.Name}); err != nil {
		return nil, err
	}
	var nodes v1.MacNodeList
	if err := kube.List(ctx, &nodes); err != nil {
		return nil, err
	}
	byPort := map[int32]string{}
	for _, n := range nodes.Items {
		byPort[n.Status.ServingPort] = n.Name
	}
	var out []string
	for _, s := range slices.Items {
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready && len(s.Ports) > 0 && s.Ports[0].Port != nil {
				out = append(out, byPort[*s.Ports[0].Port])
			}
		}
	}
	return out, nil
}

var _ = Describe("Rollouts", func() {
	It("should move a lane to a new vector space while the official client calls it without pause: no call fails, no answer of the old space after one of the new", func() {
		if fleet.AdvertisedIP() == "127.0.0.1" {
			Skip("this machine has no address an EndpointSlice may hold, so a client has no endpoints to follow")
		}
		l := newLane(v1.TaskEmbed, 1)
		readyOn(l)
		laneKey := client.ObjectKeyFromObject(l)
		Eventually(func() ([]string, error) { return endpointNodes(laneKey) }).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).ShouldNot(BeEmpty())
		oldSpace, newSpace := "tiny/1", "tiny/2"
		createIdentity("tiny-2-25b78", "2")

		// The client follows the lane's EndpointSlices, as a balancer does, and calls a listed
		// Mac through the official client with its token, one call after another.
		var (
			mu       sync.Mutex
			answers  []answer
			stop     = make(chan struct{})
			finished = make(chan struct{})
		)
		count := func() int { mu.Lock(); defer mu.Unlock(); return len(answers) }
		// However the spec ends, the client stops with it, a call in flight cancelled: a client
		// left calling would run into the specs after this one.
		callCtx, cancelCalls := context.WithCancel(ctx)
		stopClient := sync.OnceFunc(func() { close(stop); cancelCalls(); <-finished })
		DeferCleanup(stopClient)
		params := openai.EmbeddingNewParams{Model: openai.EmbeddingModel(key(l)),
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"a rollout must not mix spaces"}}}
		go func() {
			defer GinkgoRecover()
			defer close(finished)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				nodes, err := endpointNodes(laneKey)
				if err != nil || len(nodes) == 0 {
					// A balancer with no endpoint (or that cannot read the slices) holds the
					// call until the slices list one.
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
					continue
				}
				var resp *http.Response
				_, err = openAI(nodes[i%len(nodes)], token).Embeddings.New(callCtx, params, option.WithResponseInto(&resp))
				a := answer{err: err}
				if err == nil {
					a.space = resp.Header.Get("X-Synapse-Vector-Space")
				}
				select {
				case <-stop:
					return // cancelled with the client, not an answer of the rollout
				default:
				}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		}()
		Eventually(count).WithTimeout(30 * time.Second).Should(BeNumerically(">=", 10))

		By("switching the lane's identity to one of another vector space")
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), l)).To(Succeed())
		l.Spec.IdentityRef.Name = "tiny-2-25b78"
		Expect(kube.Update(ctx, l)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &v1.CatalogLane{}
			g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(l), got)).To(Succeed())
			g.Expect(got.Status.VectorSpaceID).To(Equal(newSpace))
			c := meta.FindStatusCondition(got.Status.Conditions, v1.LaneConditionProgressing)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Reason).To(Equal(v1.LaneReasonRolloutComplete), c.Message)
			ps := placements(l)
			g.Expect(ps).To(HaveLen(1))
			g.Expect(ps[0].Spec.Identity).To(Equal("tiny-2-25b78"))
		}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(Succeed())
		after := count()
		Eventually(count).WithTimeout(30 * time.Second).Should(BeNumerically(">=", after+10))
		stopClient()

		mu.Lock()
		defer mu.Unlock()
		var spaces []string
		for i, a := range answers {
			Expect(a.err).NotTo(HaveOccurred(), "call %d of %d failed during the rollout", i, len(answers))
			spaces = append(spaces, a.space)
		}
		first := slices.Index(spaces, newSpace)
		Expect(first).To(BeNumerically(">", 0), "answers: %v", spaces)
		for i, s := range spaces {
			want := oldSpace
			if i >= first {
				want = newSpace
			}
			Expect(s).To(Equal(want), fmt.Sprintf("answer %d came from %s; the spaces in order: %v", i, s, spaces))
		}
	})
})
