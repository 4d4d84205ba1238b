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
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

// fleetOf registers n heartbeating nodes, each with a placement, seen by the controller.
func fleetOf(n int) ([]*v1.MacNode, []*v1.LanePlacement) {
	GinkgoHelper()
	var nodes []*v1.MacNode
	var ps []*v1.LanePlacement
	for range n {
		node := heartbeatingNode()
		nodes = append(nodes, node)
		ps = append(ps, placementOn(node))
	}
	return nodes, ps
}

// lose lets the lost nodes' Leases go stale while the others renew, past the grace period and
// the eviction timeout, and then reconciles every node.
func lose(nodes []*v1.MacNode, lost map[int]bool) {
	GinkgoHelper()
	for range 7 { // 7 minutes in 1-minute steps: the healthy keep renewing throughout
		clk.Step(time.Minute)
		for i, n := range nodes {
			if !lost[i] {
				renew(n)
			}
		}
	}
	for _, n := range nodes {
		reconcileNode(n)
	}
}

// loseChecked lets the first node's Lease go stale while the others renew, past the grace
// period and the eviction timeout, and reconciles it, its error matched by failed.
func loseChecked(nodes []*v1.MacNode, failed OmegaMatcher) {
	GinkgoHelper()
	for range 7 {
		clk.Step(time.Minute)
		for _, n := range nodes[1:] {
			renew(n)
		}
	}
	_, err := controller.Reconcile(ctx, requestFor(nodes[0]))
	Expect(err).To(failed)
}

// nextPass reconciles the first node again, past the brake's next token and the grace that
// follows an API failure, the others renewing.
func nextPass(nodes []*v1.MacNode) {
	GinkgoHelper()
	clk.Step(time.Minute)
	for _, n := range nodes[1:] {
		renew(n)
	}
	reconcileNode(nodes[0])
}

func exists(p *v1.LanePlacement) bool {
	GinkgoHelper()
	err := kube.Get(ctx, client.ObjectKeyFromObject(p), &v1.LanePlacement{})
	if apierrors.IsNotFound(err) {
		return false
	}
	Expect(err).NotTo(HaveOccurred())
	return true
}

func condition(n *v1.MacNode, typ string) *metav1.Condition {
	GinkgoHelper()
	got := &v1.MacNode{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(n), got)).To(Succeed())
	return meta.FindStatusCondition(got.Status.Conditions, typ)
}

