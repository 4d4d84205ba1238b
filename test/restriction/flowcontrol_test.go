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

package restriction

import (
	"net/http"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
)

// flowSchemaOf records the FlowSchema the API server classified each response's request by
// (API Priority and Fairness names it in the X-Kubernetes-PF-FlowSchema-UID header).
type flowSchemaOf struct {
	mu   sync.Mutex
	last string
	next http.RoundTripper
}

func (f *flowSchemaOf) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := f.next.RoundTrip(r)
	if err == nil {
		f.mu.Lock()
		f.last = resp.Header.Get("X-Kubernetes-PF-FlowSchema-UID")
		f.mu.Unlock()
	}
	return resp, err
}

func (f *flowSchemaOf) get() string { f.mu.Lock(); defer f.mu.Unlock(); return f.last }

// classified is a client as cfg's user whose last request's FlowSchema UID the returned
// recorder holds.
func classified(cfg *rest.Config) (client.Client, *flowSchemaOf) {
	GinkgoHelper()
	rec := &flowSchemaOf{}
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { rec.next = rt; return rec })
	c, err := client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())
	return c, rec
}

func flowSchemaUID(name string) string {
	GinkgoHelper()
	fs := &flowcontrolv1.FlowSchema{}
	Expect(admin.Get(ctx, client.ObjectKey{Name: name}, fs)).To(Succeed())
	return string(fs.UID)
}

var _ = Describe("API priority and fairness", func() {
	It("should classify the controller's requests by its own FlowSchema, at workload-high", func() {
		cfg, err := env.ServiceAccountConfig(ctx, "synapse-system", "synapse-controller")
		Expect(err).NotTo(HaveOccurred())
		c, rec := classified(cfg)
		want := flowSchemaUID("synapse-controller")
		// The API server loads FlowSchemas from its own informer: a moment after they are made.
		Eventually(func(g Gomega) {
			var lanes v1.CatalogLaneList
			g.Expect(c.List(ctx, &lanes)).To(Succeed())
			g.Expect(rec.get()).To(Equal(want))
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		fs := &flowcontrolv1.FlowSchema{}
		Expect(admin.Get(ctx, client.ObjectKey{Name: "synapse-controller"}, fs)).To(Succeed())
		Expect(fs.Spec.PriorityLevelConfiguration.Name).To(Equal("workload-high"))
	})

	It("should classify a Mac's Lease renewal as a heartbeat, at its own priority level, and its status writes not", func() {
		w := newWorld(false)
		joined, err := env.ServiceAccountConfig(ctx, "synapse-nodes", nodeidentity.ServiceAccountName(w.self))
		Expect(err).NotTo(HaveOccurred())
		c, rec := classified(joined)
		lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: w.self, Namespace: "synapse-node-lease"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(w.self), RenewTime: ptr.To(metav1.NowMicro())}}
		Expect(c.Create(ctx, lease)).To(Succeed())
		want := flowSchemaUID("synapse-node-leases")
		Eventually(func(g Gomega) {
			lease.Spec.RenewTime = ptr.To(metav1.NowMicro())
			g.Expect(c.Update(ctx, lease)).To(Succeed())
			g.Expect(rec.get()).To(Equal(want))
		}).WithTimeout(30 * time.Second).WithPolling(200 * time.Millisecond).Should(Succeed())
		fs := &flowcontrolv1.FlowSchema{}
		Expect(admin.Get(ctx, client.ObjectKey{Name: "synapse-node-leases"}, fs)).To(Succeed())
		Expect(fs.Spec.PriorityLevelConfiguration.Name).To(Equal("synapse-node-heartbeats"))

		Expect(statusapply.ApplyAgentStatus(ctx, c, w.self, agentStatus())).To(Succeed())
		Expect(rec.get()).NotTo(BeEmpty())
		Expect(rec.get()).NotTo(Equal(want), "only the Lease is a heartbeat")
	})
})
