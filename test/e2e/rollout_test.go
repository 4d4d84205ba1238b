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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
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
// client that balances over the slices (kube-proxy, a mesh) sees them: each endpoint's address
// is the one a Mac's MacNode reports (status.addresses), which names it; the client then calls
// that Mac on its own loopback address (the advertised one is a documentation address nothing
// listens on). It takes the lane's key, not the lane, because the client's goroutine reads it
// while the spec updates the lane.
func endpointNodes(key client.ObjectKey) ([]string, error) {
	var list discoveryv1.EndpointSliceList
	if err := kube.List(ctx, &list, client.InNamespace(key.Namespace), client.MatchingLabels{discoveryv1.LabelServiceName: key.Name}); err != nil {
		return nil, err
	}
	var nodes v1.MacNodeList
	if err := kube.List(ctx, &nodes); err != nil {
		return nil, err
	}
	byAddress := map[string]string{}
	for _, n := range nodes.Items {
		for _, a := range n.Status.Addresses {
			byAddress[a.Address] = n.Name
		}
	}
	var out []string
	for _, s := range list.Items {
		for _, e := range s.Endpoints {
			if !isReady(e) || len(e.Addresses) == 0 {
				continue
			}
			// A consumer uses an endpoint's first address (discovery/v1's Endpoint.Addresses).
			node, ok := byAddress[e.Addresses[0]]
			if !ok {
				return nil, fmt.Errorf("EndpointSlice %s lists %s, no MacNode's address", s.Name, e.Addresses[0])
			}
			out = append(out, node)
		}
	}
	return out, nil
}

// isReady says whether an endpoint takes new traffic: its ready condition, nil read as true
// (k8s.io/api, discovery/v1/types.go: EndpointConditions.Ready).
func isReady(e discoveryv1.Endpoint) bool {
	return e.Conditions.Ready == nil || *e.Conditions.Ready
}

// sliceState is a lane's EndpointSlice as one event of a watch carried it: the event, the
// slice, and the addresses it listed as ready, sorted.
type sliceState struct {
	event watch.EventType
	name  string
	uid   types.UID
	ready []string
}

func (s sliceState) String() string {
	return fmt.Sprintf("%s %s(%s) ready %v", s.event, s.name, s.uid, s.ready)
}

func stateOf(event watch.EventType, obj runtime.Object) sliceState {
	s, ok := obj.(*discoveryv1.EndpointSlice)
	if !ok {
		// An Error event carries a Status, not a slice.
		return sliceState{event: event, name: fmt.Sprintf("%T %v", obj, obj)}
	}
	st := sliceState{event: event, name: s.Name, uid: s.UID, ready: []string{}}
	for _, e := range s.Endpoints {
		if isReady(e) {
			st.ready = append(st.ready, e.Addresses...)
		}
	}
	slices.Sort(st.ready)
	return st
}

// sliceWatch records every state of a lane's EndpointSlices in order, as a balancer that
// watches them sees them: the one listed when it starts, then every event of a watch from
// that list's resourceVersion, so that no write in between is missed.
type sliceWatch struct {
	mu     sync.Mutex
	states []sliceState
	// ended says the watch closed before the spec stopped it: what it saw is then not all.
	ended bool
	// stop ends the watch and waits for its goroutine; the spec's cleanup calls it too.
	stop func()
}

func (w *sliceWatch) seen() ([]sliceState, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.states), w.ended
}

