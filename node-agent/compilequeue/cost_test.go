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

package compilequeue

import (
	"testing"
	"time"
)

func TestSeedEstimateIsLayersTimesTheCalibratedPerLayerTime(t *testing.T) {
	m := NewCostModel()
	for _, tc := range []struct {
		rung   int
		layers int
		want   time.Duration
	}{
		{128, 22, 22 * 370 * time.Millisecond},
		{4096, 28, 28 * 15800 * time.Millisecond},
	} {
		p := m.Predict(Shape{"gte", tc.rung}, tc.layers, false)
		if p.Kind != Compile || p.Measured || !near(p.Cost, tc.want) {
			t.Errorf("rung %d, %d layers: got %+v, want an unmeasured compile of %v", tc.rung, tc.layers, p, tc.want)
		}
	}
	// Between the calibration points cost grows with the rung.
	if a, b := SeedLayerCompile(256), SeedLayerCompile(512); !(SeedLayerCompile(128) < a && a < b && b < SeedLayerCompile(4096)) {
		t.Errorf("per-layer compile times are not increasing: 256=%v 512=%v", a, b)
	}
}

func TestMeasuredCompileTimeReplacesTheSeedEstimate(t *testing.T) {
	m := NewCostModel()
	s := Shape{"gte", 512}
	m.Observe(Observation{Shape: s, Layers: 22, Duration: 42 * time.Second, Kind: Compile})
	if p := m.Predict(s, 22, false); p.Cost != 42*time.Second || !p.Measured {
		t.Fatalf("got %+v, want the measured 42s", p)
	}
}

func TestUnmeasuredShapesScaleByHowMuchSlowerThisMachineCompiled(t *testing.T) {
	m := NewCostModel()
	measured := Shape{"gte", 128}
	seed := 22 * SeedLayerCompile(128)
	m.Observe(Observation{Shape: measured, Layers: 22, Duration: 2 * seed, Kind: Compile})
	if f := m.MachineFactor(); f < 1.99 || f > 2.01 {
		t.Fatalf("machine factor %v, want 2", f)
	}
	other := Shape{"qwen3", 1024}
	want := 2 * 28 * SeedLayerCompile(1024)
	if p := m.Predict(other, 28, false); !near(p.Cost, want) || p.Measured {
		t.Fatalf("got %+v, want the seed estimate scaled by 2 (%v)", p, want)
	}
}

func TestACachedRungIsPredictedAtItsLoadCost(t *testing.T) {
	m := NewCostModel()
	s := Shape{"gte", 4096}
	p := m.Predict(s, 22, true)
	if p.Kind != Load || !near(p.Cost, 22*45*time.Millisecond) {
		t.Fatalf("got %+v, want a load of 22 x 45ms", p)
	}
	m.Observe(Observation{Shape: s, Layers: 22, Duration: 700 * time.Millisecond, Kind: Load})
	if p := m.Predict(s, 22, true); p.Cost != 700*time.Millisecond || !p.Measured {
		t.Fatalf("got %+v, want the measured load 700ms", p)
	}
	// The measured load says nothing about the rung's compile.
	if p := m.Predict(s, 22, false); p.Kind != Compile || p.Measured {
		t.Fatalf("got %+v, want an unmeasured compile", p)
	}
}

func TestLoadTimesNeverChangeTheMachineFactor(t *testing.T) {
	m := NewCostModel()
	m.Observe(Observation{Shape: Shape{"gte", 128}, Layers: 22, Duration: time.Minute, Kind: Load})
	if f := m.MachineFactor(); f != 1 {
		t.Fatalf("machine factor %v after a load, want 1", f)
	}
}

func TestRetriedCompilesAndPackedProgramsAreNeverLearned(t *testing.T) {
	m := NewCostModel()
	s := Shape{"gte", 256}
	before := m.Predict(s, 22, false)
	m.Observe(Observation{Shape: s, Layers: 22, Duration: time.Hour, Kind: Compile, Retried: true})
	m.Observe(Observation{Shape: s, Layers: 22, Duration: time.Hour, Kind: Compile, Packed: true})
	if after := m.Predict(s, 22, false); after != before || m.MachineFactor() != 1 {
		t.Fatalf("prediction moved from %+v to %+v (factor %v)", before, after, m.MachineFactor())
	}
}

func near(a, b time.Duration) bool {
	d := a - b
	if d < 0 {
		d = -d
	}
	return d <= b/1000+time.Microsecond
}
