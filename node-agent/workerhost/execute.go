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
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// The field numbers an Execute exchange is framed with, read from the protocol's descriptors.
var (
	requestID      = field(&pb.Request{}, "id")
	requestExecute = field(&pb.Request{}, "execute")
	executeRung    = field(&pb.Execute{}, "rung")
	responseID     = field(&pb.Response{}, "id")
	responseReply  = field(&pb.Response{}, "reply")
)

func field(m proto.Message, name protoreflect.Name) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

// Exchange implements supervisor.Worker: payload is a serialised Execute, the reply a
// serialised Reply. Both pass through as bytes: the request frame is the payload wrapped in a
// Request, and the reply is cut out of its Response frame, never decoded and encoded again
// here (the caller decodes it once). They are most of an exchange's bytes, and re-encoding them
// cost four passes over the vectors on every call.
func (p *Process) Exchange(ctx context.Context, rung int, payload []byte) ([]byte, error) {
	if err := wellFormed(payload); err != nil {
		return nil, &supervisor.WorkerError{Code: "invalid_input", Message: fmt.Sprintf("the Execute payload is malformed: %v", err)}
	}
	p.nextID++
	id := p.nextID
	req := executeFrame(p.frame[:0], id, rung, payload)
	p.frame = req
	if cap(p.frame) > keptFrame {
		p.frame = nil // a large batch's buffer is not kept for the worker's life
	}
	var frame []byte
	if err := p.bounded(ctx, p.cfg.CallTimeout, func() error {
		if err := p.w.WriteFrame(req); err != nil {
			return err
		}
		var err error
		frame, err = p.r.ReadFrame()
		return err
	}); err != nil {
		return nil, err
	}
	return executeReply(id, frame)
}

// keptFrame bounds the request buffer a worker's host keeps between calls.
const keptFrame = 1 << 20

// executeFrame appends the Request frame of id that executes payload on rung. The rung is
// appended to the Execute's fields: of a scalar field encoded twice the last is the value
// (protocolbuffers/protobuf docs/encoding, "Last One Wins"), whatever rung the payload holds.
func executeFrame(b []byte, id uint64, rung int, payload []byte) []byte {
	r := uint64(uint32(rung))
	b = protowire.AppendVarint(protowire.AppendTag(b, requestID, protowire.VarintType), id)
	b = protowire.AppendTag(b, requestExecute, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(len(payload)+protowire.SizeTag(executeRung)+protowire.SizeVarint(r)))
	b = append(b, payload...)
	return protowire.AppendVarint(protowire.AppendTag(b, executeRung, protowire.VarintType), r)
}

// executeReply is the Reply of the Response frame answering request id, copied out of the
// frame (the reader's, reused by its next read). Only a frame of an id and one reply is cut so;
// any other (an Error: the worker's refusal; a field twice, unknown or of another type) is
// decoded whole and answered as call answers it.
func executeReply(id uint64, frame []byte) ([]byte, error) {
	if gotID, reply, ok := cutReply(frame); ok {
		if gotID != id {
			return nil, fmt.Errorf("%w: reply %d to request %d", errFault, gotID, id)
		}
		return bytes.Clone(reply), nil
	}
	resp := &pb.Response{}
	if err := proto.Unmarshal(frame, resp); err != nil {
		return nil, fmt.Errorf("%w: %w: %v", errFault, protocol.ErrMalformed, err)
	}
	if _, err := answerTo(id, resp); err != nil {
		return nil, err
	}
	if reply := resp.GetReply(); reply != nil {
		return proto.Marshal(reply)
	}
	return nil, fmt.Errorf("%w: execute answered with %v", errFault, resp)
}

// cutReply finds the id and the one reply of a frame that holds nothing else.
func cutReply(frame []byte) (id uint64, reply []byte, ok bool) {
	for b := frame; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, nil, false
		}
		b = b[n:]
		switch {
		case num == responseID && typ == protowire.VarintType:
			id, n = protowire.ConsumeVarint(b)
		case num == responseReply && typ == protowire.BytesType && reply == nil:
			reply, n = protowire.ConsumeBytes(b)
			if reply == nil {
				reply = []byte{} // an empty reply is a reply
			}
		default:
			return 0, nil, false
		}
		if n < 0 {
			return 0, nil, false
		}
		b = b[n:]
	}
	return id, reply, reply != nil
}

// wellFormed checks that payload is a sequence of well-formed protobuf fields, as an encoded
// Execute is, without decoding it: the worker decodes it.
func wellFormed(payload []byte) error {
	for b := payload; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
	}
	return nil
}
