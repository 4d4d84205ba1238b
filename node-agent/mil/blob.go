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

// Package mil writes what the Neural Engine compiles: MIL program text and its weights in a
// MILBlob v2 file. It is pure Go and runs everywhere, so its output is tested byte for byte on
// any machine. Equal graphs give equal bytes: constants are emitted in a fixed order, so a
// layer at a shape always has the same text, the same weights file and hence the same aned
// cache identifier.
package mil

import (
	"encoding/binary"

	"github.com/x448/float16"
)

// BlobPath is where a program's weights file is, relative to the model.
const BlobPath = "@model_path/weights/weight.bin"

// Blob data types.
const (
	DTypeFP16  uint32 = 1
	DTypeFP32  uint32 = 2
	DTypeUInt8 uint32 = 3
	DTypeInt8  uint32 = 4
)

const (
	blobVersion  = 2
	blobSentinel = 0xDEADBEEF
	blobAlign    = 64
)

// Blob is a MILBlob v2 weights file: a 64-byte header (count, version), then per tensor a
// 64-byte metadata record (sentinel, dtype, size, absolute data offset) and its data, each
// 64-byte aligned. A program's BLOBFILE offset points at the metadata record.
type Blob struct {
	buf   []byte
	count uint32
}

// NewBlob returns an empty blob.
func NewBlob() *Blob { return &Blob{buf: make([]byte, blobAlign)} }

// AddFP16 appends values converted to fp16 (round to nearest even) and returns the offset of
// their metadata record.
func (b *Blob) AddFP16(values []float32) uint64 {
	data := make([]byte, 2*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint16(data[2*i:], float16.Fromfloat32(v).Bits())
	}
	return b.add(DTypeFP16, data)
}

func (b *Blob) add(dtype uint32, data []byte) uint64 {
	meta := uint64(len(b.buf))
	dataAt := meta + blobAlign
	rec := make([]byte, blobAlign)
	binary.LittleEndian.PutUint32(rec[0:], blobSentinel)
	binary.LittleEndian.PutUint32(rec[4:], dtype)
	binary.LittleEndian.PutUint64(rec[8:], uint64(len(data)))
	binary.LittleEndian.PutUint64(rec[16:], dataAt)
	b.buf = append(b.buf, rec...)
	b.buf = append(b.buf, data...)
	if pad := len(b.buf) % blobAlign; pad != 0 {
		b.buf = append(b.buf, make([]byte, blobAlign-pad)...)
	}
	b.count++
	return meta
}

// Bytes is the blob file.
func (b *Blob) Bytes() []byte {
	out := append([]byte(nil), b.buf...)
	binary.LittleEndian.PutUint32(out[0:], b.count)
	binary.LittleEndian.PutUint32(out[4:], blobVersion)
	return out
}
