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

package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
)

func newServer(stderr io.Writer) *Server {
	return &Server{
		Backend: &Sim{Machine: simane.New(simane.Config{Clock: clock.RealClock{}, Scale: 0.00001}), SigningID: "synapse-ane-worker",
			Clock: clock.RealClock{}},
		Identity: Identity{Backend: "sim"},
		Stderr:   stderr,
		Exit:     func(int) {},
	}
}

// converse sends requests and returns the worker's responses.
func converse(t *testing.T, s *Server, reqs ...*pb.Request) []*pb.Response {
	t.Helper()
	var in bytes.Buffer
	w := protocol.NewWriter(&in, 0)
	for _, r := range reqs {
		if err := w.Write(r); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	if err := s.Serve(context.Background(), &in, &out); err != nil {
		t.Fatal(err)
	}
	r := protocol.NewReader(&out, 0)
	var resps []*pb.Response
	for {
		resp := &pb.Response{}
		if err := r.Read(resp); err != nil {
			if errors.Is(err, io.EOF) {
				return resps
			}
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
}

func TestEachAdmissionWritesTheSeedsStderrLine(t *testing.T) {
	var stderr bytes.Buffer
	s := newServer(&stderr)
	resps := converse(t, s,
		&pb.Request{Id: 1, Body: &pb.Request_Load{Load: &pb.Load{Identity: "gte", Layers: 22, Dimensions: 8, Rungs: []uint32{128}}}},
		&pb.Request{Id: 2, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 128}}},
		&pb.Request{Id: 3, Body: &pb.Request_Evict{Evict: &pb.Evict{Rung: 128}}},
		&pb.Request{Id: 4, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 128}}},
	)
	if len(resps) != 4 || resps[1].GetAdmitted().GetCompiledLayers() != 22 || resps[3].GetAdmitted().GetCacheHitLayers() != 22 {
		t.Fatalf("responses %v", resps)
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if len(lines) != 3 ||
		!strings.HasPrefix(lines[0], "ane-direct compile cache check: model_ref=gte cached=[] checked=1 total_ms=") ||
		!strings.HasPrefix(lines[1], "ane-direct shape admission: shape=128 layers_loaded=22 cache_hit=0 compiled=22 total_ms=") ||
		!strings.HasSuffix(lines[1], " outcome=admitted") ||
		!strings.HasPrefix(lines[2], "ane-direct shape admission: shape=128 layers_loaded=22 cache_hit=22 compiled=0 total_ms=") {
		t.Fatalf("stderr:\n%s", stderr.String())
	}
}

func TestAnUnknownProtocolVersionIsRefused(t *testing.T) {
	resps := converse(t, newServer(io.Discard), &pb.Request{Id: 1, Body: &pb.Request_Hello{Hello: &pb.Hello{ProtocolVersion: 2}}})
	if e := resps[0].GetError(); e == nil || e.Code != "protocol_version" {
		t.Fatalf("got %v, want a protocol_version refusal", resps[0])
	}
}

// FuzzWorkerServe feeds arbitrary bytes to the worker's protocol loop: it answers, stops at
// the end of input or with a typed protocol fault, and never panics.
func FuzzWorkerServe(f *testing.F) {
	var seed bytes.Buffer
	w := protocol.NewWriter(&seed, 0)
	_ = w.Write(&pb.Request{Id: 1, Body: &pb.Request_Load{Load: &pb.Load{Identity: "m", Layers: 1, Dimensions: 4, Rungs: []uint32{64}}}})
	_ = w.Write(&pb.Request{Id: 2, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 64}}})
	_ = w.Write(&pb.Request{Id: 3, Body: &pb.Request_Execute{Execute: &pb.Execute{Rung: 64, Task: "rerank", Sequences: []*pb.Sequence{{TokenIds: []uint32{1, 0, 2}}}}}})
	f.Add(seed.Bytes())
	f.Add([]byte{0x02, 0x08, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		s := newServer(io.Discard)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		err := s.Serve(ctx, bytes.NewReader(data), io.Discard)
		if err != nil && !errors.Is(err, protocol.ErrTruncated) && !errors.Is(err, protocol.ErrMalformed) &&
			!errors.Is(err, protocol.ErrFrameTooLarge) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("untyped error %v", err)
		}
	})
}

