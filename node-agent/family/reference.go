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

package family

import (
	"fmt"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// Reference is the CPU reference forward pass at one sequence length: the embedding lookup,
// every layer's program evaluated on the CPU exactly as it is compiled, and the pooling. It is
// the parity oracle for an artifact's goldens and the CPU side of the placement probe.
type Reference struct {
	c      Config
	seq    int
	embed  *Embedder
	layers []*mil.Graph
	outs   []mil.Value
}

// NewReference builds the model's layers at sequence length seq.
func NewReference(c Config, w Weights, seq int) (*Reference, error) {
	e, err := NewEmbedder(c, w)
	if err != nil {
		return nil, err
	}
	r := &Reference{c: c, seq: seq, embed: e}
	for i := range c.Layers {
		g, y, err := Layer(c, i, seq, w)
		if err != nil {
			return nil, err
		}
		r.layers, r.outs = append(r.layers, g), append(r.outs, y)
	}
	return r, nil
}

// Program is layer i's program, as the artifact stores it.
func (r *Reference) Program(i int) (mil.Program, error) { return r.layers[i].Program(r.outs[i]) }

// Forward embeds one input of tokens, every activation rounded to fp16 as on the device.
func (r *Reference) Forward(tokens []int32) ([]float32, error) { return r.forward(tokens, false) }

// ForwardExact embeds it with the same fp16 weights but float32 activations: what the
// conversion's parity gate compares Forward with.
func (r *Reference) ForwardExact(tokens []int32) ([]float32, error) { return r.forward(tokens, true) }

// Seq is the sequence length the reference was built at.
func (r *Reference) Seq() int { return r.seq }

func (r *Reference) forward(tokens []int32, exact bool) ([]float32, error) {
	x, err := r.embed.Input(tokens, r.seq)
	if err != nil {
		return nil, err
	}
	mask := KeyMask(len(tokens), r.seq)
	for i, g := range r.layers {
		eval := g.EvalMasked
		if exact {
			eval = g.EvalExact
		}
		if x, err = eval(x, mask, r.outs[i]); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	return Pool(r.c, x, len(tokens), r.seq), nil
}
