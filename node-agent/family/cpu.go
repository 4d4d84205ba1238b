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
	"math"

	"github.com/x448/float16"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// Embedder is the part before the first layer, on the CPU: the token-embedding lookup (and,
// for ModernBERT, the embeddings' LayerNorm).
type Embedder struct {
	c     Config
	table []float32
	norm  []float32
}

// NewEmbedder reads the embedding table (and norm) from w.
func NewEmbedder(c Config, w Weights) (*Embedder, error) {
	e := &Embedder{c: c}
	var err error
	switch c.Kind {
	case ModernBERT:
		if e.table, err = w.Tensor("embeddings.tok_embeddings.weight", c.Vocab, c.Hidden); err != nil {
			return nil, err
		}
		if e.norm, err = w.Tensor("embeddings.norm.weight", c.Hidden); err != nil {
			return nil, err
		}
	case Qwen3:
		if e.table, err = w.Tensor("embed_tokens.weight", c.Vocab, c.Hidden); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("no family %q", c.Kind)
	}
	return e, nil
}

// Table is the embedding table, [Vocab, Hidden] row-major, rounded to fp16.
func (e *Embedder) Table() []float32 { return e.table }

// Input is the first layer's input for tokens at sequence length seq: [Hidden * seq],
// channel-major, fp16 values, zero past the tokens.
func (e *Embedder) Input(tokens []int32, seq int) ([]float32, error) {
	return e.input(tokens, seq, fp16)
}

// InputOriginal is Input with the table's values and the result as they are (the checkpoint's
// precision), for the conversion's parity gate.
func (e *Embedder) InputOriginal(tokens []int32, seq int) ([]float32, error) {
	return e.input(tokens, seq, func(v float32) float32 { return v })
}

func (e *Embedder) input(tokens []int32, seq int, round func(float32) float32) ([]float32, error) {
	c := e.c
	if len(tokens) == 0 || len(tokens) > seq {
		return nil, fmt.Errorf("%d tokens for a sequence of %d", len(tokens), seq)
	}
	x := make([]float32, c.Hidden*seq)
	row := make([]float64, c.Hidden)
	for s, tok := range tokens {
		if tok < 0 || int(tok) >= c.Vocab {
			return nil, fmt.Errorf("token %d is outside the vocabulary of %d", tok, c.Vocab)
		}
		for i := range c.Hidden {
			row[i] = float64(round(e.table[int(tok)*c.Hidden+i]))
		}
		if e.norm != nil {
			var mean, sq float64
			for _, v := range row {
				mean += v
			}
			mean /= float64(c.Hidden)
			for _, v := range row {
				sq += (v - mean) * (v - mean)
			}
			inv := 1 / math.Sqrt(sq/float64(c.Hidden)+float64(c.NormEps))
			for i, v := range row {
				row[i] = (v - mean) * inv * float64(e.norm[i])
			}
		}
		for i, v := range row {
			x[i*seq+s] = round(float32(v))
		}
	}
	return x, nil
}

// KeyMask is the programs' key mask for n real tokens at sequence length seq.
func KeyMask(n, seq int) []float32 {
	m := make([]float32, seq)
	for s := n; s < seq; s++ {
		m[s] = mil.MaskNegative
	}
	return m
}

// Pool turns the last layer's output ([Hidden * seq], channel-major) for n real tokens into
// the model's embedding, L2-normalised.
func Pool(c Config, hidden []float32, n, seq int) []float32 {
	out := make([]float64, c.Hidden)
	for i := range c.Hidden {
		switch c.Pooling {
		case PoolCLS:
			out[i] = float64(hidden[i*seq])
		case PoolLast:
			out[i] = float64(hidden[i*seq+n-1])
		default:
			for s := range n {
				out[i] += float64(hidden[i*seq+s])
			}
			out[i] /= float64(n)
		}
	}
	var norm float64
	for _, v := range out {
		norm += v * v
	}
	norm = math.Sqrt(norm)
	res := make([]float32, c.Hidden)
	for i, v := range out {
		if norm > 0 {
			v /= norm
		}
		res[i] = float32(v)
	}
	return res
}

func fp16(v float32) float32 { return float16.Fromfloat32(v).Float32() }