func TestAnAdmissionReportsEachLayerOnlyWhenAsked(t *testing.T) {
	s := newServer(io.Discard)
	resps := converse(t, s,
		&pb.Request{Id: 1, Body: &pb.Request_Load{Load: &pb.Load{Identity: "gte", Layers: 3, Dimensions: 8, Rungs: []uint32{128, 256}}}},
		&pb.Request{Id: 2, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 128, ReportProgress: true}}},
		&pb.Request{Id: 3, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 256}}},
	)
	if len(resps) != 1+3+1+1 {
		t.Fatalf("%d responses, want loaded, 3 progress frames, admitted, admitted: %v", len(resps), resps)
	}
	for i, r := range resps[1:4] {
		p := r.GetAdmitProgress()
		if r.Id != 2 || p == nil || p.Rung != 128 || p.LayersDone != uint32(i+1) || p.LayersTotal != 3 {
			t.Fatalf("frame %d: %v, want progress %d of 3 for request 2", i, r, i+1)
		}
	}
	if resps[4].Id != 2 || resps[4].GetAdmitted() == nil {
		t.Fatalf("the admission's answer: %v", resps[4])
	}
	// An agent that does not ask (an older one) gets only the answer.
	if resps[5].Id != 3 || resps[5].GetAdmitted() == nil {
		t.Fatalf("an admission without report_progress: %v", resps[5])
	}
}

func TestThePlacementProbeTimesTheDeviceAndModelsTheCPUReference(t *testing.T) {
	for _, tc := range []struct {
		ratio, want float64
	}{{0, 0.4}, {0.97, 0.97}} {
		var stderr bytes.Buffer
		s := newServer(&stderr)
		s.Backend.(*Sim).ProbeRatio = tc.ratio
		resps := converse(t, s,
			&pb.Request{Id: 1, Body: &pb.Request_Load{Load: &pb.Load{Identity: "gte", Layers: 2, Dimensions: 8, Rungs: []uint32{128}}}},
			&pb.Request{Id: 2, Body: &pb.Request_Probe{Probe: &pb.Probe{Rung: 128}}},
			&pb.Request{Id: 3, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 128}}},
			&pb.Request{Id: 4, Body: &pb.Request_Probe{Probe: &pb.Probe{Rung: 128}}},
		)
		if e := resps[1].GetError(); e == nil || e.Code != "not_resident" {
			t.Fatalf("a probe of a shape not resident: %v", resps[1])
		}
		p := resps[3].GetProbeResult()
		if p == nil || p.Rung != 128 || p.DeviceMs <= 0 {
			t.Fatalf("probe: %v", resps[3])
		}
		if got := p.DeviceMs / p.CpuMs; got < tc.want-0.001 || got > tc.want+0.001 {
			t.Fatalf("ratio %.3f, want %.2f", got, tc.want)
		}
		// The stand-in's line says its probe is simulated and shows no time as measured.
		want := fmt.Sprintf("ane-direct placement probe: shape=128 simulated ratio=%.2f\n", tc.want)
		if out := stderr.String(); !strings.HasSuffix(out, want) {
			t.Fatalf("the sim's probe line: %q, want %q", out, want)
		}
	}
}

func TestProbeRatiosAreReadForEveryRungOrSingleRungsAndBadOnesRefused(t *testing.T) {
	for _, tc := range []struct {
		spec   string
		all    float64
		byRung map[uint32]float64
	}{
		{"", 0, nil},
		{"0.97", 0.97, nil},
		{"512=0.97, 1024=0.9", 0, map[uint32]float64{512: 0.97, 1024: 0.9}},
		{"0.5,512=0.97", 0.5, map[uint32]float64{512: 0.97}},
	} {
		all, byRung, err := ParseProbeRatios(tc.spec)
		if err != nil || all != tc.all || !maps.Equal(byRung, tc.byRung) {
			t.Errorf("%q: %v %v %v, want %v %v", tc.spec, all, byRung, err, tc.all, tc.byRung)
		}
	}
	for _, bad := range []string{"x", "512=", "0=0.5", "-1", "512=abc", "abc=0.5", "0", "Inf"} {
		if _, _, err := ParseProbeRatios(bad); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
	// A rung's own ratio wins over the lane-wide one.
	s := newServer(io.Discard)
	s.Backend.(*Sim).ProbeRatio, s.Backend.(*Sim).ProbeRatios = 0.5, map[uint32]float64{256: 0.97}
	resps := converse(t, s,
		&pb.Request{Id: 1, Body: &pb.Request_Load{Load: &pb.Load{Identity: "gte", Layers: 2, Dimensions: 8, Rungs: []uint32{128, 256}}}},
		&pb.Request{Id: 2, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 128}}},
		&pb.Request{Id: 3, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 256}}},
		&pb.Request{Id: 4, Body: &pb.Request_Probe{Probe: &pb.Probe{Rung: 128}}},
		&pb.Request{Id: 5, Body: &pb.Request_Probe{Probe: &pb.Probe{Rung: 256}}},
	)
	for i, want := range map[int]float64{3: 0.5, 4: 0.97} {
		p := resps[i].GetProbeResult()
		if p == nil {
			t.Fatalf("probe: %v", resps[i])
		}
		if got := p.DeviceMs / p.CpuMs; got < want-0.001 || got > want+0.001 {
			t.Errorf("rung %d: ratio %.3f, want %.2f", p.Rung, got, want)
		}
	}
}

