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

package placement

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// The event handlers feed the controller's picture of the fleet and enqueue only the lanes an
// event can affect. The manager starts no worker before every handler has seen the informers'
// first lists, so the picture is whole before the first lane is placed.

type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]

func add(q queue, reqs []reconcile.Request) {
	for _, r := range reqs {
		q.Add(r)
	}
}

// Observe records an object as the informer shows it (a MacNode, LanePlacement or
// CertifiedIdentity) and returns the lanes to reconcile for it. The controller's event
// handlers call it; so do tests that drive Reconcile by hand.
func (c *Controller) Observe(o client.Object) []reconcile.Request {
	switch o := o.(type) {
	case *v1.MacNode:
		return c.fleet.observeNode(o)
	case *v1.LanePlacement:
		return c.fleet.observePlacement(o)
	case *v1.CertifiedIdentity:
		return c.fleet.observeIdentity(o)
	}
	return nil
}

// Gone records that an object was deleted and returns the lanes to reconcile for it.
func (c *Controller) Gone(o client.Object) []reconcile.Request {
	switch o.(type) {
	case *v1.MacNode:
		return c.fleet.forgetNode(o.GetName())
	case *v1.LanePlacement:
		return c.fleet.placementGone(o.GetNamespace(), o.GetName())
	case *v1.CertifiedIdentity:
		return c.fleet.identityGone(o.GetName())
	}
	return nil
}

// feed is the event handler of one kind: every event goes through Observe or Gone.
func (c *Controller) feed() handler.TypedEventHandler[client.Object, reconcile.Request] {
	return handler.TypedFuncs[client.Object, reconcile.Request]{
		CreateFunc: func(_ context.Context, e event.TypedCreateEvent[client.Object], q queue) { add(q, c.Observe(e.Object)) },
		UpdateFunc: func(_ context.Context, e event.TypedUpdateEvent[client.Object], q queue) {
			add(q, c.Observe(e.ObjectNew))
		},
		DeleteFunc: func(_ context.Context, e event.TypedDeleteEvent[client.Object], q queue) { add(q, c.Gone(e.Object)) },
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[client.Object], q queue) {
			add(q, c.Observe(e.Object))
		},
	}
}
