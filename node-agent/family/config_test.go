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

package family_test

import (
	"strings"
	"testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/family"
)

// Abridged from the published config.json of each catalog model.
const (
	gteModernBERTConfig = `{"architectures": ["ModernBertModel"], "model_type": "modernbert", "hidden_size": 768, "intermediate_size": 1152,
		"num_hidden_layers": 22, "num_attention_heads": 12, "vocab_size": 50368, "norm_eps": 1e-05, "norm_bias": false,
		"global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "global_attn_every_n_layers": 3, "local_attention": 128,
		"hidden_activation": "gelu", "attention_bias": false, "mlp_bias": false, "max_position_embeddings": 8192}`
	qwen3EmbeddingConfig = `{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
		"num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151669,
		"rms_norm_eps": 1e-06, "rope_theta": 1000000, "rope_scaling": null, "hidden_act": "silu", "attention_bias": false, "use_sliding_window": false,
		"tie_word_embeddings": true, "torch_dtype": "bfloat16"}`
)

func TestTheCatalogModelsConfigsAreRead(t *testing.T) {
	c, err := family.ParseConfig([]byte(gteModernBERTConfig), "")
	if err != nil {
		t.Fatal(err)
	}
	want := family.Config{Kind: family.ModernBERT, Hidden: 768, Intermediate: 1152, Layers: 22, Heads: 12, KVHeads: 12, HeadDim: 64, Vocab: 50368,
		NormEps: 1e-5, RoPETheta: 160000, LocalRoPETheta: 10000, GlobalEvery: 3, LocalWindow: 128, Pooling: family.PoolCLS}
	if c != want {
		t.Fatalf("gte-modernbert-base: %+v, want %+v", c, want)
	}
	c, err = family.ParseConfig([]byte(qwen3EmbeddingConfig), "")
	if err != nil {
		t.Fatal(err)
	}
	want = family.Config{Kind: family.Qwen3, Hidden: 1024, Intermediate: 3072, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128, Vocab: 151669,
		NormEps: 1e-6, RoPETheta: 1e6, Pooling: family.PoolLast}
	if c != want {
		t.Fatalf("qwen3-embedding-0.6b: %+v, want %+v", c, want)
	}
}

func TestAConfigTheProgramsWouldNotReproduceIsRefusedByName(t *testing.T) {
	for name, tc := range map[string]struct{ doc, want string }{
		"another family":   {`{"model_type": "llama"}`, "not a catalog family"},
		"biases":           {strings.Replace(qwen3EmbeddingConfig, `"attention_bias": false`, `"attention_bias": true`, 1), "biases"},
		"rope scaling":     {strings.Replace(qwen3EmbeddingConfig, `"rope_scaling": null`, `"rope_scaling": {"type": "yarn"}`, 1), "rope_scaling"},
		"activation":       {strings.Replace(gteModernBERTConfig, `"hidden_activation": "gelu"`, `"hidden_activation": "relu"`, 1), "hidden_activation"},
		"norm bias":        {strings.Replace(gteModernBERTConfig, `"norm_bias": false`, `"norm_bias": true`, 1), "norm_bias"},
		"odd local window": {strings.Replace(gteModernBERTConfig, `"local_attention": 128`, `"local_attention": 127`, 1), "local_attention"},
		"sliding window":   {strings.Replace(qwen3EmbeddingConfig, `"use_sliding_window": false`, `"use_sliding_window": true`, 1), "use_sliding_window"},
		"not JSON":         {`{`, "config.json"},
	} {
		if _, err := family.ParseConfig([]byte(tc.doc), ""); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %s", name, err, tc.want)
		}
	}
}