var _ = Describe("Eviction", func() {
	Context("when 60% of the Macs' Leases go stale at once (a partition)", func() {
		It("should evict nothing, say why on each held node and in one event, and resume nothing once they are back", func() {
			nodes, ps := fleetOf(5)
			lose(nodes, map[int]bool{0: true, 1: true, 2: true})
			for i := range nodes {
				Expect(exists(ps[i])).To(BeTrue(), "placement on %s evicted during a partition", nodes[i].Name)
			}
			for i := range 3 {
				c := condition(nodes[i], v1.NodeConditionEvictionHeld)
				Expect(c).NotTo(BeNil())
				Expect(c.Status).To(Equal(metav1.ConditionTrue))
				Expect(c.Reason).To(Equal(v1.NodeReasonFleetPartitioned))
				Expect(c.Message).To(ContainSubstring("3 of 5 MacNodes (60%) are unreachable"))
				Expect(ready(nodeNamed(nodes[i]))).To(Equal(metav1.ConditionUnknown), "a held node is still Unknown")
			}
			held := 0
			for len(recorder.Events) > 0 {
				if e := <-recorder.Events; containsAll(e, v1.NodeReasonFleetPartitioned) {
					held++
				}
			}
			Expect(held).To(Equal(1), "one event for the partition, not one per node and reconcile")
			Expect(testutil.ToFloat64(metrics.EvictionsHeld)).To(Equal(1.0))
			Expect(testutil.ToFloat64(metrics.UnreachableNodes)).To(Equal(3.0))

			// Still held a while later.
			clk.Step(10 * time.Minute)
			for i := range nodes[3:] {
				renew(nodes[3+i])
			}
			for _, n := range nodes {
				reconcileNode(n)
			}
			for i := range nodes {
				Expect(exists(ps[i])).To(BeTrue())
			}

			// The partition heals: the held nodes renew, their hold is lifted, nothing was lost.
			for _, n := range nodes {
				renew(n)
			}
			for _, n := range nodes {
				reconcileNode(n)
			}
			for i := range 3 {
				c := condition(nodes[i], v1.NodeConditionEvictionHeld)
				Expect(c.Status).To(Equal(metav1.ConditionFalse))
				Expect(c.Reason).To(Equal(v1.NodeReasonEvictionResumed))
				Expect(exists(ps[i])).To(BeTrue())
			}
			Expect(testutil.ToFloat64(metrics.EvictionsHeld)).To(BeZero(), "the hold ends with the partition")
			Expect(testutil.ToFloat64(metrics.UnreachableNodes)).To(BeZero())
		})
	})

	Context("when one Mac of five goes stale", func() {
		It("should evict it", func() {
			nodes, ps := fleetOf(5)
			lose(nodes, map[int]bool{0: true})
			Expect(exists(ps[0])).To(BeFalse(), "the one lost node's placement is still there")
			for i := 1; i < 5; i++ {
				Expect(exists(ps[i])).To(BeTrue())
			}
			Expect(condition(nodes[0], v1.NodeConditionEvictionHeld)).To(BeNil())
		})
	})

	Context("when every Mac goes stale", func() {
		It("should evict nothing, even in a fleet of two", func() {
			nodes, ps := fleetOf(2)
			lose(nodes, map[int]bool{0: true, 1: true})
			Expect(exists(ps[0])).To(BeTrue())
			Expect(exists(ps[1])).To(BeTrue())
		})
	})

	Context("when a partition heals only in part", func() {
		It("should resume evicting the Macs that stay lost once few enough are", func() {
			nodes, ps := fleetOf(5)
			lose(nodes, map[int]bool{0: true, 1: true, 2: true})
			Expect(exists(ps[0])).To(BeTrue())
			renew(nodes[1])
			renew(nodes[2])
			for _, n := range nodes {
				reconcileNode(n)
			}
			Expect(exists(ps[0])).To(BeFalse(), "a Mac still lost after the partition healed is evicted")
			Expect(exists(ps[1])).To(BeTrue())
			Expect(exists(ps[2])).To(BeTrue())
		})
	})

	Context("when the fleet heals while a lost Mac's judgement of it, from an older list, is under way", func() {
		It("should keep the newer verdict: evictions resume, and the held gauge stays off", func() {
			var armed atomic.Bool
			paused, resume := make(chan struct{}), make(chan struct{})
			controller = lifecycle.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					err := c.List(ctx, list, opts...)
					if _, ok := list.(*coordinationv1.LeaseList); ok && armed.CompareAndSwap(true, false) {
						close(paused) // the fleet's Leases read, still stale: the judgement holds a partition
						select {
						case <-resume:
						case <-time.After(time.Minute):
						}
					}
					return err
				},
			}), recorder)
			nodes, ps := fleetOf(10)
			lost := map[int]bool{}
			for i := range 8 {
				lost[i] = true
			}
			lose(nodes, lost)
			Expect(testutil.ToFloat64(metrics.EvictionsHeld)).To(Equal(1.0))
			Expect(exists(ps[7])).To(BeTrue())

			armed.Store(true)
			older := make(chan error, 1)
			go func() {
				_, err := controller.Reconcile(ctx, requestFor(nodes[7]))
				older <- err
			}()
			<-paused
			for _, n := range nodes[:6] {
				renew(n)
			}
			reconcileNode(nodes[0]) // seen alive: the fleet is judged again, 2 of 10 unreachable
			Expect(testutil.ToFloat64(metrics.EvictionsHeld)).To(Equal(0.0))
			close(resume)
			Expect(<-older).NotTo(HaveOccurred())
			Expect(testutil.ToFloat64(metrics.EvictionsHeld)).To(Equal(0.0), "an older judgement's hold landed after the newer one's heal")
			partitions := 0
			for len(recorder.Events) > 0 {
				if containsAll(<-recorder.Events, v1.NodeReasonFleetPartitioned) {
					partitions++
				}
			}
			Expect(partitions).To(Equal(1), "the partition was announced again by an older judgement")
			Expect(exists(ps[7])).To(BeFalse(), "the Mac still lost is evicted once the partition healed")
			c := condition(nodes[7], v1.NodeConditionEvictionHeld)
			Expect(c.Status).To(Equal(metav1.ConditionFalse))
			Expect(c.Message).To(Equal("2 of 10 nodes are unreachable; evictions resume"), "the standing judgement's counts, not the older one's")
		})
	})

	Context("when a lost Mac holds several placements", func() {
		It("should release them at once, up to ReleaseParallelism, and say so for each", func() {
			Expect(lifecycle.ReleaseParallelism).To(BeNumerically(">", 1))
			// Each delete waits until ReleaseParallelism of the node's placements are being
			// released at once; released one after the other, the first would wait for the
			// rest, which never come. The node holds two more than that, released as slots free.
			var inflight, peak atomic.Int32
			together := make(chan struct{})
			var once sync.Once
			evictor := lifecycle.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
					n := inflight.Add(1)
					defer inflight.Add(-1)
					for old := peak.Load(); n > old && !peak.CompareAndSwap(old, n); old = peak.Load() {
					}
					if n == lifecycle.ReleaseParallelism {
						once.Do(func() { close(together) })
					}
					select {
					case <-together:
					case <-time.After(time.Minute):
						return fmt.Errorf("%d of the node's placements released at once after a minute, not %d", inflight.Load(), lifecycle.ReleaseParallelism)
					}
					return c.Delete(ctx, obj, opts...)
				},
			}), recorder)
			controller = evictor // before the fleet, so that it has seen every node renew
			nodes, ps := fleetOf(5)
			for i := range lifecycle.ReleaseParallelism + 1 {
				p := ps[0].DeepCopy()
				p.ObjectMeta = metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", ps[0].Name, i), Namespace: p.Namespace, Labels: p.Labels, Finalizers: p.Finalizers}
				Expect(kube.Create(ctx, p)).To(Succeed())
				ps = append(ps, p)
			}
			lose(nodes, map[int]bool{0: true})
			Expect(exists(ps[0])).To(BeFalse())
			for _, p := range ps[5:] {
				Expect(exists(p)).To(BeFalse(), "placement %s of the lost node is still there", p.Name)
			}
			for _, p := range ps[1:5] {
				Expect(exists(p)).To(BeTrue())
			}
			Expect(peak.Load()).To(BeEquivalentTo(lifecycle.ReleaseParallelism), "never more releases at once than ReleaseParallelism")
			lost := 0
			for len(recorder.Events) > 0 {
				if e := <-recorder.Events; containsAll(e, "NodeLost", "forced away") {
					lost++
				}
			}
			Expect(lost).To(Equal(lifecycle.ReleaseParallelism+2), "one event per placement forced away")
		})
	})

	Context("when a release's delete fails", func() {
		It("should say so, leave the placement as it was, and release it on the next pass", func() {
			var failed atomic.Bool
			controller = lifecycle.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
					if failed.CompareAndSwap(false, true) {
						return fmt.Errorf("the API server went away")
					}
					return c.Delete(ctx, obj, opts...)
				},
			}), recorder)
			nodes, ps := fleetOf(5)
			loseChecked(nodes, MatchError(ContainSubstring("the API server went away")))
			got := &v1.LanePlacement{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(ps[0]), got)).To(Succeed())
			Expect(got.DeletionTimestamp).To(BeNil(), "its delete failed")
			Expect(got.Finalizers).To(ConsistOf(v1.FinalizerRetirement), "its finalizer is removed only after the delete")
			nextPass(nodes)
			Expect(exists(ps[0])).To(BeFalse(), "released on the next pass")
		})
	})

	Context("when a release's finalizer removal fails after its delete", func() {
		It("should leave the placement being deleted, no longer a replica, and release it on the next pass", func() {
			var failed atomic.Bool
			controller = lifecycle.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					if _, ok := obj.(*v1.LanePlacement); ok && failed.CompareAndSwap(false, true) {
						return fmt.Errorf("the API server went away")
					}
					return c.Patch(ctx, obj, patch, opts...)
				},
			}), recorder)
			nodes, ps := fleetOf(5)
			loseChecked(nodes, MatchError(ContainSubstring("the API server went away")))
			got := &v1.LanePlacement{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(ps[0]), got)).To(Succeed())
			Expect(got.DeletionTimestamp).NotTo(BeNil(), "deleted first: the lane re-places it at once")
			Expect(got.Finalizers).To(ConsistOf(v1.FinalizerRetirement))
			nextPass(nodes)
			Expect(exists(ps[0])).To(BeFalse(), "released on the next pass")
		})
	})

	Context("when the placements were written since the copies the release reads", func() {
		It("should release them all in one pass, without a conflict, and remove no other finalizer", func() {
			// The agent's status writer (or this controller's NodeReady mark) writes a placement
			// between the cache's list and its release: an update from the listed copy would be
			// refused as a conflict and the node's eviction retried with backoff.
			controller = lifecycle.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if err := c.List(ctx, list, opts...); err != nil {
						return err
					}
					ps, ok := list.(*v1.LanePlacementList)
					if !ok {
						return nil
					}
					// Once marked on an Unknown node, each is written again after every list.
					for i := range ps.Items {
						if !meta.IsStatusConditionFalse(ps.Items[i].Status.Conditions, v1.PlacementConditionNodeReady) {
							continue
						}
						now := &v1.LanePlacement{}
						Expect(c.Get(ctx, client.ObjectKeyFromObject(&ps.Items[i]), now)).To(Succeed())
						now.Status.Phase = map[bool]v1.PlacementPhase{true: v1.PhaseLoading, false: v1.PhaseReady}[now.Status.Phase == v1.PhaseReady]
						Expect(c.Status().Update(ctx, now)).To(Succeed())
					}
					return nil
				},
			}), recorder)
			nodes, ps := fleetOf(5)
			other := ps[0].DeepCopy()
			other.ObjectMeta = metav1.ObjectMeta{Name: ps[0].Name + "-other", Namespace: ps[0].Namespace, Labels: ps[0].Labels,
				Finalizers: []string{"example.com/audit", v1.FinalizerRetirement}}
			Expect(kube.Create(ctx, other)).To(Succeed())
			lose(nodes, map[int]bool{0: true})
			Expect(exists(ps[0])).To(BeFalse(), "the lost node's placement is still there")
			got := &v1.LanePlacement{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(other), got)).To(Succeed())
			Expect(got.DeletionTimestamp).NotTo(BeNil())
			Expect(got.Finalizers).To(Equal([]string{"example.com/audit"}), "only the retirement finalizer goes")
		})
	})

	Context("when a placement is made again under its name between the list and its release", func() {
		It("should leave the new one alone", func() {
			var swapped atomic.Bool
			var again *v1.LanePlacement
			controller = lifecycle.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				// Just before the release's delete, the placement read is replaced by a new one.
				Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
					if p, ok := obj.(*v1.LanePlacement); ok && swapped.CompareAndSwap(false, true) {
						old := &v1.LanePlacement{}
						Expect(c.Get(ctx, client.ObjectKeyFromObject(p), old)).To(Succeed())
						old.Finalizers = nil
						Expect(c.Update(ctx, old)).To(Succeed())
						Expect(c.Delete(ctx, old)).To(Succeed())
						again = &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: old.Name, Namespace: old.Namespace, Labels: old.Labels,
							Finalizers: []string{v1.FinalizerRetirement}}, Spec: old.Spec}
						Expect(c.Create(ctx, again)).To(Succeed())
					}
					return c.Delete(ctx, obj, opts...)
				},
			}), recorder)
			nodes, _ := fleetOf(5)
			lose(nodes, map[int]bool{0: true})
			Expect(swapped.Load()).To(BeTrue())
			got := &v1.LanePlacement{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(again), got)).To(Succeed())
			Expect(got.UID).To(Equal(again.UID))
			Expect(got.DeletionTimestamp).To(BeNil(), "the placement made again was deleted by a release of the one before")
			Expect(got.Finalizers).To(ConsistOf(v1.FinalizerRetirement))
		})
	})

	DescribeTable("when the cache still lists a placement a pass released",
		func(first func(nodes []*v1.MacNode), again func(n *v1.MacNode) reconcile.Result) {
			// The manager's cache shows a release only when its events arrive; each release's
			// delete brings the node back meanwhile.
			// The list of the first node's placements that its releasing pass read last is the
			// one the cache keeps showing.
			var watched atomic.Value
			var seen, stale atomic.Pointer[v1.LanePlacementList]
			var writes atomic.Int64
			controller = lifecycle.NewController(clk, testenv.Counting(interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					ps, ok := list.(*v1.LanePlacementList)
					if !ok {
						return c.List(ctx, list, opts...)
					}
					if stale.Load() != nil {
						stale.Load().DeepCopyInto(ps)
						return nil
					}
					if err := c.List(ctx, list, opts...); err != nil {
						return err
					}
					if len(ps.Items) > 0 && ps.Items[0].Spec.Node == watched.Load() {
						seen.Store(ps.DeepCopy())
					}
					return nil
				},
			}), nil, &writes), recorder)
			nodes, ps := fleetOf(5)
			watched.Store(nodes[0].Name)
			first(nodes)
			Expect(exists(ps[0])).To(BeFalse())
			Expect(controller.ReleasesRemembered()).To(Equal(1))
			Expect(seen.Load().Items).To(HaveLen(1))

			stale.Store(seen.Load())
			writes.Store(0)
			for range 3 {
				clk.Step(5 * time.Second) // the eviction rate's next token comes every other pass
				for _, n := range nodes[1:] {
					renew(n)
				}
				Expect(again(nodes[0]).RequeueAfter).To(BeZero(), "a node with nothing left to release waits for an eviction token")
			}
			Expect(writes.Load()).To(BeZero(), "released again: writes the API server refuses as not found")

			stale.Store(nil) // the cache catches up
			again(nodes[0])
			Expect(controller.ReleasesRemembered()).To(BeZero(), "what the cache no longer lists is forgotten")
		},
		Entry("of a lost node it evicted, it should neither write nor take an eviction token again",
			func(nodes []*v1.MacNode) { lose(nodes, map[int]bool{0: true}) },
			func(n *v1.MacNode) reconcile.Result { res, _ := reconcileNode(n); return res }),
		Entry("of a MacNode deleted, it should not write again", func(nodes []*v1.MacNode) {
			Expect(kube.Delete(ctx, nodes[0])).To(Succeed())
			reconcileGone(nodes[0])
		}, func(n *v1.MacNode) reconcile.Result {
			res, err := controller.Reconcile(ctx, requestFor(n))
			Expect(err).NotTo(HaveOccurred())
			return res
		}),
	)

	Context("when two of ten Macs are lost at once", func() {
		It("should evict one at a time, at the eviction rate", func() {
			nodes, ps := fleetOf(10)
			lose(nodes, map[int]bool{0: true, 1: true})
			Expect([]bool{exists(ps[0]), exists(ps[1])}).To(ConsistOf(false, true), "one of the two is evicted at once, the other waits its turn")
			waiting := nodes[0]
			if exists(ps[1]) {
				waiting = nodes[1]
			}
			res, _ := reconcileNode(waiting)
			Expect(res.RequeueAfter).To(Equal(10*time.Second), "the default rate is one node every 10 s")
			clk.Step(10 * time.Second)
			reconcileNode(waiting)
			Expect(exists(ps[0])).To(BeFalse())
			Expect(exists(ps[1])).To(BeFalse())
		})
	})
})

