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

// Package enqueue holds the event mappings the reconcilers share.
package enqueue

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// All maps any event to a request for every object that newList lists: cluster-wide, or in
// the event's namespace when sameNamespace is set. For objects whose placement or status
// depends on every node, identity or policy, where the set is small.
func All(kube client.Client, newList func() client.ObjectList, sameNamespace bool) handler.EventHandler {
	return handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
		list := newList()
		var opts []client.ListOption
		if sameNamespace {
			opts = append(opts, client.InNamespace(o.GetNamespace()))
		}
		if err := kube.List(ctx, list, opts...); err != nil {
			return nil
		}
		var out []reconcile.Request
		_ = meta.EachListItem(list, func(item runtime.Object) error {
			if obj, ok := item.(client.Object); ok {
				out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(obj)})
			}
			return nil
		})
		return out
	})
}