// timeoutBackend is a backend whose device never returns from an admission.
type timeoutBackend struct{ *Sim }

func (timeoutBackend) Admit(context.Context, uint32) (Admission, error) {
	return Admission{}, fmt.Errorf("admitting: %w", ErrDeviceTimeout)
}

func TestADeviceCallThatNeverReturnsEndsTheWorker(t *testing.T) {
	var stderr bytes.Buffer
	s := newServer(&stderr)
	s.Backend = timeoutBackend{s.Backend.(*Sim)}
	code := -1
	s.Exit = func(c int) { code = c }
	converse(t, s,
		&pb.Request{Id: 1, Body: &pb.Request_Load{Load: &pb.Load{Identity: "gte", Layers: 2, Dimensions: 8, Rungs: []uint32{128}}}},
		&pb.Request{Id: 2, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 128}}},
	)
	if code != 3 || !strings.Contains(stderr.String(), "device timeout") {
		t.Fatalf("exit code %d, stderr %q: a worker whose device call never returned must exit for its replacement", code, stderr.String())
	}
}

// TestTheAdmitProfileCarriesCacheHitsCompilesAndEveryLayersLoad: with a profile folder set,
// every admission writes one record with the seed's cache_hit and compiled counts and a
// layer_loads row per layer, with its origin and time.
func TestTheAdmitProfileCarriesCacheHitsCompilesAndEveryLayersLoad(t *testing.T) {
	machine := simane.New(simane.Config{Clock: clock.RealClock{}, Scale: 0.00001})
	var profile bytes.Buffer
	serve := func() {
		s := &Server{Backend: &Sim{Machine: machine, SigningID: "synapse-ane-worker", Clock: clock.RealClock{}},
			Identity: Identity{Backend: "sim"}, Stderr: io.Discard, Profile: &profile, Exit: func(int) {}}
		converse(t, s,
			&pb.Request{Id: 1, Body: &pb.Request_Load{Load: &pb.Load{Identity: "gte", Layers: 4, Dimensions: 8, Rungs: []uint32{128}}}},
			&pb.Request{Id: 2, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 128}}})
	}
	serve() // compiles every layer
	serve() // a second worker on the same machine finds them in aned's cache
	type record struct {
		Record     string `json:"record"`
		Shape      int    `json:"shape"`
		Outcome    string `json:"outcome"`
		CacheHit   int    `json:"cache_hit"`
		Compiled   int    `json:"compiled"`
		LayerLoads []struct {
			Layer  int     `json:"layer"`
			Origin string  `json:"origin"`
			Ms     float64 `json:"ms"`
		} `json:"layer_loads"`
	}
	lines := strings.Split(strings.TrimSpace(profile.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("profile %q: want one record per admission", profile.String())
	}
	for i, want := range []struct {
		hit, compiled int
		origin        string
	}{{0, 4, "compile"}, {4, 0, "cache"}} {
		var r record
		if err := json.Unmarshal([]byte(lines[i]), &r); err != nil {
			t.Fatal(err)
		}
		if r.Record != "admit" || r.Shape != 128 || r.Outcome != "admitted" || r.CacheHit != want.hit || r.Compiled != want.compiled || len(r.LayerLoads) != 4 {
			t.Fatalf("record %d: %+v", i, r)
		}
		for j, l := range r.LayerLoads {
			if l.Layer != j || l.Origin != want.origin || l.Ms < 0 {
				t.Fatalf("record %d layer %d: %+v, want origin %s", i, j, l, want.origin)
			}
		}
	}
}
