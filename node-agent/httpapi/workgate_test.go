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

package httpapi

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// TestAWorkSlotWaitIsBoundedInCountAndTime: past the free slots a call waits, past the waiting
// bound it is refused overloaded at once, and a wait that reaches its bound on the (fake) clock
// is refused overloaded; a slot given back lets the next call in at once.
func TestAWorkSlotWaitIsBoundedInCountAndTime(t *testing.T) {
	clk := clocktesting.NewFakeClock(epoch)
	g := newWorkGate(WorkLimits{Slots: 1, MaxWaiting: 1, MaxWait: 2 * time.Second}, clk)
	ctx := context.Background()
	if err := g.enter(ctx); err != nil {
		t.Fatalf("a free slot was refused: %v", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- g.enter(ctx) }()
	if err := wait.PollUntilContextTimeout(ctx, time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return g.waiters() == 1 && clk.HasWaiters(), nil
	}); err != nil {
		t.Fatal("the second call never waited")
	}
	var e *apiError
	if err := g.enter(ctx); !errors.As(err, &e) || e.status != http.StatusTooManyRequests || e.code != string(refusal.Overloaded) || e.retryAfter <= 0 {
		t.Fatalf("a call past the waiting bound: %v, want overloaded at once with a retry time", err)
	}
	clk.Step(2*time.Second - time.Nanosecond)
	select {
	case err := <-waited:
		t.Fatalf("the wait ended before its bound: %v", err)
	default:
	}
	clk.Step(time.Nanosecond)
	if err := <-waited; !errors.As(err, &e) || e.code != string(refusal.Overloaded) {
		t.Fatalf("a wait that reached its bound: %v, want overloaded", err)
	}
	g.leave()
	if err := g.enter(ctx); err != nil {
		t.Fatalf("a slot given back was not taken at once: %v", err)
	}
}

// TestACallFindingNoWorkSlotIsAnsweredOverloadedWithRetryAfter: through the handler, a call that
// finds every work slot taken and may not wait is answered 429 overloaded with Retry-After, and
// once the slot is free the same call is served.
func TestACallFindingNoWorkSlotIsAnsweredOverloadedWithRetryAfter(t *testing.T) {
	s := New(Config{Node: "mac-1", Catalog: fakeCatalog{}, Runner: &fakeRunner{}, Clock: clocktesting.NewFakeClock(epoch),
		Auth: apiauth.Anonymous{}, Work: WorkLimits{Slots: 1, MaxWaiting: -1}})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	if err := s.work.enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	body := `{"model": "team/embed", "input": "hello"}`
	resp, out := post(t, ts.URL+"/v1/embeddings", body)
	if resp.StatusCode != http.StatusTooManyRequests || errorCodeOf(out) != string(refusal.Overloaded) || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("with no work slot: %d %v (Retry-After %q), want 429 overloaded with Retry-After", resp.StatusCode, out, resp.Header.Get("Retry-After"))
	}
	s.work.leave()
	if resp, out := post(t, ts.URL+"/v1/embeddings", body); resp.StatusCode != http.StatusOK {
		t.Fatalf("with the slot free: %d %v", resp.StatusCode, out)
	}
	if s.work.waiters() != 0 || len(s.work.slots) != 0 {
		t.Fatalf("a served call kept its work slot: %d held, %d waiting", len(s.work.slots), s.work.waiters())
	}
}

// panickingCatalog panics on every lookup: a defect somewhere under the handler.
type panickingCatalog struct{}

func (panickingCatalog) Lookup(string) ([]Lane, bool, error) { panic("a defect under the handler") }

func (panickingCatalog) Lanes() []Lane { panic("a defect under the handler") }

// TestAPanickingCallGivesItsWorkSlotBack: net/http recovers a handler's panic; the call's work
// slot must come back with it, or a few such calls would leave every later one overloaded.
func TestAPanickingCallGivesItsWorkSlotBack(t *testing.T) {
	s := New(Config{Node: "mac-1", Catalog: panickingCatalog{}, Runner: &fakeRunner{}, Clock: clocktesting.NewFakeClock(epoch),
		Auth: apiauth.Anonymous{}, Work: WorkLimits{Slots: 1, MaxWaiting: -1}})
	ts := httptest.NewUnstartedServer(s)
	ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the recovered panic's stack
	ts.Start()
	t.Cleanup(ts.Close)
	for range 3 {
		resp, err := http.Post(ts.URL+"/v1/embeddings", "application/json", strings.NewReader(`{"model": "team/embed", "input": "hello"}`))
		if err == nil {
			resp.Body.Close()
			t.Fatalf("a panicking call was answered %d", resp.StatusCode)
		}
	}
	if len(s.work.slots) != 0 {
		t.Fatalf("%d work slots held after the panicking calls", len(s.work.slots))
	}
}

// TestBulkCallsNeverHoldEverySlot: calls with large bodies (or bodies of unknown length) take
// one of a share of half the work slots before they read their bodies; a bulk call past that
// share is refused (or waits) while an ordinary call still finds a slot.
func TestBulkCallsNeverHoldEverySlot(t *testing.T) {
	g := newWorkGate(WorkLimits{Slots: 2, MaxWaiting: -1, LargeBody: 1000}, clocktesting.NewFakeClock(epoch))
	if !g.bulkBody(1000) || !g.bulkBody(-1) || g.bulkBody(999) {
		t.Fatal("the bulk threshold is not the body size configured, or a body of unknown length is not bulk")
	}
	ctx := context.Background()
	if err := g.enterBulk(ctx); err != nil {
		t.Fatalf("the first bulk call: %v", err)
	}
	if err := g.enter(ctx); err != nil {
		t.Fatalf("the first bulk call's work slot: %v", err)
	}
	var e *apiError
	if err := g.enterBulk(ctx); !errors.As(err, &e) || e.code != string(refusal.Overloaded) {
		t.Fatalf("a second bulk call with the bulk share taken: %v, want overloaded", err)
	}
	if err := g.enter(ctx); err != nil {
		t.Fatalf("an ordinary call found no slot beside the bulk one: %v", err)
	}
	g.leave()
	g.leave()
	g.leaveBulk()
	if len(g.slots) != 0 || len(g.bulk) != 0 {
		t.Fatalf("slots held after every call left: %d, bulk %d", len(g.slots), len(g.bulk))
	}
}

// TestABulkCallGivesItsShareBackWhenItEnds: through the handler, a call with a large body that
// is refused (over the lane's ceiling) leaves neither a work slot nor its bulk share held.
func TestABulkCallGivesItsShareBackWhenItEnds(t *testing.T) {
	s := New(Config{Node: "mac-1", Catalog: fakeCatalog{}, Runner: &fakeRunner{}, Clock: clocktesting.NewFakeClock(epoch),
		Auth: apiauth.Anonymous{}, Work: WorkLimits{Slots: 2, LargeBody: 1000}})
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	ids := strings.Repeat("7,", 5000) + "7"
	for range 3 {
		resp, out := post(t, ts.URL+"/v1/embeddings", `{"model": "team/embed", "input": [`+ids+`]}`)
		if resp.StatusCode/100 != 4 {
			t.Fatalf("an oversize call: %d %v", resp.StatusCode, out)
		}
	}
	if resp, out := post(t, ts.URL+"/v1/embeddings", `{"model": "team/embed", "input": "hello"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("an ordinary call after the bulk ones: %d %v", resp.StatusCode, out)
	}
	if len(s.work.slots) != 0 || len(s.work.bulk) != 0 {
		t.Fatalf("held after every call ended: %d work slots, %d bulk", len(s.work.slots), len(s.work.bulk))
	}
}
