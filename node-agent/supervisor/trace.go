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

	"github.com/ck-synapse/synapse-fleet/node-agent/residency"
)

type (
	// EventKind names a step of an admission's or a request's life, for the stress tool's
	// payload-free timeline.
	EventKind = residency.EventKind
	// Event is one timeline entry.
	Event = residency.Event
)

const (
	EventQueueEntry       = residency.EventQueueEntry
	EventReservation      = residency.EventReservation
	EventStreamGrant      = residency.EventStreamGrant
	EventRPCStart         = residency.EventRPCStart
	EventRPCEnd           = residency.EventRPCEnd
	EventEvictionDispatch = residency.EventEvictionDispatch
	EventEvictionAck      = residency.EventEvictionAck
	EventRefund           = residency.EventRefund
	EventLeaseGrant       = residency.EventLeaseGrant
	EventLeaseRelease     = residency.EventLeaseRelease
	EventExitConfirmed    = residency.EventExitConfirmed
	EventAdmissionRefused = residency.EventAdmissionRefused
)

// WithRequestID tags a request's context so that the timeline names it.
func WithRequestID(ctx context.Context, id string) context.Context {
	return residency.WithRequestID(ctx, id)
}

// trace records an event if a tracer is configured.
func (s *Supervisor) trace(e Event) {
	if s.cfg.Trace == nil {
		return
	}
	if e.At.IsZero() {
		e.At = s.clk.Now()
	}
	s.cfg.Trace(e)
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
