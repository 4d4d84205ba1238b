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

package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=macnodes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update,namespace=synapse-node-lease

// register creates the node's MacNode if it does not exist; a node that comes back keeps its
// object (and its placements).
func (a *Agent) register(ctx context.Context, reader client.Reader, port int) error {
	a.cfg.Platform.NeuralEngineCores = max(a.cfg.Platform.NeuralEngineCores, 0)
	a.mu.Lock()
	a.port = int32(port)
	a.mu.Unlock()
	node := &v1.MacNode{}
	err := reader.Get(ctx, client.ObjectKey{Name: a.cfg.NodeName}, node)
	switch {
	case apierrors.IsNotFound(err):
		node = &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName, Labels: a.cfg.Labels}}
		if err := a.kube.Create(ctx, node); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("registering MacNode %s: %w", a.cfg.NodeName, err)
		}
		a.cfg.Log.Info("registered the MacNode", "node", a.cfg.NodeName)
	case err != nil:
		return fmt.Errorf("reading MacNode %s: %w", a.cfg.NodeName, err)
	default:
		a.cfg.Log.Info("the MacNode exists; re-adopting its placements", "node", a.cfg.NodeName)
	}
	a.mu.Lock()
	a.node = node
	a.mu.Unlock()
	return nil
}

// ownNode is the node as this agent reports it: what matters for identity matching comes from
// the agent itself, not from a status someone else may have written.
func (a *Agent) ownNode() *v1.MacNode {
	return &v1.MacNode{Status: v1.MacNodeStatus{Platform: a.cfg.Platform, Worker: a.cfg.Worker}}
}

// isPaused reports whether the node is paused, by its spec or by the admin API.
func (a *Agent) isPaused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pausedLocked()
}

func (a *Agent) pausedLocked() bool {
	return a.paused || (a.node != nil && a.node.Spec.Paused)
}

// Lease renewal's bounds, after the kubelet's lease controller
// (kubernetes/component-helpers apimachinery/lease/controller.go: renewals every interval
// jittered by 4%, at most 5 update attempts of one renewal; kubernetes/kubernetes
// cmd/kubelet/app/server.go: each heartbeat call times out within the renew interval). The
// kubelet retries its updates back to back and backs off (doubling up to 7 s) only between
// the reads that make sure its Lease exists; the agent spaces every attempt by that backoff,
// so that a fleet whose API server is slow does not retry in a burst.
const (
	// renewPeriodJitter spreads a fleet's renewals so that Macs started together do not renew
	// together.
	renewPeriodJitter = 0.04
	// renewAttempts bounds the calls of one renewal; then it waits for the next period.
	renewAttempts = 5
	// renewRetryBase is the first wait between attempts; each next one doubles, up to
	// renewRetryCap, each jittered by up to renewRetryJitter of itself.
	renewRetryBase   = 200 * time.Millisecond
	renewRetryCap    = 7 * time.Second
	renewRetryJitter = 0.2
)

// ErrLeaseRenewTimeout is a renewal call that did not answer within its timeout.
var ErrLeaseRenewTimeout = errors.New("the Lease renewal call timed out")

// heartbeat renews the node's Lease every third of its duration, as a kubelet does. The
// Lease alone says the node is alive: the lifecycle controller turns the node's Ready
// condition from it; the agent's status writes do not.
func (a *Agent) heartbeat(ctx context.Context) error {
	every := a.cfg.LeaseDuration / 3
	failing := false
	for {
		err := a.renewWithRetries(ctx, every)
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			// Said once per outage, not on every attempt.
			a.cfg.Log.Error(err, "cannot renew the node Lease; serving continues and renewal is retried")
			failing = true
		case err == nil && failing:
			a.cfg.Log.Info("the node Lease is renewed again")
			failing = false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-a.cfg.Clock.After(wait.Jitter(every, renewPeriodJitter)):
		}
	}
}

// renewBackoff spaces the attempts of one renewal; never longer than the renew interval.
func renewBackoff(every time.Duration) wait.Backoff {
	return wait.Backoff{Duration: renewRetryBase, Factor: 2, Jitter: renewRetryJitter, Steps: renewAttempts, Cap: min(renewRetryCap, every)}
}

