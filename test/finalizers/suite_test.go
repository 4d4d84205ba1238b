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

// Package finalizers checks that no finalizer blocks a deletion forever: a deleted MacNode's
// placements, a deleted namespace with lanes, and the documented uninstall path (docs/installing.md). The controllers
// run in a manager as the controller's ServiceAccount under the shipped RBAC; each Mac is a
// small stand-in for the agent's cluster side (heartbeat, and retirement: the finalizer of a
// deleted placement removed) acting as its own joined identity. envtest runs neither the
// garbage collector nor the namespace controller: where that path relies on them, the
// tests do what they do, and say so.
package finalizers

import (
	"context"
	"net/netip"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/ck-synapse/synapse-fleet/controllers"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx         = context.Background()
	env         *testenv.Env
	admin       client.Client
	stopManager context.CancelFunc
	managerDone chan struct{}
)

func TestFinalizers(t *testing.T) { testenv.RunSpecs(t, "Finalizers") }

var _ = BeforeSuite(func() {
	var err error
	env, err = testenv.Start()
	Expect(err).NotTo(HaveOccurred())
	admin = env.Client
	Expect(env.Install(ctx)).To(Succeed())
	asController, err := env.ServiceAccountConfig(ctx, "synapse-system", "synapse-controller")
	Expect(err).NotTo(HaveOccurred())
	mgr, err := ctrl.NewManager(asController, ctrl.Options{Scheme: env.Scheme, Cache: controllers.CacheOptions(),
		Metrics: metricsserver.Options{BindAddress: "0"}})
	Expect(err).NotTo(HaveOccurred())
	// A lost Mac is Unknown after 2 s; its placements would be evicted only after an hour, so
	// whatever goes sooner was released, not evicted.
	opts := controllers.Options{NodeGracePeriod: 2 * time.Second, NodeEvictionTimeout: time.Hour,
		Addresses: endpoints.AddressPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}}
	var runCtx context.Context
	runCtx, stopManager = context.WithCancel(ctx)
	Expect(controllers.IndexFields(runCtx, mgr.GetFieldIndexer())).To(Succeed())
	for _, c := range controllers.NewControllers(clock.RealClock{}, mgr.GetClient(), mgr.GetEventRecorder("synapse-controller"), opts) {
		Expect(c.Register(runCtx, mgr)).To(Succeed())
	}
	managerDone = make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(managerDone)
		Expect(mgr.Start(runCtx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	stopMacs()
	if stopManager != nil {
		stopManager()
		<-managerDone
	}
	Expect(env.Stop()).To(Succeed())
})
