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

// Package family describes the two catalog model families, a ModernBERT-style encoder and a
// Qwen3 decoder stack used for embeddings: their configuration, their per-layer programs (as
// mil graphs, whose CPU evaluation is the reference forward pass) and the parts that stay on
// the CPU, the token-embedding lookup and the pooling.
package family

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Kind names a family.
type Kind string

const (
	ModernBERT Kind = "modernbert"
	Qwen3      Kind = "qwen3"
)

// Pooling turns the last layer's hidden states into one vector.
type Pooling string

const (
	// PoolCLS takes the first token's state (gte-modernbert).
	PoolCLS Pooling = "cls"
	// PoolMean averages the real tokens' states.
	PoolMean Pooling = "mean"
	// PoolLast takes the last real token's state (Qwen3-Embedding, whose input ends with the
	// end-of-text token).
	PoolLast Pooling = "last"
)

// Config is what the per-layer programs need of a checkpoint's config.json.
type Config struct {
	Kind                           Kind
	Hidden, Intermediate, Layers   int
	Heads, KVHeads, HeadDim, Vocab int
	NormEps                        float32
	RoPETheta                      float64
	LocalRoPETheta                 float64
	GlobalEvery, LocalWindow       int
	Pooling                        Pooling
}

// hfConfig is the subset of a Hugging Face config.json the two families use.
type hfConfig struct {
	ModelType              string          `json:"model_type"`
	HiddenSize             int             `json:"hidden_size"`
	IntermediateSize       int             `json:"intermediate_size"`
	NumHiddenLayers        int             `json:"num_hidden_layers"`
	NumAttentionHeads      int             `json:"num_attention_heads"`
	NumKeyValueHeads       int             `json:"num_key_value_heads"`
	HeadDim                int             `json:"head_dim"`
	VocabSize              int             `json:"vocab_size"`
	NormEps                *float64        `json:"norm_eps"`
	RMSNormEps             *float64        `json:"rms_norm_eps"`
	RoPETheta              float64         `json:"rope_theta"`
	GlobalRoPETheta        float64         `json:"global_rope_theta"`
	LocalRoPETheta         float64         `json:"local_rope_theta"`
	GlobalAttnEveryNLayers int             `json:"global_attn_every_n_layers"`
	LocalAttention         int             `json:"local_attention"`
	HiddenActivation       string          `json:"hidden_activation"`
	HiddenAct              string          `json:"hidden_act"`
	NormBias               *bool           `json:"norm_bias"`
	AttentionBias          *bool           `json:"attention_bias"`
	MLPBias                *bool           `json:"mlp_bias"`
	RoPEScaling            json.RawMessage `json:"rope_scaling"`
	UseSlidingWindow       *bool           `json:"use_sliding_window"`
}

// ParseConfig reads a checkpoint's config.json. Anything the per-layer programs would not
// reproduce (biases, another activation, rope scaling) is refused by name rather than
// converted into a different model.
func ParseConfig(data []byte, pooling Pooling) (Config, error) {
	var h hfConfig
	if err := json.Unmarshal(data, &h); err != nil {
		return Config{}, fmt.Errorf("config.json: %w", err)
	}
	c := Config{Hidden: h.HiddenSize, Intermediate: h.IntermediateSize, Layers: h.NumHiddenLayers, Heads: h.NumAttentionHeads,
		Vocab: h.VocabSize, Pooling: pooling}
	var unsupported []string
	switch strings.ToLower(h.ModelType) {
	case "modernbert":
		c.Kind, c.KVHeads, c.RoPETheta, c.LocalRoPETheta = ModernBERT, h.NumAttentionHeads, h.GlobalRoPETheta, h.LocalRoPETheta
		c.GlobalEvery, c.LocalWindow = h.GlobalAttnEveryNLayers, h.LocalAttention
		if h.NumAttentionHeads > 0 {
			c.HeadDim = h.HiddenSize / h.NumAttentionHeads
		}
		if h.NormEps != nil {
			c.NormEps = float32(*h.NormEps)
		}
		if h.HiddenActivation != "gelu" {
			unsupported = append(unsupported, fmt.Sprintf("hidden_activation %q (only gelu)", h.HiddenActivation))
		}
		if h.NormBias == nil || *h.NormBias {
			unsupported = append(unsupported, "norm_bias true or unset (only false)")
		}
		if c.Pooling == "" {
			c.Pooling = PoolCLS
		}
	case "qwen3":
		c.Kind, c.KVHeads, c.HeadDim, c.RoPETheta = Qwen3, h.NumKeyValueHeads, h.HeadDim, h.RoPETheta
		if h.RMSNormEps != nil {
			c.NormEps = float32(*h.RMSNormEps)
		}
		if h.HiddenAct != "silu" {
			unsupported = append(unsupported, fmt.Sprintf("hidden_act %q (only silu)", h.HiddenAct))
		}
		if c.Pooling == "" {
			c.Pooling = PoolLast
		}
	default:
		return Config{}, fmt.Errorf("config.json: model_type %q is not a catalog family (modernbert, qwen3)", h.ModelType)
	}
	if h.AttentionBias != nil && *h.AttentionBias || h.MLPBias != nil && *h.MLPBias {
		unsupported = append(unsupported, "attention or MLP biases")
	}
	if h.UseSlidingWindow != nil && *h.UseSlidingWindow {
		unsupported = append(unsupported, "use_sliding_window")
	}
	if len(h.RoPEScaling) > 0 && string(h.RoPEScaling) != "null" {
		unsupported = append(unsupported, "rope_scaling")
	}
	if len(unsupported) > 0 {
		return Config{}, fmt.Errorf("config.json: the %s family's programs do not reproduce %s", c.Kind, strings.Join(unsupported, ", "))
	}
	return c, c.Validate()
}

// Validate checks the sizes the programs are built from.
func (c Config) Validate() error {
	switch {
	case c.Hidden <= 0 || c.Intermediate <= 0 || c.Layers <= 0 || c.Vocab <= 0:
		return fmt.Errorf("the %s config needs positive hidden, intermediate, layer and vocabulary sizes", c.Kind)
	case c.Heads <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 || c.Heads%c.KVHeads != 0 || c.HeadDim%2 != 0:
		return fmt.Errorf("the %s config's attention (%d heads, %d key/value heads of %d dimensions) is not one the programs build", c.Kind, c.Heads, c.KVHeads, c.HeadDim)
	case c.Kind == ModernBERT && c.Heads*c.HeadDim != c.Hidden:
		return fmt.Errorf("a modernbert config's heads must span the hidden size")
	case c.Kind == ModernBERT && (c.GlobalEvery <= 0 || c.LocalWindow <= 0 || c.LocalWindow%2 != 0 || c.LocalRoPETheta <= 0):
		return fmt.Errorf("a modernbert config needs global_attn_every_n_layers, an even local_attention and local_rope_theta")
	case c.RoPETheta <= 0 || c.NormEps <= 0:
		return fmt.Errorf("the %s config needs a rope theta and a norm epsilon", c.Kind)
	case c.Pooling != PoolCLS && c.Pooling != PoolMean && c.Pooling != PoolLast:
		return fmt.Errorf("pooling %q is not cls, mean or last", c.Pooling)
	}
	return nil
}
