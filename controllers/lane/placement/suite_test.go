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

package placement_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/placement"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx        = context.Background()
	kube       client.Client
	clk        *clocktesting.FakeClock
	recorder   *events.FakeRecorder
	controller *placement.Controller
	// writes counts the controller's writes, so a resync with nothing to change can be seen
	// to write nothing.
	writes atomic.Int64
	env    = testenv.Suite(func(e *testenv.Env) { kube = testenv.Counting(e.Client, nil, &writes) })
)

func TestPlacement(t *testing.T) { testenv.RunSpecs(t, "Lane placement") }

var _ = BeforeEach(func() {
	clk = clocktesting.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	recorder = events.NewFakeRecorder(100)
	staleLane = nil
	lostAnswers.Store(0)
	controller = placement.NewController(clk, interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			if l, ok := obj.(*v1.CatalogLane); ok && staleLane != nil {
				staleLane(l)
			}
			return nil
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			err := c.SubResource(sub).Patch(ctx, obj, patch, opts...)
			if _, ok := obj.(*v1.CatalogLane); ok && err == nil && lostAnswers.Load() > 0 {
				lostAnswers.Add(-1)
				return errors.New("the API server's answer was lost (the write landed)")
			}
			return err
		},
	}), recorder)
})

// lostAnswers is how many of the controller's next writes of a lane's status land but answer an
// error, as a timeout after the API server took the write does.
var lostAnswers atomic.Int64

// staleLane, when set, changes every lane the controller reads, as a cache a moment behind
// the API server would show it.
var staleLane func(*v1.CatalogLane)
