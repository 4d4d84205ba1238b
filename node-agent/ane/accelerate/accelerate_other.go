//go:build !(darwin && arm64)

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
	"runtime"
)

// BLAS is Accelerate's cblas_sgemm; on this system there is none.
type BLAS struct{}

// Open reports ErrUnsupported.
func Open() (*BLAS, error) {
	return nil, fmt.Errorf("%w (this is %s/%s)", ErrUnsupported, runtime.GOOS, runtime.GOARCH)
}

// SGEMM is never reached: Open gives no BLAS here.
func (b *BLAS) SGEMM(transA, transB bool, m, n, k int, a, bm, c []float32) error {
	if err := checkGEMM(m, n, k, a, bm, c); err != nil {
		return err
	}
	return ErrUnsupported
}
