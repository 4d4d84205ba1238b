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
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
)

// waitRecorder is the fake clock, and tells the test every wait the heartbeat starts with
// After (the renewal period and the backoff between attempts), once the wait is registered:
// the test then steps the clock by exactly that wait.
type waitRecorder struct {
	*clocktesting.FakeClock
	waits chan time.Duration
}

func (c waitRecorder) After(d time.Duration) <-chan time.Time {
	ch := c.FakeClock.After(d)
	c.waits <- d
	return ch
}

// leaseAgent is an agent whose Lease calls go through funcs, on a fake clock.
func leaseAgent(t *testing.T, funcs interceptor.Funcs) (*Agent, waitRecorder) {
	t.Helper()
	scheme := k8sruntime.NewScheme()
	if err := coordinationv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	kube := interceptor.NewClient(fake.NewClientBuilder().WithScheme(scheme).Build(), funcs)
	clk := waitRecorder{FakeClock: clocktesting.NewFakeClock(epoch), waits: make(chan time.Duration)}
	return &Agent{cfg: Config{NodeName: "mac-1", LeaseDuration: 30 * time.Second, Clock: clk, Log: testr.New(t)}, kube: kube}, clk
}

var errAPIServerAway = apierrors.NewServiceUnavailable("the API server is away")

// While renewals fail, each renewal makes at most renewAttempts calls, spaced by a doubling
// backoff jittered by up to 20%, and the next renewal waits for the renew interval (jittered
// by up to 4%): the heartbeat never hammers the API server, and a fleet's retries spread out.
// A renewal that succeeds makes one call and waits for the next period.
func TestLeaseRenewalRetriesAreBoundedAndJittered(t *testing.T) {
	g := gomega.NewWithT(t)
	var attempts atomic.Int64
	var healthy atomic.Bool
	a, clk := leaseAgent(t, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			attempts.Add(1)
			if !healthy.Load() {
				return errAPIServerAway
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.heartbeat(ctx) }()
	t.Cleanup(func() {
		cancel()
		// The heartbeat may be handing over a wait as it is cancelled.
		g.Eventually(func() bool {
			select {
			case <-clk.waits:
				return false
			case <-done:
				return true
			}
		}).WithTimeout(10 * time.Second).Should(gomega.BeTrue())
	})
	next := func() time.Duration {
		t.Helper()
		var d time.Duration
		g.Eventually(clk.waits).WithTimeout(10*time.Second).Should(gomega.Receive(&d), "the heartbeat started no wait")
		return d
	}
	every := a.cfg.LeaseDuration / 3
	within := func(d, base time.Duration, jitter float64) bool {
		return d >= base && d <= base+time.Duration(jitter*float64(base))
	}

	const renewals = 4
	var firstBackoffs, periods []time.Duration
	for r := range renewals {
		base := renewRetryBase
		for i := 1; i < renewAttempts; i++ {
			d := next()
			if got := attempts.Load(); got != int64(r*renewAttempts+i) {
				t.Fatalf("renewal %d: %d calls before backoff wait %d, want %d", r, got, i, r*renewAttempts+i)
			}
			if !within(d, base, renewRetryJitter) {
				t.Fatalf("renewal %d: backoff wait %d is %s, want %s to %s", r, i, d, base, base+time.Duration(renewRetryJitter*float64(base)))
			}
			if i == 1 {
				firstBackoffs = append(firstBackoffs, d)
			}
			clk.Step(d)
			base = min(2*base, renewRetryCap)
		}
		d := next()
		if got := attempts.Load(); got != int64((r+1)*renewAttempts) {
			t.Fatalf("renewal %d made %d calls in all, want at most %d per renewal", r, got, renewAttempts)
		}
		if !within(d, every, renewPeriodJitter) {
			t.Fatalf("renewal %d: the wait for the next renewal is %s, want %s to %s", r, d, every, every+time.Duration(renewPeriodJitter*float64(every)))
		}
		periods = append(periods, d)
		if r < renewals-1 {
			clk.Step(d)
		}
	}
	allEqual := func(ds []time.Duration) bool {
		for _, d := range ds[1:] {
			if d != ds[0] {
				return false
			}
		}
		return true
	}
	if allEqual(firstBackoffs) || allEqual(periods) {
		t.Errorf("the waits are not jittered: first backoffs %v, periods %v", firstBackoffs, periods)
	}

	// The API server is back: one renewal, one read (the Lease is created), then the period. It
	// is back before the last period ends: had the step come first, the renewal it starts could
	// read the API server still away (seen once under load).
	healthy.Store(true)
	before := attempts.Load()
	clk.Step(periods[len(periods)-1])
	d := next()
	if got := attempts.Load() - before; got != 1 {
		t.Fatalf("a renewal that succeeded made %d reads, want 1", got)
	}
	if !within(d, every, renewPeriodJitter) {
		t.Fatalf("after a renewal that succeeded the heartbeat waits %s, want the renew interval %s", d, every)
	}
	lease := &coordinationv1.Lease{}
	if err := a.kube.Get(ctx, client.ObjectKey{Namespace: LeaseNamespace, Name: "mac-1"}, lease); err != nil {
		t.Fatal(err)
	}
	if !lease.Spec.RenewTime.Time.Equal(clk.Now().Truncate(time.Microsecond)) { // a MicroTime keeps microseconds
		t.Fatalf("the Lease was renewed at %s, want %s", lease.Spec.RenewTime.Time, clk.Now())
	}
}

// A renewal call that hangs (an API server that accepts the connection and never answers) is
// cancelled after its timeout by the agent's clock, with a typed error, and leaves no timer.
func TestLeaseRenewalCallTimesOutOnTheAgentsClock(t *testing.T) {
	g := gomega.NewWithT(t)
	a, clk := leaseAgent(t, interceptor.Funcs{
		Get: func(ctx context.Context, _ client.WithWatch, _ client.ObjectKey, _ client.Object, _ ...client.GetOption) error {
			<-ctx.Done()
			return apierrors.NewTimeoutError(ctx.Err().Error(), 0)
		},
	})
	const timeout = 5 * time.Second
	result := make(chan error, 1)
	go func() { result <- a.renewWithin(context.Background(), timeout) }()
	g.Eventually(clk.HasWaiters).WithTimeout(10 * time.Second).Should(gomega.BeTrue())
	clk.Step(timeout - time.Millisecond)
	g.Consistently(result).WithTimeout(50*time.Millisecond).ShouldNot(gomega.Receive(), "the call was cancelled before its timeout")
	clk.Step(time.Millisecond)
	var err error
	g.Eventually(result).WithTimeout(10 * time.Second).Should(gomega.Receive(&err))
	if !errors.Is(err, ErrLeaseRenewTimeout) {
		t.Fatalf("the hung call ended with %v, want ErrLeaseRenewTimeout", err)
	}
	if clk.HasWaiters() {
		t.Fatal("the call's timer is left on the clock")
	}
}

// An error that is not a timeout is returned as it is.
func TestLeaseRenewalErrorsOtherThanTimeoutsAreReturnedAsTheyAre(t *testing.T) {
	a, _ := leaseAgent(t, interceptor.Funcs{
		Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
			return apierrors.NewForbidden(schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}, "mac-1", errors.New("refused"))
		},
	})
	err := a.renewWithin(context.Background(), time.Second)
	if !apierrors.IsForbidden(err) || errors.Is(err, ErrLeaseRenewTimeout) {
		t.Fatalf("got %v, want the Forbidden error", err)
	}
}
