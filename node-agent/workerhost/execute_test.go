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
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// The request frame built around a payload is the Request the worker decodes: the payload's
// Execute with the exchange's rung, whatever rung the payload holds.
func TestAnExecuteFrameIsTheRequestOfThePayloadOnTheExchangesRung(t *testing.T) {
	for _, c := range []struct {
		name string
		id   uint64
		rung int
		exec *pb.Execute
	}{
		{"empty payload", 1, 128, &pb.Execute{}},
		{"one sequence", 2, 512, &pb.Execute{Task: "embed", Sequences: []*pb.Sequence{{TokenIds: []uint32{101, 2023, 102}}}}},
		{"payload of another rung", 3, 256, &pb.Execute{Rung: 8192, Task: "rerank", Sequences: []*pb.Sequence{{TokenIds: []uint32{1}}, {TokenIds: []uint32{2, 3}}}}},
		{"largest id and rung", math.MaxUint64, math.MaxUint32, &pb.Execute{Task: "embed", Sequences: []*pb.Sequence{{}}}},
		{"rung zero over a payload's rung", 4, 0, &pb.Execute{Rung: 128}},
	} {
		t.Run(c.name, func(t *testing.T) {
			payload, err := proto.Marshal(c.exec)
			if err != nil {
				t.Fatal(err)
			}
			got := &pb.Request{}
			if err := proto.Unmarshal(executeFrame(nil, c.id, c.rung, payload), got); err != nil {
				t.Fatalf("the frame does not decode: %v", err)
			}
			want := proto.Clone(c.exec).(*pb.Execute)
			want.Rung = uint32(c.rung)
			if !proto.Equal(got, &pb.Request{Id: c.id, Body: &pb.Request_Execute{Execute: want}}) {
				t.Fatalf("the frame decodes as %v, want id %d executing %v", got, c.id, want)
			}
		})
	}
}

func FuzzExecuteFrame(f *testing.F) {
	f.Add(uint64(1), uint32(128), []byte{})
	seed, _ := proto.Marshal(&pb.Execute{Rung: 9, Task: "embed", Sequences: []*pb.Sequence{{TokenIds: []uint32{101, 102}}}})
	f.Add(uint64(7), uint32(512), seed)
	f.Fuzz(func(t *testing.T, id uint64, rung uint32, payload []byte) {
		exec := &pb.Execute{}
		if wellFormed(payload) != nil || proto.Unmarshal(payload, exec) != nil {
			t.Skip("not an Execute")
		}
		got := &pb.Request{}
		if err := proto.Unmarshal(executeFrame(nil, id, int(rung), payload), got); err != nil {
			t.Fatalf("the frame of a valid payload does not decode: %v", err)
		}
		exec.Rung = rung
		if !proto.Equal(got, &pb.Request{Id: id, Body: &pb.Request_Execute{Execute: exec}}) {
			t.Fatalf("the frame decodes as %v, want id %d executing %v", got, id, exec)
		}
	})
}

