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

package protocol

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
)

func TestFramesRoundTripInOrder(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, 0)
	sent := []*pb.Response{
		{Id: 1, Body: &pb.Response_Hello{Hello: &pb.HelloReply{ProtocolVersion: 3, Backend: "sim"}}},
		{Id: 2, Body: &pb.Response_Admitted{Admitted: &pb.Admitted{Rung: 128, LayersLoaded: 22, CacheHitLayers: proto.Uint32(22), CompiledLayers: proto.Uint32(0)}}},
		{Id: 3, Body: &pb.Response_Reply{Reply: &pb.Reply{Vectors: []*pb.Vector{{Values: []float32{0.6, 0.8}}}}}},
	}
	for _, m := range sent {
		if err := w.Write(m); err != nil {
			t.Fatal(err)
		}
	}
	r := NewReader(&buf, 0)
	for _, want := range sent {
		got := &pb.Response{}
		if err := r.Read(got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("read %v, want %v", got, want)
		}
	}
	if err := r.Read(&pb.Response{}); err != io.EOF {
		t.Fatalf("at the end of the stream: %v, want io.EOF", err)
	}
}

func TestAFrameLargerThanTheLimitIsAProtocolFault(t *testing.T) {
	big := &pb.Request{Id: 1, Body: &pb.Request_Execute{Execute: &pb.Execute{Sequences: []*pb.Sequence{{TokenIds: make([]uint32, 1000)}}}}}
	if err := NewWriter(io.Discard, 64).Write(big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("writing: %v, want ErrFrameTooLarge", err)
	}
	// A corrupt length prefix claiming 1 TiB is refused before anything is allocated.
	var prefix [binary.MaxVarintLen64]byte
	n := binary.PutUvarint(prefix[:], 1<<40)
	if err := NewReader(bytes.NewReader(prefix[:n]), 0).Read(&pb.Request{}); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("reading: %v, want ErrFrameTooLarge", err)
	}
}

func TestATruncatedFrameIsAProtocolFault(t *testing.T) {
	var buf bytes.Buffer
	if err := NewWriter(&buf, 0).Write(&pb.Request{Id: 7, Body: &pb.Request_Admit{Admit: &pb.Admit{Rung: 512}}}); err != nil {
		t.Fatal(err)
	}
	whole := buf.Bytes()
	for cut := 1; cut < len(whole); cut++ {
		if err := NewReader(bytes.NewReader(whole[:cut]), 0).Read(&pb.Request{}); !errors.Is(err, ErrTruncated) {
			t.Fatalf("cut at %d of %d bytes: %v, want ErrTruncated", cut, len(whole), err)
		}
	}
}

func TestGarbageIsAProtocolFault(t *testing.T) {
	garbage := append([]byte{5}, 0xff, 0xff, 0xff, 0xff, 0xff)
	if err := NewReader(bytes.NewReader(garbage), 0).Read(&pb.Response{}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want ErrMalformed", err)
	}
}

// FuzzReadFrame feeds arbitrary bytes to the decoder: it must answer with a message, io.EOF or
// a typed protocol fault, and never panic or allocate past its limit.
func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	w := NewWriter(&buf, 0)
	_ = w.Write(&pb.Response{Id: 1, Body: &pb.Response_Loaded{Loaded: &pb.Loaded{AneCachedShapes: &pb.CachedShapes{Rungs: []uint32{128, 256}}}}})
	_ = w.Write(&pb.Response{Id: 2, Body: &pb.Response_Error{Error: &pb.Error{Code: "ane_resources_exhausted"}}})
	f.Add(buf.Bytes())
	f.Add([]byte{})
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := NewReader(bytes.NewReader(data), 1<<16)
		for range 64 {
			err := r.Read(&pb.Response{})
			if err == nil {
				continue
			}
			if err != io.EOF && !errors.Is(err, ErrTruncated) && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrFrameTooLarge) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
	})
}
