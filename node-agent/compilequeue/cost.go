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
	"math"
	"time"
)

// Shape names one rung of one model: what an admission compiles or loads.
type Shape struct {
	// Model identifies the model's compiled form (its certified identity); two workers of the
	// same model share measurements, because aned and the compiler see the same programs.
	Model string
	// Rung is the sequence length.
	Rung int
}

// Kind is what an admission is predicted to do on the worker.
type Kind int

const (
	// Compile: aned does not hold the rung's programs; every layer is compiled.
	Compile Kind = iota
	// Load: aned holds the rung's programs (a cached first and last layer); every layer loads
	// in milliseconds.
	Load
)

func (k Kind) String() string {
	if k == Load {
		return "load"
	}
	return "compile"
}

// Seed calibration from the seed's M-series measurements: a layer compiles in 0.37 s at
// rung 128 and 15.8 s at rung 4096, and a cached layer loads in 3.5 ms to 45 ms over the
// same range. Between and beyond, cost follows the power law through those two points.
var (
	seedCompileAt128  = 370 * time.Millisecond
	seedCompileAt4096 = 15800 * time.Millisecond
	seedLoadAt128     = 3500 * time.Microsecond
	seedLoadAt4096    = 45 * time.Millisecond
)

// SeedLayerCompile is the seed estimate of compiling one layer at rung.
func SeedLayerCompile(rung int) time.Duration {
	return powerLaw(seedCompileAt128, seedCompileAt4096, rung)
}

// SeedLayerLoad is the seed estimate of loading one cached layer at rung.
func SeedLayerLoad(rung int) time.Duration {
	return powerLaw(seedLoadAt128, seedLoadAt4096, rung)
}

func powerLaw(at128, at4096 time.Duration, rung int) time.Duration {
	exp := math.Log(float64(at4096)/float64(at128)) / math.Log(4096.0/128.0)
	return time.Duration(float64(at128) * math.Pow(float64(rung)/128.0, exp))
}

// Prediction is the predicted duration of one admission.
type Prediction struct {
	Cost time.Duration
	Kind Kind
	// Measured is true when Cost is this machine's own measurement of this shape and kind,
	// rather than a seed estimate scaled by the machine factor.
	Measured bool
}

// CostModel predicts admission costs and learns from observed ones. The zero value is not
// usable; use NewCostModel.
type CostModel struct {
	compiles map[Shape]time.Duration
	loads    map[Shape]time.Duration
	// The machine factor is measured compile time over the seed estimate of the same
	// compiles: how much slower (or faster) this machine compiles than the seed's.
	measuredSum, seedSum time.Duration
}

// NewCostModel returns a model that knows only the seed calibration.
func NewCostModel() *CostModel {
	return &CostModel{compiles: map[Shape]time.Duration{}, loads: map[Shape]time.Duration{}}
}

// MachineFactor is how much slower this machine compiled than the seed estimate so far; 1
// before the first measured compile.
func (m *CostModel) MachineFactor() float64 {
	if m.seedSum == 0 {
		return 1
	}
	return float64(m.measuredSum) / float64(m.seedSum)
}

// Predict returns the predicted cost of admitting shape, a model of the given number of
// layers. A rung the worker reports cached in aned is predicted at its load cost.
func (m *CostModel) Predict(shape Shape, layers int, cached bool) Prediction {
	if cached {
		if d, ok := m.loads[shape]; ok {
			return Prediction{Cost: d, Kind: Load, Measured: true}
		}
		return Prediction{Cost: time.Duration(layers) * SeedLayerLoad(shape.Rung), Kind: Load}
	}
	if d, ok := m.compiles[shape]; ok {
		return Prediction{Cost: d, Kind: Compile, Measured: true}
	}
	seed := time.Duration(layers) * SeedLayerCompile(shape.Rung)
	return Prediction{Cost: time.Duration(float64(seed) * m.MachineFactor()), Kind: Compile}
}

// Observation is one finished admission as the worker reported it.
type Observation struct {
	Shape  Shape
	Layers int
	// Duration runs from the moment the admission reached the worker, so time spent waiting
	// for the worker's stream is never learned as compile time.
	Duration time.Duration
	// Kind is what the admission did: Load when every layer came from aned's cache
	// (compiled_layers == 0), Compile otherwise.
	Kind Kind
	// Retried admissions (a second attempt after a failure) and packed programs do not
	// measure a shape's compile: they are never learned.
	Retried, Packed bool
}

// Observe learns from a finished admission. Load times are learned apart from compile times
// and never move the machine factor.
func (m *CostModel) Observe(o Observation) {
	if o.Retried || o.Packed || o.Duration <= 0 {
		return
	}
	if o.Kind == Load {
		m.loads[o.Shape] = o.Duration
		return
	}
	if _, seen := m.compiles[o.Shape]; !seen {
		m.measuredSum += o.Duration
		m.seedSum += time.Duration(o.Layers) * SeedLayerCompile(o.Shape.Rung)
	}
	m.compiles[o.Shape] = o.Duration
}
