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

package workerhost

import (
	"bytes"
	"context"
	"io"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// BenchmarkRoundTrip measures one agent -> worker -> agent exchange over protocol v3 with a
// near-zero-cost sim model (8 dimensions, 4 tokens), against a bare pipe echo of the same
// request frame through cat in the same run, so the protocol's overhead reads as a ratio.
func BenchmarkRoundTrip(b *testing.B) {
	h := New(Config{Binary: workerBinary, Backend: "sim", StateDir: b.TempDir(), SimScale: 0.0001, Log: logr.Discard()})
	small := supervisor.ModelSpec{Lane: "bench", Identity: "bench", Model: "bench", Dimensions: 8, Layers: 2, Rungs: []int{64}, MaxResidentShapes: 1}
	w, _, err := h.Spawn(context.Background(), small, 1)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { w.Close(); <-w.Exited() }()
	if _, err := w.Admit(context.Background(), 64); err != nil {
		b.Fatal(err)
	}
	payload, _ := proto.Marshal(&pb.Execute{Task: "embed", Sequences: []*pb.Sequence{{TokenIds: []uint32{101, 7, 8, 102}}}})

	b.Run("protocol", func(b *testing.B) {
		lat := make([]time.Duration, 0, b.N)
		var bytesMoved int
		for b.Loop() {
			start := time.Now()
			reply, err := w.Exchange(context.Background(), 64, payload)
			lat = append(lat, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			bytesMoved = len(payload) + len(reply)
		}
		report(b, lat)
		b.ReportMetric(float64(bytesMoved), "payload-bytes/op")
	})

	b.Run("bare-pipe-echo", func(b *testing.B) {
		cat := exec.Command("cat")
		in, _ := cat.StdinPipe()
		out, _ := cat.StdoutPipe()
		if err := cat.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { in.Close(); cat.Wait() }()
		var frame bytes.Buffer
		req := &pb.Request{Id: 1, Body: &pb.Request_Execute{Execute: &pb.Execute{Rung: 64, Task: "embed", Sequences: []*pb.Sequence{{TokenIds: []uint32{101, 7, 8, 102}}}}}}
		if err := protocol.NewWriter(&frame, 0).Write(req); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, frame.Len())
		lat := make([]time.Duration, 0, b.N)
		for b.Loop() {
			start := time.Now()
			if _, err := in.Write(frame.Bytes()); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(out, buf); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		report(b, lat)
	})
}

func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}
