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

package supervisor

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
	EventLeaseGrant       EventKind = "lease_grant"
	EventLeaseRelease     EventKind = "lease_release"
)

// Event is one timeline entry. Victim fields name an eviction's victim.
type Event struct {
	At        time.Time
	Kind      EventKind
	RequestID string
	Lane      string
	Rung      int
	Ticket    uint64
	// RPC names the worker call for stream and RPC events: admit, evict or exchange.
	RPC string
	// Used is the charged executables after a reservation or an eviction's acknowledgement.
	Used int
}

type requestIDKey struct{}

// WithRequestID tags a request's context so that the timeline names it.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

func requestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey{}).(string)
	return id
}

// trace records an event if a tracer is configured. It may be called with or without mu held;
// the tracer must be safe for concurrent use.
func (s *Supervisor) trace(e Event) {
	if s.tracer == nil {
		return
	}
	if e.At.IsZero() {
		e.At = s.clk.Now()
	}
	s.tracer(e)
}

// traced runs a worker call on st, recording the stream grant and the RPC's start and end.
func (s *Supervisor) traced(st *stream, ev Event, call func(Worker) error) error {
	return st.do(func(w Worker) error {
		ev.Kind = EventStreamGrant
		s.trace(ev)
		ev.Kind = EventRPCStart
		s.trace(ev)
		err := call(w)
		ev.Kind, ev.At = EventRPCEnd, time.Time{}
		s.trace(ev)
		return err
	})
}
