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

package convert

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

var platform = artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}

func convertTiny(t *testing.T, c family.Config, scale float64) (string, *artifact.Manifest, error) {
	t.Helper()
	ckDir := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(ckDir, c, 3, scale, tinymodel.Tokenizer); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(ckDir, DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	dst, err := artifact.Path(t.TempDir(), "tiny-"+string(c.Kind), "r1", DefaultPolicy.Name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Convert(dst, ck, Options{Model: "tiny-" + string(c.Kind), Revision: "r1", Rungs: []int{64, 128}, Platform: platform, Policy: DefaultPolicy})
	return dst, m, err
}

func TestACheckpointConvertsIntoAnArtifactThatVerifiesAndReproducesItsGoldens(t *testing.T) {
	for _, c := range []family.Config{tinymodel.ModernBERT(), tinymodel.Qwen3()} {
		t.Run(string(c.Kind), func(t *testing.T) {
			dir, m, err := convertTiny(t, c, 1)
			if err != nil {
				t.Fatal(err)
			}
			if m.Backend != "ane" || m.Layers != 3 || m.Dimensions != 32 || !slices.Equal(m.Rungs, []int{64, 128}) || m.Parity.Status != "passed" {
				t.Fatalf("manifest %+v", m)
			}
			t.Logf("parity: largest fp16 against float32 difference %.5f", m.Parity.MaxAbsError)
			v, err := artifact.Verifier{}.Verify(dir, artifact.Want{Model: m.Model, Revision: "r1", CheckpointDigest: m.CheckpointDigest,
				ConversionPolicy: m.ConversionPolicy, Backend: "ane", Platform: platform, ConverterVersion: ConverterVersion, Rungs: []int{64, 128}})
			if err != nil {
				t.Fatal(err)
			}
			model, err := aneartifact.Load(v.Dir)
			if err != nil {
				t.Fatal(err)
			}
			defer model.Close()
			// Every program re-emits from the stored weights exactly as converted.
			for _, rung := range []int{64, 128} {
				for i := range 3 {
					if _, err := model.Layer(i, rung); err != nil {
						t.Fatal(err)
					}
				}
			}
			// The goldens are what the CPU reference computes from the artifact alone.
			var goldens []aneartifact.Golden
			data, _ := os.ReadFile(filepath.Join(dir, aneartifact.GoldensFile))
			if err := json.Unmarshal(data, &goldens); err != nil || len(goldens) != DefaultPolicy.Goldens {
				t.Fatalf("goldens: %v (%d)", err, len(goldens))
			}
			for _, g := range goldens {
				toks := make([]int32, len(g.Tokens))
				for i, id := range g.Tokens {
					toks[i] = int32(id)
				}
				ref, err := family.NewReference(model.Config, model.Weights, g.Rung)
				if err != nil {
					t.Fatal(err)
				}
				got, err := ref.Forward(toks)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, g.Output) {
					t.Fatalf("a golden of %d tokens is not what the artifact's reference computes", len(toks))
				}
			}
			if _, err := os.Stat(filepath.Join(dir, aneartifact.TokenizerFile)); err != nil {
				t.Fatal("the tokenizer was not carried into the artifact")
			}
		})
	}
}

func TestAProgramThatNoLongerReEmitsIdenticallyIsRefused(t *testing.T) {
	dir, _, err := convertTiny(t, tinymodel.Qwen3(), 1)
	if err != nil {
		t.Fatal(err)
	}
	// A program text that is not what this emitter produces (another converter's, or edited
	// after conversion with the manifest rewritten to match) never compiles.
	path := filepath.Join(dir, filepath.FromSlash(aneartifact.ProgramPath(128, 1)))
	text, _ := os.ReadFile(path)
	if err := os.WriteFile(path, append(text, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	model, err := aneartifact.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	if _, err := model.Layer(1, 128); err == nil {
		t.Fatal("an edited program was accepted")
	}
	if _, err := model.Layer(1, 64); err != nil {
		t.Fatalf("the other rung's program: %v", err)
	}
}

func TestActivationsFP16CannotHoldFailTheParityGateAndLeaveNothing(t *testing.T) {
	// Token embeddings in the thousands: the first RMSNorm's squares overflow fp16.
	dir, _, err := convertTiny(t, tinymodel.Qwen3(), 2000)
	var pe *artifact.ParityError
	if !errors.As(err, &pe) {
		t.Fatalf("conversion: %v, want ArtifactParityError", err)
	}
	t.Log(err)
	if _, serr := os.Stat(dir); !os.IsNotExist(serr) {
		t.Fatal("a failed conversion left an artifact")
	}
	entries, _ := os.ReadDir(filepath.Dir(dir))
	if len(entries) != 0 {
		t.Fatalf("a failed conversion left %v", entries)
	}
}

func TestACheckpointTheProgramsWouldNotReproduceIsRefused(t *testing.T) {
	ckDir := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(ckDir, tinymodel.Qwen3(), 3, 1, nil); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(ckDir, "config.json")
	var doc map[string]any
	data, _ := os.ReadFile(cfg)
	_ = json.Unmarshal(data, &doc)
	doc["rope_scaling"] = map[string]any{"type": "yarn", "factor": 4}
	data, _ = json.Marshal(doc)
	_ = os.WriteFile(cfg, data, 0o644)
	if _, err := OpenCheckpoint(ckDir, DefaultPolicy); err == nil {
		t.Fatal("a config with rope scaling was accepted")
	}
	if err := tinymodel.Write(ckDir, tinymodel.Qwen3(), 3, 1, []byte(`{"model": {"type": "Mystery"}}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenCheckpoint(ckDir, DefaultPolicy); err == nil {
		t.Fatal("a tokenizer that does not load was accepted")
	}
}

func TestThePolicyDigestChangesWithEveryParameter(t *testing.T) {
	p := DefaultPolicy
	seen := map[string]bool{p.Digest(): true}
	for _, change := range []func(*Policy){
		func(p *Policy) { p.Version++ }, func(p *Policy) { p.Goldens++ }, func(p *Policy) { p.ParityMaxAbs /= 2 },
		func(p *Policy) { p.Pooling = family.PoolMean }, func(p *Policy) { p.Name += "x" },
	} {
		q := DefaultPolicy
		change(&q)
		if seen[q.Digest()] {
			t.Fatalf("policy %+v has a digest seen before", q)
		}
		seen[q.Digest()] = true
	}
}

// A checkpoint whose tokenizer.json truncates to 8 tokens and pads to a fixed 16: the artifact's
// tokenizer does neither (a 20-token text stays 20 tokens and is judged against the lane's
// ceiling, a short one stays short), and the manifest records what was removed.
func TestATokenizersTruncationAndPaddingAreRecordedAndStrippedNeverApplied(t *testing.T) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(tinymodel.Tokenizer, &doc); err != nil {
		t.Fatal(err)
	}
	doc["truncation"] = json.RawMessage(`{"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}`)
	doc["padding"] = json.RawMessage(`{"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 1, "pad_type_id": 0, "pad_token": "[SEP]"}`)
	tok, _ := json.Marshal(doc)
	ckDir := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(ckDir, tinymodel.ModernBERT(), 3, 1, tok); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(ckDir, DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	dst := filepath.Join(t.TempDir(), "tiny", "r1", DefaultPolicy.Name)
	m, err := Convert(dst, ck, Options{Model: "tiny", Revision: "r1", Rungs: []int{64}, Platform: platform, Policy: DefaultPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var truncation struct {
		MaxLength int `json:"max_length"`
	}
	var padding struct {
		Strategy struct{ Fixed int } `json:"strategy"`
	}
	if m.Tokenizer == nil || json.Unmarshal(m.Tokenizer.RemovedTruncation, &truncation) != nil || truncation.MaxLength != 8 ||
		json.Unmarshal(m.Tokenizer.RemovedPadding, &padding) != nil || padding.Strategy.Fixed != 16 {
		t.Fatalf("the manifest does not record what was stripped: %+v", m.Tokenizer)
	}
	tk, err := tokenizer.LoadHF(filepath.Join(dst, aneartifact.TokenizerFile))
	if err != nil {
		t.Fatalf("the artifact's tokenizer: %v", err)
	}
	long, err := tk.Encode(strings.Repeat("hello world ", 10))
	if err != nil || len(long) != 32 { // [CLS] hello Ġworld, 9 times Ġ hello Ġworld, Ġ, [SEP]
		t.Fatalf("a 20-word text encoded to %d ids (%v): cut or padded", len(long), err)
	}
	short, err := tk.Encode("hello")
	if err != nil || len(short) != 3 {
		t.Fatalf("a one-word text encoded to %v (%v): padded", short, err)
	}
}
