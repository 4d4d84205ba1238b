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

// Package worker is the inside of synapse-ane-worker: the protocol v3 loop on stdin and
// stdout, one exchange at a time, in front of a Backend (the Neural Engine, or the sim
// stand-in). It writes one stderr line per shape admission and per cache check, which the
// agent logs at INFO.
package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
)

// ProtocolVersion is the protocol this worker speaks.
const ProtocolVersion = 3

// Backend runs the model.
type Backend interface {
	// Load loads the model and checks which rungs aned holds (nil: not checked).
	Load(ctx context.Context, l *pb.Load) (cached []uint32, err error)
	Admit(ctx context.Context, rung uint32) (Admission, error)
	Evict(rung uint32) error
	Execute(ctx context.Context, e *pb.Execute) (*pb.Reply, error)
	Resident() []uint32
	// Probe times the fastest of 5 evaluations of a resident rung on the device and on a
	// CPU-only reference of the same artifact, back to back.
	Probe(ctx context.Context, rung uint32) (device, cpu time.Duration, err error)
}

// Admission is what a backend did to admit a rung.
type Admission struct {
	Layers, CacheHit, Compiled int
	Took                       time.Duration
	// LayerLoads say how each layer became resident, in order, for the admit profile.
	LayerLoads []LayerLoad
}

// LayerLoad is how one layer became resident: loaded from aned's cache or compiled, and how
// long it took.
type LayerLoad struct {
	Layer  int
	Origin string // "cache" or "compile"
	Took   time.Duration
}

func originOf(fromCache bool) string {
	if fromCache {
		return "cache"
	}
	return "compile"
}

// Error is a refusal the worker answers with an Error frame: the request did not run and the
// worker stays healthy.
type Error struct{ Code, Message string }

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Identity is what the worker reports in its hello.
type Identity struct {
	Backend, SigningIdentifier, BinaryDigest string
}

// Server is the protocol loop.
type Server struct {
	Backend  Backend
	Identity Identity
	// Stderr receives the admission and cache-check lines.
	Stderr io.Writer
	// Profile, if set, receives one admit profile record per admission (SYNAPSE_ANE_PROFILE_DIR).
	Profile io.Writer
	// Faults injects failures for tests (see ParseFaults).
	Faults *Faults
	// Exit ends the process for a crash fault.
	Exit func(code int)
}

// Serve answers requests from in on out until in closes (the agent closed the channel: a
// clean exit) or a protocol fault (an error: the process exits non-zero).
func (s *Server) Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	r := protocol.NewReader(in, 0)
	w := protocol.NewWriter(out, 0)
	for {
		req := &pb.Request{}
		if err := r.Read(req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		kind := bodyKind(req)
		switch s.Faults.next(kind) {
		case faultCrash:
			fmt.Fprintf(s.Stderr, "injected fault: crash at %s\n", kind)
			s.Exit(3)
			return nil
		case faultMalformed:
			_, err := out.Write([]byte{0x05, 0xff, 0xff, 0xff, 0xff, 0xff})
			if err != nil {
				return err
			}
			continue
		case faultHang:
			<-ctx.Done()
			return ctx.Err()
		}
		var progressErr error
		rctx := ctx
		if a := req.GetAdmit(); a != nil && a.ReportProgress {
			rctx = withProgress(ctx, func(done, total int) {
				if progressErr == nil {
					progressErr = w.Write(&pb.Response{Id: req.Id, Body: &pb.Response_AdmitProgress{AdmitProgress: &pb.AdmitProgress{
						Rung: a.Rung, LayersDone: uint32(done), LayersTotal: uint32(total)}}})
				}
			})
		}
		resp := s.handle(rctx, req)
		if progressErr != nil {
			return progressErr
		}
		resp.Id = req.Id
		if err := w.Write(resp); err != nil {
			return err
		}
	}
}

func bodyKind(req *pb.Request) string {
	switch req.Body.(type) {
	case *pb.Request_Hello:
		return "hello"
	case *pb.Request_Load:
		return "load"
	case *pb.Request_Admit:
		return "admit"
	case *pb.Request_Evict:
		return "evict"
	case *pb.Request_Execute:
		return "execute"
	case *pb.Request_CacheCheck:
		return "cache_check"
	case *pb.Request_Inventory:
		return "inventory"
	case *pb.Request_Probe:
		return "probe"
	}
	return "unknown"
}

