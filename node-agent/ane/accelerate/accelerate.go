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

// Package accelerate is the CPU side of the placement probe on a Mac: a layer's matrix work
// through Accelerate's cblas_sgemm, bound with purego (no cgo). The probe compares the
// Neural Engine with a CPU path a user could actually run, as the seed's probe compares it
// with a CPU-only Core ML instance, so that its 0.8 threshold means what the seed means; the
// naive Go reference would flatter the device. Elsewhere Open says there is no Accelerate.
package accelerate

import (
	"errors"
	"fmt"

	"github.com/ck-synapse/synapse-fleet/node-agent/mil"
)

// ErrUnsupported: this system has no Accelerate framework.
var ErrUnsupported = errors.New("Accelerate is a macOS framework")

// The CBLAS enumerations (Accelerate's cblas.h, the reference CBLAS interface).
const (
	rowMajor = 101
	noTrans  = 111
	trans    = 112
)

// checkGEMM checks the operands of C[m×n] = A[m×k]·B[k×n] (B stored n×k when transB).
func checkGEMM(m, n, k int, a, b, c []float32) error {
	if m <= 0 || n <= 0 || k <= 0 || len(a) < m*k || len(b) < k*n || len(c) < m*n {
		return fmt.Errorf("sgemm of %dx%d by %dx%d with %d, %d and %d values", m, k, k, n, len(a), len(b), len(c))
	}
	return nil
}

// Work is a program's matrix products with their operands, ready to run.
type Work struct {
	blas  *BLAS
	steps []step
}

type step struct {
	m       mil.Matmul
	a, b, c []float32
}

// Prepare allocates the operands of a program's matrix products: the weights as the program
// holds them, activations of ones.
func (b *BLAS) Prepare(ms []mil.Matmul) *Work {
	w := &Work{blas: b}
	for _, m := range ms {
		s := step{m: m, a: m.A, b: make([]float32, m.K*m.N), c: make([]float32, m.M*m.N)}
		if s.a == nil {
			s.a = make([]float32, m.M*m.K)
			for i := range s.a {
				s.a[i] = 1
			}
		}
		for i := range s.b {
			s.b[i] = 1
		}
		w.steps = append(w.steps, s)
	}
	return w
}

// Run computes every product once (each Count times).
func (w *Work) Run() error {
	for _, s := range w.steps {
		for range max(s.m.Count, 1) {
			if err := w.blas.SGEMM(false, s.m.TransB, s.m.M, s.m.N, s.m.K, s.a, s.b, s.c); err != nil {
				return err
			}
		}
	}
	return nil
}
