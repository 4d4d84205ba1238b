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
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// lazyWeights makes each tensor on request, random and fixed by its name, so one layer of a
// full-size model can be built without the whole checkpoint in memory.
type lazyWeights struct{}

func (lazyWeights) Tensor(name string, shape ...int) ([]float32, error) {
	h := fnv.New64a()
	h.Write([]byte(name))
	r := rand.New(rand.NewPCG(h.Sum64(), 1))
	n := product(shape)
	v := make([]float32, n)
	scale := 1 / math.Sqrt(float64(shape[len(shape)-1]))
	if len(shape) == 1 {
		for i := range v {
			v[i] = float32(1 + 0.1*(2*r.Float64()-1))
		}
		return v, nil
	}
	for i := range v {
		v[i] = float32(scale * (2*r.Float64() - 1))
	}
	return v, nil
}

// BenchmarkCPUReferenceLayer evaluates one full-size layer of each catalog model on the CPU:
// what the placement probe's CPU side and the conversion's goldens cost per layer. It reports
// the layer's MIL and weight sizes too.
func BenchmarkCPUReferenceLayer(b *testing.B) {
	gte, _ := family.ParseConfig([]byte(gteModernBERTConfig), "")
	qwen, _ := family.ParseConfig([]byte(qwen3EmbeddingConfig), "")
	for _, tc := range []struct {
		name  string
		c     family.Config
		layer int
		seq   int
	}{
		{"gte-modernbert-base/local/128", gte, 1, 128},
		{"gte-modernbert-base/global/128", gte, 0, 128},
		{"gte-modernbert-base/global/512", gte, 0, 512},
		{"qwen3-embedding-0.6b/128", qwen, 1, 128},
	} {
		b.Run(tc.name, func(b *testing.B) {
			g, y, err := family.Layer(tc.c, tc.layer, tc.seq, lazyWeights{})
			if err != nil {
				b.Fatal(err)
			}
			p, err := g.Program(y)
			if err != nil {
				b.Fatal(err)
			}
			x := make([]float32, tc.c.Hidden*tc.seq)
			for i := range x {
				x[i] = float32(math.Sin(float64(i)))
			}
			mask := family.KeyMask(tc.seq*3/4, tc.seq)
			b.ResetTimer()
			for b.Loop() {
				if _, err := g.EvalMasked(x, mask, y); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(p.Text)), "mil-bytes")
			b.ReportMetric(float64(len(p.Weights))/(1<<20), "weights-MiB")
		})
	}
}

// BenchmarkEmitLayer emits one full-size layer's program (text, weights blob, validation):
// what an admission pays per layer to re-emit a program and check it against the artifact's
// digests. It checks the program passes the validator before timing.
func BenchmarkEmitLayer(b *testing.B) {
	gte, _ := family.ParseConfig([]byte(gteModernBERTConfig), "")
	qwen, _ := family.ParseConfig([]byte(qwen3EmbeddingConfig), "")
	for _, tc := range []struct {
		name string
		c    family.Config
		seq  int
	}{{"gte-modernbert-base/local/512", gte, 512}, {"qwen3-embedding-0.6b/512", qwen, 512}} {
		b.Run(tc.name, func(b *testing.B) {
			w := &zeroWeights{}
			emit := func() mil.Program {
				g, y, err := family.Layer(tc.c, 1, tc.seq, w)
				if err != nil {
					b.Fatal(err)
				}
				p, err := g.Program(y)
				if err != nil {
					b.Fatal(err)
				}
				return p
			}
			if err := mil.Validate(emit()); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				emit()
			}
		})
	}
}