// renewWithRetries makes one renewal: at most renewAttempts calls, each timed out within half
// the renew interval (so that one stuck call leaves time for another before the Lease
// expires), spaced by renewBackoff. It returns the last call's error.
func (a *Agent) renewWithRetries(ctx context.Context, every time.Duration) error {
	backoff := renewBackoff(every)
	for attempt := 1; ; attempt++ {
		err := a.renewWithin(ctx, every/2)
		if err == nil || ctx.Err() != nil || attempt == renewAttempts {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.cfg.Clock.After(backoff.Step()):
		}
	}
}

// renewWithin is one renewal call, cancelled after timeout by the agent's clock (a context
// deadline would run on the wall clock, which no test can step).
func (a *Agent) renewWithin(ctx context.Context, timeout time.Duration) error {
	callCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := a.cfg.Clock.NewTimer(timeout)
	defer timer.Stop()
	go func() {
		select {
		case <-timer.C():
			cancel(ErrLeaseRenewTimeout)
		case <-callCtx.Done():
		}
	}()
	err := a.renew(callCtx)
	if err != nil && errors.Is(context.Cause(callCtx), ErrLeaseRenewTimeout) {
		return fmt.Errorf("after %s: %w", timeout, ErrLeaseRenewTimeout)
	}
	return err
}

// renew renews the node's Lease. As the kubelet does, it updates the Lease it last wrote and
// reads it from the API server only when it has none: the first renewal, or after the API
// server said the copy is stale (a conflict) or gone (not found). Any other failure (a call
// timed out, throttled, refused) says nothing about the copy: any change to the stored Lease
// answers an update of it with a conflict, so the next attempt updates it again. Within a
// renewal the kubelet's lease controller re-reads only on a conflict too
// (kubernetes/component-helpers apimachinery/lease/controller.go, retryUpdateLease); unlike
// it, the agent does not also read after a period whose updates all failed, for the same
// reason. One request per renewal instead of two is most of what a fleet asks of the API
// server at rest; and reading again after every timeout doubled the load exactly when the API
// server was slowest: at a thousand Macs, a rollout whose renewals timed out 2,808 times made
// 14,092 Lease GETs. Only the heartbeat calls it.
func (a *Agent) renew(ctx context.Context) error {
	now := metav1.NewMicroTime(a.cfg.Clock.Now())
	lease := a.lease
	if lease == nil {
		lease = &coordinationv1.Lease{}
		err := a.kube.Get(ctx, client.ObjectKey{Namespace: LeaseNamespace, Name: a.cfg.NodeName}, lease)
		if apierrors.IsNotFound(err) {
			lease = &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Namespace: LeaseNamespace, Name: a.cfg.NodeName},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(a.cfg.NodeName),
					LeaseDurationSeconds: ptr.To(int32(a.cfg.LeaseDuration / time.Second)), RenewTime: &now},
			}
			if err := a.kube.Create(ctx, lease); err != nil {
				return err
			}
			a.lease = lease
			return nil
		}
		if err != nil {
			return err
		}
	}
	lease = lease.DeepCopy()
	lease.Spec.HolderIdentity = ptr.To(a.cfg.NodeName)
	lease.Spec.LeaseDurationSeconds = ptr.To(int32(a.cfg.LeaseDuration / time.Second))
	lease.Spec.RenewTime = &now
	if err := a.kube.Update(ctx, lease); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			a.lease = nil
		}
		return err
	}
	a.lease = lease
	return nil
}

// Pause implements httpapi.Admin: every lane is unloaded before it returns; the placements
// stay, phase Paused.
func (a *Agent) Pause(ctx context.Context) error {
	a.mu.Lock()
	a.paused = true
	var keys []*lane
	for _, l := range a.lanes {
		keys = append(keys, l)
	}
	a.mu.Unlock()
	for _, l := range keys {
		a.unload(ctx, l.placement, false)
		a.setState(l, lanePaused, nil)
	}
	a.cfg.Log.Info("paused by the admin API; every lane is unloaded")
	a.reconcileAll()
	return ctx.Err()
}

// Resume implements httpapi.Admin: the lanes load again (unless the node's spec pauses it).
func (a *Agent) Resume(ctx context.Context) error {
	a.mu.Lock()
	a.paused = false
	a.mu.Unlock()
	a.cfg.Log.Info("resumed by the admin API")
	a.reconcileAll()
	return nil
}

// reconcileAll asks the reconciler to look at every placement.
func (a *Agent) reconcileAll() {
	select {
	case a.resync <- event.GenericEvent{Object: &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: a.cfg.NodeName}}}:
	default: // one is pending already
	}
}
