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
// cache identifier. Every program passes Validate, the rules the public references report the
// device's compiler and runtime hold to, before it is returned.
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
//
// Records are laid out as they are added but converted and written only when the file is
// first read, into one buffer of the final size: a full-size layer holds tens of MiB, and
// growing a buffer by copies costs as much again.
type Blob struct {
	buf     []byte
	size    uint64
	count   uint32
	pending []record
}

// record is a tensor added but not yet written.
type record struct {
	meta   uint64
	values []float32
}

// NewBlob returns an empty blob.
func NewBlob() *Blob { return &Blob{size: blobAlign} }

// AddFP16 adds values converted to fp16 (round to nearest even) and returns the offset of their
// metadata record. The blob keeps values until it is written.
func (b *Blob) AddFP16(values []float32) uint64 {
	meta := b.size
	end := meta + blobAlign + uint64(2*len(values))
	if pad := end % blobAlign; pad != 0 {
		end += blobAlign - pad
	}
	b.size, b.count = end, b.count+1
	b.pending = append(b.pending, record{meta: meta, values: values})
	return meta
}

// write converts and writes every pending record.
func (b *Blob) write() {
	if len(b.pending) == 0 && uint64(len(b.buf)) == b.size {
		return
	}
	if uint64(cap(b.buf)) < b.size {
		b.buf = append(make([]byte, 0, b.size), b.buf...)
	}
	b.buf = b.buf[:b.size]
	binary.LittleEndian.PutUint32(b.buf[0:], b.count)
	binary.LittleEndian.PutUint32(b.buf[4:], blobVersion)
	// A chunk at a time through arrays on the stack, with bulk copies in and out: a full-size
	// layer converts millions of values, and per-element work on the heap is what the race
	// detector checks access by access.
	var in [chunk]float32
	var out [2 * chunk]byte
	for _, r := range b.pending {
		dataAt := r.meta + blobAlign
		rec := b.buf[r.meta:dataAt]
		binary.LittleEndian.PutUint32(rec[0:], blobSentinel)
		binary.LittleEndian.PutUint32(rec[4:], DTypeFP16)
		binary.LittleEndian.PutUint64(rec[8:], uint64(2*len(r.values)))
		binary.LittleEndian.PutUint64(rec[16:], dataAt)
		data := b.buf[dataAt:]
		for i := 0; i < len(r.values); i += chunk {
			n := copy(in[:], r.values[i:])
			for j, v := range in[:n] {
				binary.LittleEndian.PutUint16(out[2*j:], float16.Fromfloat32(v).Bits())
			}
			copy(data[2*i:], out[:2*n])
		}
	}
	b.pending = nil
}

// chunk is how many values are converted at a time.
const chunk = 512

// FP16 reads back the n values of the record at meta, as fp16 holds them.
func (b *Blob) FP16(meta uint64, n int) []float32 {
	b.write()
	data := b.buf[meta+blobAlign : meta+blobAlign+uint64(2*n)]
	out := make([]float32, n)
	var in [2 * chunk]byte
	var vals [chunk]float32
	for i := 0; i < n; i += chunk {
		m := copy(in[:], data[2*i:]) / 2
		for j := range m {
			vals[j] = float16.Frombits(binary.LittleEndian.Uint16(in[2*j:])).Float32()
		}
		copy(out[i:], vals[:m])
	}
	return out
}

// Bytes is the blob file.
func (b *Blob) Bytes() []byte {
	b.write()
	return b.buf[:len(b.buf):len(b.buf)]
}
