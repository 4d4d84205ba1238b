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

// Package tinymodel makes tiny checkpoints of the two catalog families, with random weights:
// a handful of layers, a small vocabulary, written as a Hugging Face checkpoint directory
// (config.json, model.safetensors, tokenizer.json). Tests, the converter's checks and the
// hardware smoke test use them; nothing here is a real model.
package tinymodel

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
)

// Tokenizer is a tiny byte-level BPE tokenizer.json ([CLS] text [SEP]; ids below 22, [UNK] for what it cannot spell) for the
// tiny checkpoints.
//
//go:embed tokenizer.json
var Tokenizer []byte

// ModernBERT is a 3-layer encoder: layer 0 global, layers 1 and 2 local over a window of 4.
func ModernBERT() family.Config {
	return family.Config{Kind: family.ModernBERT, Hidden: 32, Intermediate: 48, Layers: 3, Heads: 4, KVHeads: 4, HeadDim: 8, Vocab: 64,
		NormEps: 1e-5, RoPETheta: 160000, LocalRoPETheta: 10000, GlobalEvery: 3, LocalWindow: 4, Pooling: family.PoolCLS}
}

// Qwen3 is a 3-layer decoder with grouped-query attention and heads wider than the hidden size.
func Qwen3() family.Config {
	return family.Config{Kind: family.Qwen3, Hidden: 32, Intermediate: 48, Layers: 3, Heads: 4, KVHeads: 2, HeadDim: 16, Vocab: 64,
		NormEps: 1e-6, RoPETheta: 1e6, Pooling: family.PoolLast}
}

// Weights gives every tensor the family reads random values, by their Hugging Face names:
// matrices scaled by their fan-in, norms around 1; scale multiplies the token embeddings.
func Weights(c family.Config, seed uint64, scale float64) map[string]aneartifact.Tensor {
	r := rand.New(rand.NewPCG(seed, 11))
	w := map[string]aneartifact.Tensor{}
	mat := func(name string, out, in int, s float64) {
		v := make([]float32, out*in)
		for i := range v {
			v[i] = float32(s / math.Sqrt(float64(in)) * (2*r.Float64() - 1))
		}
		w[name] = aneartifact.Tensor{Values: v, Shape: []int{out, in}}
	}
	norm := func(name string, n int) {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(1 + 0.2*(2*r.Float64()-1))
		}
		w[name] = aneartifact.Tensor{Values: v, Shape: []int{n}}
	}
	h, in := c.Hidden, c.Intermediate
	switch c.Kind {
	case family.ModernBERT:
		mat("embeddings.tok_embeddings.weight", c.Vocab, h, scale)
		norm("embeddings.norm.weight", h)
		for i := range c.Layers {
			p := fmt.Sprintf("layers.%d.", i)
			if i > 0 {
				norm(p+"attn_norm.weight", h)
			}
			mat(p+"attn.Wqkv.weight", 3*h, h, 1)
			mat(p+"attn.Wo.weight", h, h, 1)
			norm(p+"mlp_norm.weight", h)
			mat(p+"mlp.Wi.weight", 2*in, h, 1)
			mat(p+"mlp.Wo.weight", h, in, 1)
		}
		norm("final_norm.weight", h)
	case family.Qwen3:
		mat("embed_tokens.weight", c.Vocab, h, scale)
		qd, kvd := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
		for i := range c.Layers {
			p := fmt.Sprintf("layers.%d.", i)
			norm(p+"input_layernorm.weight", h)
			mat(p+"self_attn.q_proj.weight", qd, h, 1)
			mat(p+"self_attn.k_proj.weight", kvd, h, 1)
			mat(p+"self_attn.v_proj.weight", kvd, h, 1)
			norm(p+"self_attn.q_norm.weight", c.HeadDim)
			norm(p+"self_attn.k_norm.weight", c.HeadDim)
			mat(p+"self_attn.o_proj.weight", h, qd, 1)
			norm(p+"post_attention_layernorm.weight", h)
			mat(p+"mlp.gate_proj.weight", in, h, 1)
			mat(p+"mlp.up_proj.weight", in, h, 1)
			mat(p+"mlp.down_proj.weight", h, in, 1)
		}
		norm("norm.weight", h)
	}
	return w
}

// Write writes a checkpoint of c with Weights(c, seed, scale) into dir: config.json in the
// Hugging Face form, model.safetensors (names under "model.", as a task head's checkpoint has
// them), the sentence-transformers pipeline that says its pooling (modules.json and
// 1_Pooling/config.json, for c.Pooling) and, if tokenizerJSON is not empty, tokenizer.json.
func Write(dir string, c family.Config, seed uint64, scale float64, tokenizerJSON []byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg := map[string]any{"hidden_size": c.Hidden, "intermediate_size": c.Intermediate, "num_hidden_layers": c.Layers,
		"num_attention_heads": c.Heads, "vocab_size": c.Vocab}
	switch c.Kind {
	case family.ModernBERT:
		cfg["model_type"], cfg["norm_eps"], cfg["global_rope_theta"], cfg["local_rope_theta"] = "modernbert", c.NormEps, c.RoPETheta, c.LocalRoPETheta
		cfg["global_attn_every_n_layers"], cfg["local_attention"], cfg["hidden_activation"], cfg["norm_bias"] = c.GlobalEvery, c.LocalWindow, "gelu", false
	case family.Qwen3:
		cfg["model_type"], cfg["rms_norm_eps"], cfg["rope_theta"], cfg["num_key_value_heads"] = "qwen3", c.NormEps, c.RoPETheta, c.KVHeads
		cfg["head_dim"], cfg["hidden_act"], cfg["attention_bias"], cfg["rope_scaling"] = c.HeadDim, "silu", false, nil
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		return err
	}
	prefixed := map[string]aneartifact.Tensor{}
	for name, t := range Weights(c, seed, scale) {
		prefixed["model."+name] = t
	}
	if err := aneartifact.WriteFP16(filepath.Join(dir, "model.safetensors"), prefixed); err != nil {
		return err
	}
	if err := writePooling(dir, c); err != nil {
		return err
	}
	if len(tokenizerJSON) > 0 {
		return os.WriteFile(filepath.Join(dir, "tokenizer.json"), tokenizerJSON, 0o644)
	}
	return nil
}

// writePooling writes the sentence-transformers pipeline of a checkpoint pooled by c.Pooling:
// the model, its Pooling module, then Normalize.
func writePooling(dir string, c family.Config) error {
	modules := []map[string]any{
		{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
		{"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
		{"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
	}
	pooling := map[string]any{"word_embedding_dimension": c.Hidden,
		"pooling_mode_cls_token": c.Pooling == family.PoolCLS, "pooling_mode_mean_tokens": c.Pooling == family.PoolMean,
		"pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false, "pooling_mode_weightedmean_tokens": false,
		"pooling_mode_lasttoken": c.Pooling == family.PoolLast, "include_prompt": true}
	for path, v := range map[string]any{"modules.json": modules, filepath.Join("1_Pooling", "config.json"): pooling} {
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, path)), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, path), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}