// watchSlices starts a sliceWatch of the lane named key, whose one EndpointSlice lists its
// endpoints now.
func watchSlices(key client.ObjectKey) *sliceWatch {
	GinkgoHelper()
	cs, err := kubernetes.NewForConfig(fleet.Config)
	Expect(err).NotTo(HaveOccurred())
	api := cs.DiscoveryV1().EndpointSlices(key.Namespace)
	selector := labels.Set{discoveryv1.LabelServiceName: key.Name}.String()
	list, err := api.List(ctx, metav1.ListOptions{LabelSelector: selector})
	Expect(err).NotTo(HaveOccurred())
	Expect(list.Items).To(HaveLen(1), "the lane's EndpointSlices before the rollout")
	w, err := api.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: list.ResourceVersion})
	Expect(err).NotTo(HaveOccurred())
	sw := &sliceWatch{states: []sliceState{stateOf(watch.Added, &list.Items[0])}}
	stopped, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			select {
			case <-stopped:
				// What the watch says as it is stopped (the closed stream's error) is none of
				// the lane's states.
				continue
			default:
			}
			sw.mu.Lock()
			sw.states = append(sw.states, stateOf(ev.Type, ev.Object))
			sw.mu.Unlock()
		}
		select {
		case <-stopped:
		default:
			sw.mu.Lock()
			sw.ended = true
			sw.mu.Unlock()
		}
	}()
	sw.stop = sync.OnceFunc(func() { close(stopped); w.Stop(); <-done })
	DeferCleanup(sw.stop)
	return sw
}

var _ = Describe("Rollouts", func() {
	It("should move a lane to a new vector space in one EndpointSlice update while the official client calls it without pause: no call fails, no answer of the old space after one of the new", func() {
		l := newLane(v1.TaskEmbed, 1)
		oldMac := readyOn(l)[0]
		laneKey := client.ObjectKeyFromObject(l)
		Eventually(func() ([]string, error) { return endpointNodes(laneKey) }).WithTimeout(30 * time.Second).WithPolling(100 * time.Millisecond).
			Should(Equal([]string{oldMac}))
		oldSpace, newSpace := "tiny/1", "tiny/2"
		createIdentity("tiny-2-25b78", "2")
		// Started before the edit, it sees every write of the lane's slices the rollout makes.
		slicesSeen := watchSlices(laneKey)

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
		newMac := placements(l)[0].Spec.Node
		Expect(newMac).NotTo(Equal(oldMac), "blue/green: the new placement comes up beside the old, on another Mac")
		oldAddr, newAddr := fleet.AdvertisedAddress(oldMac), fleet.AdvertisedAddress(newMac)
		Eventually(func() ([]string, error) {
			states, ended := slicesSeen.seen()
			if ended {
				return nil, StopTrying(fmt.Sprintf("the watch of the lane's EndpointSlices ended early, after %v", states))
			}
			return states[len(states)-1].ready, nil
		}).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).Should(Equal([]string{newAddr}), "the watch saw the slice list the new Mac")
		after := count()
		Eventually(count).WithTimeout(30 * time.Second).Should(BeNumerically(">=", after+10))
		stopClient()
		slicesSeen.stop()

		By("the lane's one EndpointSlice, updated from the old Mac to the new in one write")
		states, ended := slicesSeen.seen()
		GinkgoWriter.Printf("the lane's EndpointSlice, state by state: %v\n", states)
		Expect(ended).To(BeFalse(), "the watch ended early, after %v", states)
		Expect(states[0].ready).To(Equal([]string{oldAddr}), "before the rollout: %v", states)
		for i, st := range states[1:] {
			Expect(st.event).To(Equal(watch.Modified), "event %d: no EndpointSlice is created or deleted, only the lane's one updated; all: %v", i+1, states)
			Expect(st.uid).To(Equal(states[0].uid), "event %d: another slice; all: %v", i+1, states)
		}
		switched := slices.IndexFunc(states, func(st sliceState) bool { return !slices.Equal(st.ready, []string{oldAddr}) })
		Expect(switched).To(BeNumerically(">", 0), "the switch: %v", states)
		for i, st := range states[switched:] {
			Expect(st.ready).To(Equal([]string{newAddr}),
				"state %d from the switch on: the ready endpoints go from the old Mac's to the new one's in one update, never both nor none; all: %v", i, states)
		}

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
