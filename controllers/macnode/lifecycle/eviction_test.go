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

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
	"github.com/ck-synapse/synapse-fleet/controllers/metrics"
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

	Context("when a release's delete fails after its finalizer was removed", func() {
		It("should say so, and release the placement on the next pass", func() {
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
			for range 7 { // as lose, but the lost node's pass is checked for its error
				clk.Step(time.Minute)
				for _, n := range nodes[1:] {
					renew(n)
				}
			}
			_, err := controller.Reconcile(ctx, requestFor(nodes[0]))
			Expect(err).To(MatchError(ContainSubstring("the API server went away")))
			Expect(exists(ps[0])).To(BeTrue(), "its delete failed")
			clk.Step(time.Minute) // past the brake's next token and the API failure's grace
			for _, n := range nodes[1:] {
				renew(n)
			}
			reconcileNode(nodes[0])
			Expect(exists(ps[0])).To(BeFalse(), "released on the next pass, its finalizer already gone")
		})
	})

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
