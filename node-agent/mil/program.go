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
)

// Program is one compilable unit: its MIL text and its weights file, with the names and
// shapes of its inputs and output (the text declares them too; they are here so a binding
// can match the device's symbols by name without parsing the text).
type Program struct {
	Text    string
	Weights []byte
	// Inputs are the function's inputs in the order the text declares them, which is
	// ascending name order (see Validate).
	Inputs []Port
	Output Port
}

// Port is one input or output of a program: a [1, Channels, 1, Seq] fp16 tensor.
type Port struct {
	Name          string
	Channels, Seq int
}

// Values is how many fp16 values the port holds.
func (p Port) Values() int { return p.Channels * p.Seq }

// Input returns the input named name.
func (p Program) Input(name string) (Port, bool) {
	for _, in := range p.Inputs {
		if in.Name == name {
			return in, true
		}
	}
	return Port{}, false
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

// Program emits the layer.
func (l Linear) Program() (Program, error) {
	g, x := NewGraph(l.In, l.Seq)
	return g.Program(g.Linear("y", x, l.Out, l.Weights))
}
