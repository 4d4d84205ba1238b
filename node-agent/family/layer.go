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

// Weights gives a checkpoint's tensors by their Hugging Face names (without the "model."
// prefix a task head adds), as float32 in row-major order, checking the shape.
type Weights interface {
	Tensor(name string, shape ...int) ([]float32, error)
}

// Layer builds layer i of the model at sequence length seq: its program takes the hidden
// states x [1, Hidden, 1, seq] and the key mask, and returns the next hidden states (after
// the final norm, for the last layer).
func Layer(c Config, i, seq int, w Weights) (*mil.Graph, mil.Value, error) {
	return layer(c, i, seq, w, mil.NewGraph)
}

// OriginalLayer is Layer built with mil.NewOriginalGraph: the same program, whose EvalOriginal
// uses w's values as they are (the checkpoint's precision), for the conversion's parity gate.
func OriginalLayer(c Config, i, seq int, w Weights) (*mil.Graph, mil.Value, error) {
	return layer(c, i, seq, w, mil.NewOriginalGraph)
}

func layer(c Config, i, seq int, w Weights, newGraph func(channels, seq int) (*mil.Graph, mil.Value)) (*mil.Graph, mil.Value, error) {
	if i < 0 || i >= c.Layers {
		return nil, mil.Value{}, fmt.Errorf("layer %d of a %d-layer model", i, c.Layers)
	}
	t := tensors{w: w, prefix: fmt.Sprintf("layers.%d.", i), last: i == c.Layers-1}
	g, x := newGraph(c.Hidden, seq)
	mask := g.Mask()
	var y mil.Value
	switch c.Kind {
	case ModernBERT:
		y = modernBERTLayer(c, i, g, x, mask, &t)
	case Qwen3:
		y = qwen3Layer(c, g, x, mask, &t)
	default:
		return nil, mil.Value{}, fmt.Errorf("no family %q", c.Kind)
	}
	if t.err != nil {
		return nil, mil.Value{}, fmt.Errorf("layer %d: %w", i, t.err)
	}
	return g, y, nil
}

// modernBERTLayer: pre-norm attention (layer 0 has no attention norm: the embeddings' norm
// precedes it) with a fused QKV projection, global layers every GlobalEvery with their own
// rotary base and local layers over a window; then a GeGLU MLP; LayerNorms without bias.
func modernBERTLayer(c Config, i int, g *mil.Graph, x, mask mil.Value, t *tensors) mil.Value {
	h := c.Hidden
	in := x
	if i > 0 {
		in = g.LayerNorm("attn_norm", x, t.get("attn_norm.weight", h), c.NormEps)
	}
	qkv := g.Linear("attn_wqkv", in, 3*h, t.get("attn.Wqkv.weight", 3*h, h))
	a := mil.Attention{Heads: c.Heads, KVHeads: c.Heads, HeadDim: c.HeadDim, RoPETheta: c.RoPETheta}
	if i%c.GlobalEvery != 0 {
		a.RoPETheta, a.Window = c.LocalRoPETheta, c.LocalWindow
	}
	// The fused projection's thirds are named for it: the attention's own steps are
	// attn_..., and a program must never declare a name twice.
	att := g.Attention("attn", g.Slice("qkv_q", qkv, 0, h), g.Slice("qkv_k", qkv, h, 2*h), g.Slice("qkv_v", qkv, 2*h, 3*h), mask, a)
	x = g.Add("attn_residual", x, g.Linear("attn_wo", att, h, t.get("attn.Wo.weight", h, h)))
	n := g.LayerNorm("mlp_norm", x, t.get("mlp_norm.weight", h), c.NormEps)
	wi := g.Linear("mlp_wi", n, 2*c.Intermediate, t.get("mlp.Wi.weight", 2*c.Intermediate, h))
	act := g.Mul("mlp_act", g.GELUExact("mlp_gelu", g.Slice("mlp_input", wi, 0, c.Intermediate)), g.Slice("mlp_gate", wi, c.Intermediate, 2*c.Intermediate))
	x = g.Add("mlp_residual", x, downProjection(g, "mlp_wo", act, h, t.get("mlp.Wo.weight", h, c.Intermediate)))
	if t.last {
		x = g.LayerNorm("final_norm", x, t.top("final_norm.weight", h), c.NormEps)
	}
	return x
}

// qwen3Layer: RMSNorm, grouped-query causal attention with per-head q and k norms and the
// rotary embedding, a SwiGLU MLP.
func qwen3Layer(c Config, g *mil.Graph, x, mask mil.Value, t *tensors) mil.Value {
	h, qd, kvd := c.Hidden, c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	n := g.RMSNorm("input_norm", x, t.get("input_layernorm.weight", h), c.NormEps)
	q := g.Linear("attn_q_proj", n, qd, t.get("self_attn.q_proj.weight", qd, h))
	k := g.Linear("attn_k_proj", n, kvd, t.get("self_attn.k_proj.weight", kvd, h))
	v := g.Linear("attn_v_proj", n, kvd, t.get("self_attn.v_proj.weight", kvd, h))
	att := g.Attention("attn", q, k, v, mask, mil.Attention{Heads: c.Heads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, RoPETheta: c.RoPETheta,
		QNorm: t.get("self_attn.q_norm.weight", c.HeadDim), KNorm: t.get("self_attn.k_norm.weight", c.HeadDim), NormEps: c.NormEps, Causal: true})
	x = g.Add("attn_residual", x, g.Linear("attn_o_proj", att, h, t.get("self_attn.o_proj.weight", h, qd)))
	n = g.RMSNorm("post_attn_norm", x, t.get("post_attention_layernorm.weight", h), c.NormEps)
	gate := g.SiLU("mlp_silu", g.Linear("mlp_gate_proj", n, c.Intermediate, t.get("mlp.gate_proj.weight", c.Intermediate, h)))
	up := g.Linear("mlp_up_proj", n, c.Intermediate, t.get("mlp.up_proj.weight", c.Intermediate, h))
	x = g.Add("mlp_residual", x, downProjection(g, "mlp_down_proj", g.Mul("mlp_act", gate, up), h, t.get("mlp.down_proj.weight", h, c.Intermediate)))
	if t.last {
		x = g.RMSNorm("final_norm", x, t.top("norm.weight", h), c.NormEps)
	}
	return x
}

// tensors reads one layer's tensors, keeping the first error.
type tensors struct {
	w      Weights
	prefix string
	last   bool
	err    error
}

func (t *tensors) get(name string, shape ...int) []float32 { return t.top(t.prefix+name, shape...) }

func (t *tensors) top(name string, shape ...int) []float32 {
	if t.err != nil {
		return nil
	}
	v, err := t.w.Tensor(name, shape...)
	if err != nil {
		t.err = err
		return make([]float32, product(shape))
	}
	return v
}

func product(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// downScale divides the MLP's activation before its down projection and multiplies the result
// back: the projection sums thousands of products, and the accumulator of a trained model's
// down projection passes fp16's 65,504 (maderix/h3.c-ane h3_ane_block.m: "a power-of-two
// pre/post scale keeps every partial sum in range", by 1/16). A power of two loses nothing but
// the activations below 2^-10, which fp16 holds only as subnormals anyway.
const downScale = 16

// downProjection is the MLP's down projection, scaled by downScale around the convolution.
func downProjection(g *mil.Graph, name string, act mil.Value, out int, w []float32) mil.Value {
	scaled := g.Scale(name+"_in", act, 1.0/downScale)
	return g.Scale(name+"_out", g.Linear(name, scaled, out, w), downScale)
}
