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

package accelerate

import (
	"math"
	"math/rand/v2"
	"testing"
)

func TestOperandsTooSmallForTheProductAreRefused(t *testing.T) {
	for name, c := range map[string]struct{ m, n, k, a, b, c int }{
		"A short":  {4, 4, 4, 15, 16, 16},
		"B short":  {4, 4, 4, 16, 15, 16},
		"C short":  {4, 4, 4, 16, 16, 15},
		"no size":  {0, 4, 4, 16, 16, 16},
		"negative": {4, -1, 4, 16, 16, 16},
	} {
		if err := checkGEMM(c.m, c.n, c.k, make([]float32, c.a), make([]float32, c.b), make([]float32, c.c)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := checkGEMM(4, 4, 4, make([]float32, 16), make([]float32, 16), make([]float32, 16)); err != nil {
		t.Fatal(err)
	}
}

// naive is C = op(A)·op(B), row-major, in float64.
func naive(transA, transB bool, m, n, k int, a, b []float32) []float64 {
	c := make([]float64, m*n)
	for i := range m {
		for j := range n {
			var acc float64
			for p := range k {
				av, bv := a[i*k+p], b[p*n+j]
				if transA {
					av = a[p*m+i]
				}
				if transB {
					bv = b[j*k+p]
				}
				acc += float64(av) * float64(bv)
			}
			c[i*n+j] = acc
		}
	}
	return c
}

// TestSGEMMIsTheMatrixProduct runs on a Mac (elsewhere there is no Accelerate): every
// transpose combination against a float64 product.
func TestSGEMMIsTheMatrixProduct(t *testing.T) {
	b, err := Open()
	if err != nil {
		t.Skipf("no Accelerate: %v", err)
	}
	r := rand.New(rand.NewPCG(3, 4))
	const m, n, k = 37, 64, 19
	a, bm := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = 2*r.Float32() - 1
	}
	for i := range bm {
		bm[i] = 2*r.Float32() - 1
	}
	for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
		c := make([]float32, m*n)
		if err := b.SGEMM(tr[0], tr[1], m, n, k, a, bm, c); err != nil {
			t.Fatal(err)
		}
		want := naive(tr[0], tr[1], m, n, k, a, bm)
		for i := range c {
			if math.Abs(float64(c[i])-want[i]) > 1e-4 {
				t.Fatalf("transposes %v: C[%d] = %v, want %v", tr, i, c[i], want[i])
			}
		}
	}
}

// BenchmarkSGEMM is one full-size projection of Qwen3-Embedding-0.6B at 512 positions (3072 x
// 1024 by 1024 x 512) through Accelerate, checked before it is timed.
func BenchmarkSGEMM(bench *testing.B) {
	b, err := Open()
	if err != nil {
		bench.Skipf("no Accelerate: %v", err)
	}
	const m, n, k = 3072, 512, 1024
	a, bm, c := make([]float32, m*k), make([]float32, k*n), make([]float32, m*n)
	for i := range a {
		a[i] = float32(i%7) / 7
	}
	for i := range bm {
		bm[i] = float32(i%5) / 5
	}
	if err := b.SGEMM(false, false, m, n, k, a, bm, c); err != nil {
		bench.Fatal(err)
	}
	want := naive(false, false, 1, n, k, a, bm) // the first row
	for j := range n {
		if math.Abs(float64(c[j])-want[j]) > 1e-2 {
			bench.Fatalf("C[0][%d] = %v, want %v", j, c[j], want[j])
		}
	}
	for bench.Loop() {
		_ = b.SGEMM(false, false, m, n, k, a, bm, c)
	}
	bench.ReportMetric(2*m*n*k*float64(bench.N)/bench.Elapsed().Seconds()/1e9, "GFLOP/s")
}