var _ = Describe("Release", func() {
	Context("when a MacNode is deleted", func() {
		It("should release its placements, finalizer and all", func() {
			n := heartbeatingNode()
			p := placementOn(n)
			Expect(kube.Delete(ctx, n)).To(Succeed())
			reconcileGone(n)
			Expect(exists(p)).To(BeFalse(), "a deleted node's placement is stuck")
		})

		It("should forget its heartbeat, even when the fleet is judged from a list that still holds it", func() {
			// The manager's cache may list a node for a moment after its deletion was reconciled.
			var stale *v1.MacNode
			controller = lifecycle.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
				List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
					if err := c.List(ctx, list, opts...); err != nil {
						return err
					}
					if nodes, ok := list.(*v1.MacNodeList); ok && stale != nil {
						nodes.Items = append(nodes.Items, *stale)
					}
					return nil
				},
			}), recorder)
			nodes, ps := fleetOf(5)
			Expect(controller.HeartbeatsKept()).To(Equal(5))
			stale = nodeNamed(nodes[4])
			Expect(kube.Delete(ctx, nodes[4])).To(Succeed())
			reconcileGone(nodes[4])
			Expect(controller.HeartbeatsKept()).To(Equal(4))

			lose(nodes[:4], map[int]bool{0: true}) // the lost node's eviction judges the fleet's health
			Expect(exists(ps[0])).To(BeFalse())
			Expect(controller.HeartbeatsKept()).To(Equal(4))
		})
	})

	Context("when a placement is deleted on a node that is Unknown", func() {
		It("should release it at once, without waiting for the eviction timeout or the brake", func() {
			nodes, ps := fleetOf(3)
			Expect(kube.Delete(ctx, ps[0])).To(Succeed()) // its lane (or namespace) was deleted
			Expect(kube.Delete(ctx, ps[1])).To(Succeed())
			clk.Step(41 * time.Second) // every node is lost: the brake holds evictions
			for _, n := range nodes {
				reconcileNode(n)
			}
			Expect(exists(ps[0])).To(BeFalse())
			Expect(exists(ps[1])).To(BeFalse())
			Expect(exists(ps[2])).To(BeTrue(), "a placement not being deleted waits for the eviction")
		})

		It("should leave a deleted placement on a live node to its agent's retirement", func() {
			n := heartbeatingNode()
			p := placementOn(n)
			Expect(kube.Delete(ctx, p)).To(Succeed())
			reconcileNode(n)
			Expect(exists(p)).To(BeTrue())
		})
	})
})

// reconcileGone reconciles a node that no longer exists.
func reconcileGone(n *v1.MacNode) {
	GinkgoHelper()
	_, err := controller.Reconcile(ctx, requestFor(n))
	Expect(err).NotTo(HaveOccurred())
}

func nodeNamed(n *v1.MacNode) *v1.MacNode {
	GinkgoHelper()
	got := &v1.MacNode{}
	Expect(kube.Get(ctx, client.ObjectKeyFromObject(n), got)).To(Succeed())
	return got
}
