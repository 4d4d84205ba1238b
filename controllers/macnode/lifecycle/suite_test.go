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
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx        = context.Background()
	kube       client.Client
	env        *testenv.Env
	clk        *clocktesting.FakeClock
	recorder   *events.FakeRecorder
	controller *lifecycle.Controller
	_          = testenv.Suite(func(e *testenv.Env) {
		env, kube = e, e.Client
		Expect(kube.Create(ctx, &corev1.Namespace{ObjectMeta: objectMeta(lifecycle.LeaseNamespace)})).To(Succeed())
	})
)

func TestLifecycle(t *testing.T) { testenv.RunSpecs(t, "MacNode lifecycle") }

var _ = BeforeEach(func() {
	// The API server stamps creation times from the real clock; the fake one starts there.
	// Lease times keep microseconds only; a whole second keeps the arithmetic exact.
	clk = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	recorder = events.NewFakeRecorder(100)
	controller = lifecycle.NewController(clk, kube, recorder)
})

// Every spec starts from an empty fleet: the brake counts every MacNode there is.
var _ = AfterEach(func() {
	var ps v1.LanePlacementList
	Expect(kube.List(ctx, &ps)).To(Succeed())
	for i := range ps.Items {
		p := &ps.Items[i]
		p.Finalizers = nil
		Expect(client.IgnoreNotFound(kube.Update(ctx, p))).To(Succeed())
		Expect(client.IgnoreNotFound(kube.Delete(ctx, p))).To(Succeed())
	}
	Expect(kube.DeleteAllOf(ctx, &v1.MacNode{})).To(Succeed())
	Expect(kube.DeleteAllOf(ctx, &coordinationv1.Lease{}, client.InNamespace(lifecycle.LeaseNamespace))).To(Succeed())
})
