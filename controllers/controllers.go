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

package controllers

import (
	"context"
	"time"

	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/controllers/identity"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/index"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
	"github.com/ck-synapse/synapse-fleet/controllers/prewarm"
)

// Controller is one reconciler of synapse-controller.
type Controller interface {
	Name() string
	Register(ctx context.Context, mgr ctrl.Manager) error
}

// Options tunes the controllers; zero values take the defaults.
type Options struct {
	// NodeGracePeriod is how old a node's Lease may get before the node is Unknown;
	// NodeEvictionTimeout how long it may then stay Unknown before its placements go.
	NodeGracePeriod, NodeEvictionTimeout time.Duration
	// NodeEvictionRate is how many lost nodes a second may be evicted; UnhealthyThreshold the
	// share of unreachable nodes from which evictions stop.
	NodeEvictionRate, UnhealthyThreshold float64
	// Addresses says which node addresses the lanes' EndpointSlices may list, and so which
	// ones an agent's serving certificate may name.
	Addresses endpoints.AddressPolicy
	// Namespace is the controller's own, where the fleet CA's Secret is kept; Reader reads it
	// past the cache. Without a Namespace no agent serving certificate is issued.
	Namespace string
	Reader    client.Reader
}

// IndexFields adds the cache's field indexes the controllers list by (see internal/index); call
// it once per manager, before any controller is registered.
func IndexFields(ctx context.Context, indexer client.FieldIndexer) error {
	return index.Register(ctx, indexer)
}

// NewControllers lists every controller, with every dependency given here.
func NewControllers(clk clock.Clock, kube client.Client, recorder events.EventRecorder, opts Options) []Controller {
	cs := []Controller{
		placement.NewController(clk, kube, recorder),
		endpoints.NewServiceController(clk, kube),
		endpoints.NewController(clk, kube, opts.Addresses),
		endpoints.NewAddressController(clk, kube, opts.Addresses),
		identity.NewController(clk, kube, recorder),
		prewarm.NewController(clk, kube),
		lifecycle.NewController(clk, kube, recorder).WithTimeouts(opts.NodeGracePeriod, opts.NodeEvictionTimeout).
			WithEvictionRate(opts.NodeEvictionRate).WithUnhealthyThreshold(opts.UnhealthyThreshold),
	}
	if opts.Namespace != "" {
		cs = append(cs, agentcert.NewController(clk, kube, opts.Reader, opts.Namespace, opts.Addresses))
	}
	return cs
}
