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

package mil

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// Program is one compilable unit: its MIL text and its weights file.
type Program struct {
	Text    string
	Weights []byte
}

// Digest identifies the program's sources on our side: equal programs, equal digests. (aned
// computes its own identifier from the same bytes.)
func (p Program) Digest() string {
	h := sha256.New()
	fmt.Fprintf(h, "mil %d\n", len(p.Text))
	h.Write([]byte(p.Text))
	fmt.Fprintf(h, "weights %d\n", len(p.Weights))
	h.Write(p.Weights)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// Linear is one linear layer, y = W x, as a 1x1 convolution over a [1, In, 1, Seq] fp16
// tensor (channel-major), giving [1, Out, 1, Seq]. Weights are Out rows of In values.
type Linear struct {
	In, Out, Seq int
	Weights      []float32
}

// Program emits the layer: constants in a fixed order, every operation named.
func (l Linear) Program() (Program, error) {
	if l.In <= 0 || l.Out <= 0 || l.Seq <= 0 {
		return Program{}, fmt.Errorf("a linear layer needs positive sizes, got in %d, out %d, seq %d", l.In, l.Out, l.Seq)
	}
	if l.Seq%64 != 0 {
		return Program{}, fmt.Errorf("the sequence length %d is not a multiple of 64, as Neural Engine tensors need", l.Seq)
	}
	if len(l.Weights) != l.In*l.Out {
		return Program{}, fmt.Errorf("%d weights for a %dx%d layer", len(l.Weights), l.Out, l.In)
	}
	blob := NewBlob()
	w := blob.AddFP16(l.Weights)
	var b strings.Builder
	b.WriteString("program(1.3)\n{\n")
	fmt.Fprintf(&b, "    func main<ios18>(tensor<fp16, [1, %d, 1, %d]> x) {\n", l.In, l.Seq)
	for _, c := range []string{
		`string pad_type = const()[name = string("pad_type"), val = string("valid")];`,
		`tensor<int32, [2]> strides = const()[name = string("strides"), val = tensor<int32, [2]>([1, 1])];`,
		`tensor<int32, [4]> pad = const()[name = string("pad"), val = tensor<int32, [4]>([0, 0, 0, 0])];`,
		`tensor<int32, [2]> dilations = const()[name = string("dilations"), val = tensor<int32, [2]>([1, 1])];`,
		`int32 groups = const()[name = string("groups"), val = int32(1)];`,
		fmt.Sprintf(`tensor<fp16, [%d, %d, 1, 1]> weight = const()[name = string("weight"), val = tensor<fp16, [%d, %d, 1, 1]>(BLOBFILE(path = string("%s"), offset = uint64(%d)))];`,
			l.Out, l.In, l.Out, l.In, BlobPath, w),
		fmt.Sprintf(`tensor<fp16, [1, %d, 1, %d]> y = conv(dilations = dilations, groups = groups, pad = pad, pad_type = pad_type, strides = strides, weight = weight, x = x)[name = string("y")];`,
			l.Out, l.Seq),
	} {
		b.WriteString("        " + c + "\n")
	}
	b.WriteString("    } -> (y);\n}\n")
	return Program{Text: b.String(), Weights: blob.Bytes()}, nil
}
