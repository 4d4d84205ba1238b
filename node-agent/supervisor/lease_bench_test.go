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

package supervisor

import (
	"testing"
	"time"
)

// BenchmarkLeaseResident measures the fast path: leasing and releasing a resident shape,
// serially and from parallel goroutines (run with -cpu 1,2).
func BenchmarkLeaseResident(b *testing.B) {
	h := newHarness(b, 100)
	h.load("a")
	h.resident("a", 128).Release()
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l, err := h.s.Acquire(h.ctx, "a", 128, time.Time{})
			if err != nil {
				b.Fatal(err)
			}
			l.Release()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				l, err := h.s.Acquire(h.ctx, "a", 128, time.Time{})
				if err != nil {
					b.Fatal(err)
				}
				l.Release()
			}
		})
	})
}
