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
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"

	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
)

// TestAnOlderWorkersFramesLackTheAdditionsAndReadAsAbsent decodes what a worker from before the
// additions sends: LOADED without ane_cached_shapes and ADMITTED without the cache counts. The
// agent sees them absent (nil), not as "no rung cached" or "zero layers compiled".
func TestAnOlderWorkersFramesLackTheAdditionsAndReadAsAbsent(t *testing.T) {
	// ADMITTED as an older worker encodes it: fields 1 to 3 only.
	var old []byte
	old = protowire.AppendTag(old, 1, protowire.VarintType)
	old = protowire.AppendVarint(old, 256)
	old = protowire.AppendTag(old, 2, protowire.VarintType)
	old = protowire.AppendVarint(old, 22)
	admitted := &pb.Admitted{}
	if err := proto.Unmarshal(old, admitted); err != nil {
		t.Fatal(err)
	}
	if admitted.CacheHitLayers != nil || admitted.CompiledLayers != nil || admitted.GetRung() != 256 {
		t.Fatalf("decoded %v: the missing additions must read as absent", admitted)
	}
	loaded := &pb.Loaded{}
	if err := proto.Unmarshal(nil, loaded); err != nil {
		t.Fatal(err)
	}
	if loaded.AneCachedShapes != nil {
		t.Fatal("a LOADED without ane_cached_shapes reads as a cache check that found nothing")
	}
	// And a newer worker that checked and found nothing is told apart from it.
	data, _ := proto.Marshal(&pb.Loaded{AneCachedShapes: &pb.CachedShapes{}})
	if err := proto.Unmarshal(data, loaded); err != nil || loaded.AneCachedShapes == nil {
		t.Fatalf("an empty cache check read as absent (%v)", err)
	}
}

// TestAnOlderAgentIgnoresTheAdditions decodes a newer worker's ADMITTED with the schema an
// older agent was built with (no fields 4 and 5): it reads what it knows and keeps the rest as
// unknown fields, without an error.
func TestAnOlderAgentIgnoresTheAdditions(t *testing.T) {
	u32 := descriptorpb.FieldDescriptorProto_TYPE_UINT32.Enum()
	dbl := descriptorpb.FieldDescriptorProto_TYPE_DOUBLE.Enum()
	opt := descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()
	file, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("old/worker.proto"), Package: proto.String("synapse.worker.v3old"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("Admitted"),
			Field: []*descriptorpb.FieldDescriptorProto{
				{Name: proto.String("rung"), Number: proto.Int32(1), Type: u32, Label: opt, JsonName: proto.String("rung")},
				{Name: proto.String("layers_loaded"), Number: proto.Int32(2), Type: u32, Label: opt, JsonName: proto.String("layersLoaded")},
				{Name: proto.String("total_ms"), Number: proto.Int32(3), Type: dbl, Label: opt, JsonName: proto.String("totalMs")},
			},
		}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	newer, _ := proto.Marshal(&pb.Admitted{Rung: 512, LayersLoaded: 28, TotalMs: 95.3, CacheHitLayers: proto.Uint32(28), CompiledLayers: proto.Uint32(0)})
	old := dynamicpb.NewMessage(file.Messages().ByName("Admitted"))
	if err := proto.Unmarshal(newer, old); err != nil {
		t.Fatalf("an older agent failed on a newer worker's frame: %v", err)
	}
	fields := old.Descriptor().Fields()
	if got := old.Get(fields.ByName("rung")).Uint(); got != 512 {
		t.Fatalf("rung %d, want 512", got)
	}
	if got := old.Get(fields.ByName("layers_loaded")).Uint(); got != 28 {
		t.Fatalf("layers_loaded %d, want 28", got)
	}
	if len(old.GetUnknown()) == 0 {
		t.Fatal("the additions were not kept as unknown fields")
	}
}