// A Response frame's Reply is cut out as the bytes of the same Reply; anything else is the
// worker's refusal or a fault, never a reply.
func TestAnExecuteReplyIsCutFromItsResponseFrame(t *testing.T) {
	reply := &pb.Reply{Vectors: []*pb.Vector{{Values: []float32{0.25, -1, 3}}, {Values: []float32{1}}}}
	frame := func(resp *pb.Response) []byte {
		t.Helper()
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ok := frame(&pb.Response{Id: 4, Body: &pb.Response_Reply{Reply: reply}})
	truncated := append([]byte(nil), ok[:len(ok)-1]...)
	raw, err := executeReply(4, ok)
	if err != nil {
		t.Fatal(err)
	}
	got := &pb.Reply{}
	if err := proto.Unmarshal(raw, got); err != nil || !proto.Equal(got, reply) {
		t.Fatalf("cut out %v (%v), want %v", got, err, reply)
	}
	// The reply is a copy: the reader reuses the frame's buffer for its next read.
	for i := range ok {
		ok[i] = 0xff
	}
	if err := proto.Unmarshal(raw, got); err != nil || !proto.Equal(got, reply) {
		t.Fatalf("the reply changed with the frame's buffer: %v (%v)", got, err)
	}

	refusal := frame(&pb.Response{Id: 4, Body: &pb.Response_Error{Error: &pb.Error{Code: "unsupported_shape", Message: "too long"}}})
	// A oneof encoded twice is the last one: a reply followed by an error is the error.
	replyThenError := append(frame(&pb.Response{Id: 4, Body: &pb.Response_Reply{Reply: reply}}), refusal...)
	for _, c := range []struct {
		name  string
		frame []byte
		code  string // a WorkerError of this code; "" for a fault
		says  string
	}{
		{"a refusal", refusal, "unsupported_shape", "too long"},
		{"a reply, then a refusal", replyThenError, "unsupported_shape", "too long"},
		{"the reply to another request", frame(&pb.Response{Id: 3, Body: &pb.Response_Reply{Reply: reply}}), "", "reply 3 to request 4"},
		{"a refusal of another request", frame(&pb.Response{Id: 3, Body: &pb.Response_Error{Error: &pb.Error{Code: "internal"}}}), "", "reply 3 to request 4"},
		{"another answer", frame(&pb.Response{Id: 4, Body: &pb.Response_Released{Released: &pb.Released{Rung: 128}}}), "", "execute answered with"},
		{"no body", frame(&pb.Response{Id: 4}), "", "execute answered with"},
		{"a truncated frame", truncated, "", "malformed"},
		{"garbage", []byte{0x05, 0xff, 0xff, 0xff, 0xff, 0xff}, "", "malformed"},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw, err := executeReply(4, c.frame)
			var we *supervisor.WorkerError
			switch {
			case raw != nil:
				t.Fatalf("answered %x, want an error", raw)
			case c.code != "" && (!errors.As(err, &we) || we.Code != c.code || !strings.Contains(we.Message, c.says)):
				t.Fatalf("got %v, want the worker's refusal %s: %s", err, c.code, c.says)
			case c.code == "" && (!errors.Is(err, errFault) || errors.As(err, &we) || !strings.Contains(err.Error(), c.says)):
				t.Fatalf("got %v, want a fault saying %q", err, c.says)
			}
		})
	}
}

// A payload that is not an encoded message is the caller's error: refused before it reaches
// the worker, which stays healthy.
func TestAMalformedExecutePayloadIsRefusedAndTheWorkerStaysHealthy(t *testing.T) {
	w := spawn(t, newHost(t))
	if _, err := w.Admit(context.Background(), 128); err != nil {
		t.Fatal(err)
	}
	var we *supervisor.WorkerError
	if _, err := w.Exchange(context.Background(), 128, []byte{0x0a, 0xff}); !errors.As(err, &we) || we.Code != "invalid_input" {
		t.Fatalf("a malformed payload answered %v, want invalid_input", err)
	}
	if _, err := execute(t, w, 128, "embed", []uint32{101, 102}); err != nil {
		t.Fatalf("the worker after a refused payload: %v", err)
	}
}

// A malformed Execute answer from the worker process is a fault, not a reply.
func TestAMalformedExecuteAnswerIsAFault(t *testing.T) {
	w := spawn(t, newHost(t, func(c *Config) { c.Env = faults("SYNAPSE_WORKER_FAULTS=malformed:execute:1") }))
	if _, err := w.Admit(context.Background(), 128); err != nil {
		t.Fatal(err)
	}
	_, err := execute(t, w, 128, "embed", []uint32{101, 102})
	var we *supervisor.WorkerError
	if !errors.Is(err, errFault) || errors.As(err, &we) || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("got %v, want a malformed-frame fault", err)
	}
}

// Whatever frame a worker sends, the reply cut out of it is the Reply a full decode finds, or
// there is none.
func FuzzExecuteReply(f *testing.F) {
	ok, _ := proto.Marshal(&pb.Response{Id: 4, Body: &pb.Response_Reply{Reply: &pb.Reply{Scores: []float32{0.5, 1}}}})
	refusal, _ := proto.Marshal(&pb.Response{Id: 4, Body: &pb.Response_Error{Error: &pb.Error{Code: "internal"}}})
	f.Add(ok)
	f.Add(refusal)
	f.Add(append(ok, refusal...))
	f.Fuzz(func(t *testing.T, frame []byte) {
		raw, err := executeReply(4, frame)
		if err != nil {
			return
		}
		got := &pb.Reply{}
		replyErr := proto.Unmarshal(raw, got)
		resp := &pb.Response{}
		if err := proto.Unmarshal(frame, resp); err != nil {
			// Only the reply's own bytes may be what does not decode: the caller decodes them
			// and finds it malformed.
			if replyErr == nil {
				t.Fatalf("a well-formed reply was cut from a frame that does not decode: %v", err)
			}
			return
		}
		if replyErr != nil || resp.Id != 4 || !proto.Equal(got, resp.GetReply()) {
			t.Fatalf("cut out %v (%v) from %v", got, replyErr, resp)
		}
	})
}
