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

package artifact

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"

	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
)

// ReferenceTolerance bounds how far the CPU reference computed here may be from the goldens
// computed where the artifact was converted: the same code, but another machine may fuse a
// multiply and an add where the converter's did not.
const ReferenceTolerance = 2e-3

// aneParity is the import's parity gate for an ane artifact: every program of every rung
// re-emits from the stored weights exactly as converted, and the CPU reference of those
// programs reproduces the goldens.
func aneParity(dir string, m *Manifest) error {
	model, err := aneartifact.Load(dir)
	if err != nil {
		return &IntegrityError{Check: "parity", Message: err.Error()}
	}
	defer model.Close()
	if model.Config.Layers != m.Layers || model.Config.Hidden != m.Dimensions {
		return &IntegrityError{Check: "parity", Message: fmt.Sprintf("the model has %d layers of %d dimensions; the manifest says %d of %d",
			model.Config.Layers, model.Config.Hidden, m.Layers, m.Dimensions)}
	}
	for _, rung := range m.Rungs {
		for i := range m.Layers {
			if _, err := model.Layer(i, rung); err != nil {
				return &IntegrityError{Check: "programs", Message: err.Error()}
			}
		}
	}
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(m.Parity.Goldens)))
	if err != nil {
		return &IntegrityError{Check: "parity", Message: err.Error()}
	}
	var goldens []aneartifact.Golden
	if err := json.Unmarshal(data, &goldens); err != nil || len(goldens) == 0 {
		return &IntegrityError{Check: "parity", Message: fmt.Sprintf("the goldens do not read: %v", err)}
	}
	refs := map[int]*family.Reference{}
	for n, g := range goldens {
		ref := refs[g.Rung]
		if ref == nil {
			if ref, err = family.NewReference(model.Config, model.Weights, g.Rung); err != nil {
				return &IntegrityError{Check: "parity", Message: err.Error()}
			}
			refs[g.Rung] = ref
		}
		toks := make([]int32, len(g.Tokens))
		for i, t := range g.Tokens {
			toks[i] = int32(t)
		}
		out, err := ref.Forward(toks)
		if err != nil || len(out) != len(g.Output) {
			return &ParityError{Message: fmt.Sprintf("golden %d does not run on the reference: %v", n, err)}
		}
		for i := range out {
			if d := math.Abs(float64(out[i] - g.Output[i])); !(d <= ReferenceTolerance) {
				return &ParityError{Message: fmt.Sprintf("golden %d: the reference gives %v where the golden says %v", n, out[i], g.Output[i])}
			}
		}
	}
	return nil
}
