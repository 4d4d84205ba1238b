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

package endpoints_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// writeCounter is the manager's client, counting the writes the endpoints controllers make,
// by what they write and the name of the object written.
type writeCounter struct {
	client.Client
	mu     sync.Mutex
	writes []objectWrite
}

type objectWrite struct{ what, name string }

func (c *writeCounter) count(what string, obj client.Object) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writes = append(c.writes, objectWrite{what, obj.GetName()})
}

// of counts the writes of objects for which lane says whose they are (the manager also mends
// what the suite's other specs left).
func (c *writeCounter) of(lane func(object string) bool) map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for _, w := range c.writes {
		if lane(w.name) {
			out[w.what]++
		}
	}
	return out
}

// Create counts the creates the API server made; one it refused (the name held, as by a slice of
// the controller's own that its cache does not show yet) wrote nothing.
func (c *writeCounter) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := c.Client.Create(ctx, obj, opts...)
	if err == nil {
		c.count(fmt.Sprintf("create %T", obj), obj)
	}
	return err
}

func (c *writeCounter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	err := c.Client.Patch(ctx, obj, patch, opts...)
	if err == nil {
		c.count(fmt.Sprintf("patch %T", obj), obj)
	}
	return err
}

func (c *writeCounter) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	err := c.Client.Update(ctx, obj, opts...)
	if err == nil {
		c.count(fmt.Sprintf("update %T", obj), obj)
	}
	return err
}

func (c *writeCounter) Delete(ctx context.Context, obj client.Object, opts ...client.DeleteOption) error {
	err := c.Client.Delete(ctx, obj, opts...)
	if err == nil {
		c.count(fmt.Sprintf("delete %T", obj), obj)
	}
	return err
}

func (c *writeCounter) Status() client.SubResourceWriter { return statusCounter{c.Client.Status(), c} }

type statusCounter struct {
	client.SubResourceWriter
	c *writeCounter
}

func (s statusCounter) Update(ctx context.Context, obj client.Object, opts ...client.SubResourceUpdateOption) error {
	err := s.SubResourceWriter.Update(ctx, obj, opts...)
	if err == nil {
		s.c.count(fmt.Sprintf("status update %T", obj), obj)
	}
	return err
}

func (s statusCounter) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
	o := &client.SubResourcePatchOptions{}
	o.ApplyOptions(opts)
	err := s.SubResourceWriter.Patch(ctx, obj, patch, opts...)
	if err == nil {
		s.c.count(fmt.Sprintf("status %T %s", obj, strings.TrimPrefix(o.FieldManager, "synapse-")), obj)
	}
	return err
}

var _ = Describe("Lanes under the manager", func() {
	It("should each have their Service, EndpointSlice and ServiceReady condition written once, their placements turning Ready meanwhile", func() {
		mctx, cancel := context.WithCancel(ctx)
		stopped := make(chan struct{})
		defer func() {
			cancel()
			<-stopped
		}()
		// As the controller's ServiceAccount, under the shipped RBAC.
		Expect(testEnv.Install(ctx)).To(Succeed())
		asController, err := testEnv.ServiceAccountConfig(ctx, "synapse-system", "synapse-controller")
		Expect(err).NotTo(HaveOccurred())
		mgr, err := ctrl.NewManager(asController, ctrl.Options{Scheme: kube.Scheme(), Cache: controllers.CacheOptions(),
			Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0", Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
		Expect(err).NotTo(HaveOccurred())
		Expect(controllers.IndexFields(mctx, mgr.GetFieldIndexer())).To(Succeed())
		counted := &writeCounter{Client: mgr.GetClient()}
		Expect(endpoints.NewServiceController(clk, counted).Register(mctx, mgr)).To(Succeed())
		Expect(endpoints.NewController(clk, counted, policy).Register(mctx, mgr)).To(Succeed())
		go func() {
			defer GinkgoRecover()
			defer close(stopped)
			Expect(mgr.Start(mctx)).To(Succeed())
		}()

		const lanes = 40
		var all []*v1.CatalogLane
		var ps []*v1.LanePlacement
		for i := range lanes {
			lane := laneOf(1)
			all = append(all, lane)
			ps = append(ps, placement(lane, node(fmt.Sprintf("192.0.2.%d", 100+i), 8080), v1.PhaseLoading))
		}
		// Ready while their lanes' Services are being written, each lane's status written as the
		// placement controller writes it when a replica turns Ready: a write between the
		// endpoints controller's read of a lane and its own write, which its cache shows first.
		for i, p := range ps {
			p.Status.Phase = v1.PhaseReady
			Expect(kube.Status().Update(ctx, p)).To(Succeed())
			_, err := statusapply.ApplyLanePlacementStatus(ctx, kube, client.ObjectKeyFromObject(all[i]), v1.CatalogLaneStatus{Replicas: 1, ReadyReplicas: 1})
			Expect(err).NotTo(HaveOccurred())
		}
		Eventually(func(g Gomega) {
			for i, lane := range all {
				g.Expect(endpointIPs(lane)).To(Equal(map[int32][]string{8080: {fmt.Sprintf("192.0.2.%d", 100+i)}}))
				got := &v1.CatalogLane{}
				g.Expect(kube.Get(ctx, client.ObjectKeyFromObject(lane), got)).To(Succeed())
				g.Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.LaneConditionServiceReady)).To(BeTrue())
			}
		}).WithTimeout(time.Minute).Should(Succeed())

		ours := map[string]bool{}
		for _, lane := range all {
			ours[lane.Name], ours[lane.Name+"-8080"] = true, true
		}
		Expect(counted.of(func(name string) bool { return ours[name] })).To(Equal(map[string]int{
			fmt.Sprintf("create %T", &corev1.Service{}):                  lanes,
			fmt.Sprintf("create %T", &discoveryv1.EndpointSlice{}):       lanes,
			fmt.Sprintf("status %T lane-endpoints-ServiceReady", all[0]): lanes,
		}))
	})
})
