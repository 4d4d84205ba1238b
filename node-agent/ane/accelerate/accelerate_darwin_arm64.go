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
	"fmt"
	"sync"

	"github.com/ebitengine/purego"
)

// path is the Accelerate framework; cblas_sgemm is re-exported from its vecLib.
const path = "/System/Library/Frameworks/Accelerate.framework/Accelerate"

// BLAS is Accelerate's cblas_sgemm, bound once.
type BLAS struct {
	// sgemm is void cblas_sgemm(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE,
	// int M, int N, int K, float alpha, const float *A, int lda, const float *B, int ldb,
	// float beta, float *C, int ldc): fourteen arguments, four of them on the stack, which
	// purego packs as Darwin's arm64 calling convention does.
	sgemm func(order, transA, transB, m, n, k int32, alpha float32, a *float32, lda int32, b *float32, ldb int32, beta float32, c *float32, ldc int32)
}

var (
	openOnce sync.Once
	opened   *BLAS
	openErr  error
)

// Open loads Accelerate once per process.
func Open() (*BLAS, error) {
	openOnce.Do(func() {
		lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			openErr = fmt.Errorf("%w: loading %s: %v", ErrUnsupported, path, err)
			return
		}
		if _, err := purego.Dlsym(lib, "cblas_sgemm"); err != nil {
			openErr = fmt.Errorf("%w: %s has no cblas_sgemm: %v", ErrUnsupported, path, err)
			return
		}
		b := &BLAS{}
		purego.RegisterLibFunc(&b.sgemm, lib, "cblas_sgemm")
		opened = b
	})
	return opened, openErr
}

// SGEMM computes C[m×n] = op(A)·op(B) in float32, row-major: A is m×k (k×m stored when
// transA), B is k×n (n×k when transB).
func (b *BLAS) SGEMM(transA, transB bool, m, n, k int, a, bm, c []float32) error {
	if err := checkGEMM(m, n, k, a, bm, c); err != nil {
		return err
	}
	ta, lda := int32(noTrans), int32(k)
	if transA {
		ta, lda = trans, int32(m)
	}
	tb, ldb := int32(noTrans), int32(n)
	if transB {
		tb, ldb = trans, int32(k)
	}
	b.sgemm(rowMajor, ta, tb, int32(m), int32(n), int32(k), 1, &a[0], lda, &bm[0], ldb, 0, &c[0], int32(n))
	return nil
}
