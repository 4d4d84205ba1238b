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
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
)

// releasesTogether is the manager's client, whose placement deletes each wait until the
// placements of want different nodes are being deleted at once (or a minute, then fail).
type releasesTogether struct {
	client.Client
	want     int
	mu       sync.Mutex
	nodes    map[string]bool
	together chan struct{}
}

func (c *releasesTogether) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	if p, ok := obj.(*v1.LanePlacement); ok {
		c.mu.Lock()
		if !c.nodes[p.Spec.Node] {
			c.nodes[p.Spec.Node] = true
			if len(c.nodes) == c.want {
				close(c.together)
			}
		}
		c.mu.Unlock()
		select {
		case <-c.together:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
			return fmt.Errorf("placement %s/%s: the other lost nodes' releases did not begin within a minute", p.Namespace, p.Name)
		}
	}
	return c.Client.Delete(ctx, obj, opts...)
}

var _ = Describe("Lost Macs, under the manager", func() {
	It("should be evicted side by side, none waiting for another's release", func() {
		// Each placement's delete waits until both lost nodes' releases have begun: evicted one
		// node after the other, the first release would wait for the second, which never
		// comes before the first gives up.
		mctx, cancel := context.WithCancel(ctx)
		stopped := make(chan struct{})
		defer func() {
			cancel()
			<-stopped
		}()
		mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: kube.Scheme(), Metrics: metricsserver.Options{BindAddress: "0"},
			HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
		Expect(err).NotTo(HaveOccurred())
		Expect(controllers.IndexFields(mctx, mgr.GetFieldIndexer())).To(Succeed())
		kube2 := &releasesTogether{Client: mgr.GetClient(), want: 2, nodes: map[string]bool{}, together: make(chan struct{})}
		c := lifecycle.NewController(clock.RealClock{}, kube2, recorder).WithTimeouts(3*time.Second, time.Second).WithEvictionRate(50)
		Expect(c.Register(mctx, mgr)).To(Succeed())

		// Six Macs on the real clock: four renew every 200 ms (well within the 3 s grace period on
		// a busy machine), two are lost from the start.
		var nodes []*v1.MacNode
		var lost []*v1.LanePlacement
		for i := range 6 {
			n := leasedNode(time.Now())
			nodes = append(nodes, n)
			if i < 2 {
				lost = append(lost, placementOn(n))
			}
		}
		go func() {
			defer GinkgoRecover()
			defer close(stopped)
			Expect(mgr.Start(mctx)).To(Succeed())
		}()
		go func() {
			for {
				select {
				case <-mctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
				for _, n := range nodes[2:] {
					lease := &coordinationv1.Lease{}
					if kube.Get(mctx, client.ObjectKey{Namespace: lifecycle.LeaseNamespace, Name: n.Name}, lease) == nil {
						lease.Spec.RenewTime = ptr.To(metav1.NewMicroTime(time.Now()))
						_ = kube.Update(mctx, lease)
					}
				}
			}
		}()
		Eventually(func() bool { return !exists(lost[0]) && !exists(lost[1]) }).WithTimeout(30*time.Second).WithPolling(200*time.Millisecond).Should(BeTrue(),
			"both lost Macs' placements released")
		for _, n := range nodes[2:] {
			Expect(condition(n, v1.ConditionReady).Status).To(Equal(metav1.ConditionTrue), "a renewing Mac stays Ready")
		}
	})
})
