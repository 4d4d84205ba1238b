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

package residency

import (
	"context"
	"time"
)

// EventKind names a step of an admission's or a request's life, for the stress tool's
// payload-free timeline.
type EventKind string

const (
	EventQueueEntry       EventKind = "queue_entry"
	EventReservation      EventKind = "reservation"
	EventStreamGrant      EventKind = "stream_grant"
	EventRPCStart         EventKind = "rpc_start"
	EventRPCEnd           EventKind = "rpc_end"
	EventEvictionDispatch EventKind = "eviction_dispatch"
	EventEvictionAck      EventKind = "eviction_ack"
	// EventRefund is a charge given back without an eviction: an admission the worker refused,
	// or every shape of a process whose exit was confirmed.
	EventRefund       EventKind = "refund"
	EventLeaseGrant   EventKind = "lease_grant"
	EventLeaseRelease EventKind = "lease_release"
	// EventExitConfirmed and EventAdmissionRefused are what a refund may follow: a worker's
	// confirmed exit (every shape of it), or the worker's refusal of an admission (its shape).
	EventExitConfirmed    EventKind = "exit_confirmed"
	EventAdmissionRefused EventKind = "admission_refused"
)

// Event is one timeline entry.
type Event struct {
	At        time.Time
	Kind      EventKind
	RequestID string
	Lane      string
	Rung      int
	Ticket    uint64
	// RPC names the worker call for stream and RPC events: admit, evict, exchange or probe.
	RPC string
	// Riders are the other requests whose parts an exchange carries with its own request's
	// (serving shares one shape's exchanges among the calls waiting for it).
	Riders []string
	// Charge is the executables a reservation, an eviction's acknowledgement or a refund moved;
	// Used is the charged executables after it.
	Charge, Used int
}

type requestIDKey struct{}

// WithRequestID tags a request's context so that the timeline names it.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

type ridersKey struct{}

// WithRiders tags an exchange's context with the other requests whose parts it carries.
func WithRiders(ctx context.Context, ids []string) context.Context {
	return context.WithValue(ctx, ridersKey{}, ids)
}

// Riders returns the ids WithRiders put in ctx, or nil.
func Riders(ctx context.Context) []string {
	ids, _ := ctx.Value(ridersKey{}).([]string)
	return ids
}

// RequestID returns the id WithRequestID put in ctx, or "".
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}
