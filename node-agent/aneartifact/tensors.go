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

package aneartifact

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/nlpodyssey/safetensors"
	"github.com/x448/float16"
)

// Tensors is a set of safetensors files, mapped read-only, whose tensors are read by name as
// float32 (from F32, F16 or BF16; any other dtype is refused). It implements family.Weights.
type Tensors struct {
	files  []safetensors.SafeTensors
	maps   [][]byte
	prefix string
}

// OpenTensors maps the files. Prefix, if set, is tried before each name ("model.", which a
// task head adds to a checkpoint's names).
func OpenTensors(prefix string, paths ...string) (*Tensors, error) {
	t := &Tensors{prefix: prefix}
	for _, p := range paths {
		data, err := mapFile(p)
		if err != nil {
			t.Close()
			return nil, err
		}
		t.maps = append(t.maps, data)
		st, err := safetensors.Deserialize(data)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("%s: %w", filepath.Base(p), err)
		}
		t.files = append(t.files, st)
	}
	return t, nil
}

func mapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() < 8 || st.Size() != int64(int(st.Size())) {
		return nil, fmt.Errorf("%s: %d bytes is not a safetensors file", filepath.Base(path), st.Size())
	}
	return syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
}

// Close unmaps the files.
func (t *Tensors) Close() error {
	for _, m := range t.maps {
		_ = syscall.Munmap(m)
	}
	t.maps, t.files = nil, nil
	return nil
}

// Names lists every tensor, without the prefix.
func (t *Tensors) Names() []string {
	var out []string
	for _, f := range t.files {
		for _, n := range f.Names() {
			out = append(out, strings.TrimPrefix(n, t.prefix))
		}
	}
	slices.Sort(out)
	return out
}

// Tensor implements family.Weights.
func (t *Tensors) Tensor(name string, shape ...int) ([]float32, error) {
	for _, f := range t.files {
		for _, n := range []string{t.prefix + name, name} {
			if v, ok := f.Tensor(n); ok {
				return decode(name, v, shape)
			}
		}
	}
	return nil, fmt.Errorf("the checkpoint has no tensor %s", name)
}

func decode(name string, v safetensors.TensorView, shape []int) ([]float32, error) {
	got := v.Shape()
	if len(got) != len(shape) {
		return nil, fmt.Errorf("tensor %s has shape %v, want %v", name, got, shape)
	}
	for i := range got {
		if got[i] != uint64(shape[i]) {
			return nil, fmt.Errorf("tensor %s has shape %v, want %v", name, got, shape)
		}
	}
	data := v.Data()
	var out []float32
	switch v.DType() {
	case safetensors.F32:
		out = make([]float32, len(data)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case safetensors.F16:
		out = make([]float32, len(data)/2)
		for i := range out {
			out[i] = float16.Frombits(binary.LittleEndian.Uint16(data[2*i:])).Float32()
		}
	case safetensors.BF16:
		out = make([]float32, len(data)/2)
		for i := range out {
			out[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(data[2*i:])) << 16)
		}
	default:
		return nil, fmt.Errorf("tensor %s is %s; only F32, F16 and BF16 convert", name, v.DType())
	}
	for i, x := range out {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			return nil, fmt.Errorf("tensor %s holds %v at %d", name, x, i)
		}
	}
	return out, nil
}

// WriteFP16 writes tensors (name to values and shape) as one F16 safetensors file.
func WriteFP16(path string, tensors map[string]Tensor) error {
	return Write(path, safetensors.F16, tensors)
}

// Write writes tensors as one safetensors file of dtype F16, BF16 (truncating, as a checkpoint
// cast by dropping the low half would hold them) or F32.
func Write(path string, dtype safetensors.DType, tensors map[string]Tensor) error {
	views := map[string]safetensors.TensorView{}
	for name, t := range tensors {
		var data []byte
		switch dtype {
		case safetensors.F16:
			data = make([]byte, 2*len(t.Values))
			for i, x := range t.Values {
				binary.LittleEndian.PutUint16(data[2*i:], float16.Fromfloat32(x).Bits())
			}
		case safetensors.BF16:
			data = make([]byte, 2*len(t.Values))
			for i, x := range t.Values {
				binary.LittleEndian.PutUint16(data[2*i:], uint16(math.Float32bits(x)>>16))
			}
		case safetensors.F32:
			data = make([]byte, 4*len(t.Values))
			for i, x := range t.Values {
				binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(x))
			}
		default:
			return fmt.Errorf("tensor %s: dtype %s is not written", name, dtype)
		}
		shape := make([]uint64, len(t.Shape))
		for i, d := range t.Shape {
			shape[i] = uint64(d)
		}
		v, err := safetensors.NewTensorView(dtype, shape, data)
		if err != nil {
			return fmt.Errorf("tensor %s: %w", name, err)
		}
		views[name] = v
	}
	data, err := safetensors.Serialize(views, nil)
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// Tensor is values of a shape.
type Tensor struct {
	Values []float32
	Shape  []int
}