func (s *Server) handle(ctx context.Context, req *pb.Request) *pb.Response {
	fail := func(err error) *pb.Response {
		if errors.Is(err, ErrDeviceTimeout) {
			// The driver call never returned: its thread is stuck and the device's state is
			// unknown. The worker exits without answering, so the agent confirms the exit and
			// starts a replacement rather than trust this process again.
			fmt.Fprintf(s.Stderr, "ane-direct device timeout: %v; exiting\n", err)
			s.Exit(3)
		}
		var e *Error
		if !errors.As(err, &e) {
			e = &Error{Code: "worker_error", Message: err.Error()}
		}
		return &pb.Response{Body: &pb.Response_Error{Error: &pb.Error{Code: e.Code, Message: e.Message}}}
	}
	switch b := req.Body.(type) {
	case *pb.Request_Hello:
		if b.Hello.ProtocolVersion != ProtocolVersion {
			return fail(&Error{Code: "protocol_version", Message: fmt.Sprintf("this worker speaks protocol %d, the agent %d", ProtocolVersion, b.Hello.ProtocolVersion)})
		}
		return &pb.Response{Body: &pb.Response_Hello{Hello: &pb.HelloReply{ProtocolVersion: ProtocolVersion,
			Backend: s.Identity.Backend, SigningIdentifier: s.Identity.SigningIdentifier, BinaryDigest: s.Identity.BinaryDigest}}}
	case *pb.Request_Load:
		start := time.Now()
		cached, err := s.Backend.Load(ctx, b.Load)
		if err != nil {
			return fail(err)
		}
		loaded := &pb.Loaded{}
		if cached != nil {
			loaded.AneCachedShapes = &pb.CachedShapes{Rungs: cached}
			fmt.Fprintf(s.Stderr, "ane-direct compile cache check: model_ref=%s cached=%v checked=%d total_ms=%.1f\n",
				b.Load.Identity, cached, len(b.Load.Rungs), ms(time.Since(start)))
		}
		return &pb.Response{Body: &pb.Response_Loaded{Loaded: loaded}}
	case *pb.Request_Admit:
		a, err := s.Backend.Admit(ctx, b.Admit.Rung)
		outcome := "admitted"
		if err != nil {
			outcome = "refused"
			var e *Error
			if errors.As(err, &e) {
				outcome = e.Code
			}
		}
		fmt.Fprintf(s.Stderr, "ane-direct shape admission: shape=%d layers_loaded=%d cache_hit=%d compiled=%d total_ms=%.1f outcome=%s\n",
			b.Admit.Rung, a.CacheHit+a.Compiled, a.CacheHit, a.Compiled, ms(a.Took), outcome)
		s.profileAdmit(b.Admit.Rung, a, outcome)
		if err != nil {
			return fail(err)
		}
		hit, compiled := uint32(a.CacheHit), uint32(a.Compiled)
		return &pb.Response{Body: &pb.Response_Admitted{Admitted: &pb.Admitted{Rung: b.Admit.Rung,
			LayersLoaded: uint32(a.Layers), TotalMs: ms(a.Took), CacheHitLayers: &hit, CompiledLayers: &compiled}}}
	case *pb.Request_Evict:
		if err := s.Backend.Evict(b.Evict.Rung); err != nil {
			return fail(err)
		}
		return &pb.Response{Body: &pb.Response_Released{Released: &pb.Released{Rung: b.Evict.Rung}}}
	case *pb.Request_Execute:
		reply, err := s.Backend.Execute(ctx, b.Execute)
		if err != nil {
			return fail(err)
		}
		return &pb.Response{Body: &pb.Response_Reply{Reply: reply}}
	case *pb.Request_Inventory:
		return &pb.Response{Body: &pb.Response_Inventory{Inventory: &pb.InventoryReply{Resident: s.Backend.Resident()}}}
	case *pb.Request_Probe:
		device, cpu, err := s.Backend.Probe(ctx, b.Probe.Rung)
		if err != nil {
			return fail(err)
		}
		if s.Identity.Backend == "sim" {
			// The stand-in measures nothing: its ratio is configured, and no time is shown as if
			// measured.
			fmt.Fprintf(s.Stderr, "ane-direct placement probe: shape=%d simulated ratio=%.2f\n", b.Probe.Rung, float64(device)/float64(cpu))
		} else {
			fmt.Fprintf(s.Stderr, "ane-direct placement probe: shape=%d device_ms=%.3f cpu_ms=%.3f ratio=%.2f\n", b.Probe.Rung, ms(device), ms(cpu), float64(device)/float64(cpu))
		}
		return &pb.Response{Body: &pb.Response_ProbeResult{ProbeResult: &pb.ProbeResult{Rung: b.Probe.Rung, DeviceMs: msf(device), CpuMs: msf(cpu)}}}
	}
	return fail(&Error{Code: "unknown_request", Message: "this worker does not know the request"})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// msf is d in milliseconds at full precision.
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

type progressKey struct{}

// withProgress gives a backend's Admit a sink for its progress (an AdmitProgress frame per
// call), when the agent asked for it.
func withProgress(ctx context.Context, f func(done, total int)) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

// reportProgress tells the agent that done of total layers of the admission are resident; it
// does nothing if the agent did not ask.
func reportProgress(ctx context.Context, done, total int) {
	if f, ok := ctx.Value(progressKey{}).(func(done, total int)); ok {
		f(done, total)
	}
}
