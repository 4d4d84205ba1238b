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
	"net/netip"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx  = context.Background()
	kube client.Client
	clk  = clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	// policy allows the documentation ranges the tests' Macs use; envtest's service range is
	// 10.0.0.0/24.
	policy = endpoints.AddressPolicy{Allowed: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("10.0.0.0/8")},
		Denied: []netip.Prefix{netip.MustParsePrefix("192.0.2.240/28")}}
	testEnv *testenv.Env
	_       = testenv.Suite(func(e *testenv.Env) { testEnv, kube = e, e.Client })
)

func newController() *endpoints.Controller { return endpoints.NewController(clk, kube, policy) }

// reconcileLane reconciles the lane through c as the manager would: its Service, then its
// EndpointSlices and condition.
func reconcileLane(c client.Client, lane *v1.CatalogLane) (reconcile.Result, error) {
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(lane)}
	if _, err := endpoints.NewServiceController(clk, c).Reconcile(ctx, req); err != nil {
		return reconcile.Result{}, err
	}
	return endpoints.NewController(clk, c, policy).Reconcile(ctx, req)
}

func TestEndpoints(t *testing.T) { testenv.RunSpecs(t, "Lane endpoints") }
