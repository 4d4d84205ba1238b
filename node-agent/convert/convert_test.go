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
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nlpodyssey/safetensors"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

var platform = artifact.Platform{ChipFamily: "M4", MacOSBuild: "25B78"}

func convertTiny(t *testing.T, c family.Config, scale float64) (string, *artifact.Manifest, error) {
	t.Helper()
	return convertTinyUnder(t, c, scale, DefaultPolicy)
}

func convertTinyUnder(t *testing.T, c family.Config, scale float64, policy Policy) (string, *artifact.Manifest, error) {
	t.Helper()
	ckDir := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(ckDir, c, 3, scale, tinymodel.Tokenizer); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(ckDir, policy)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	dst, err := artifact.Path(t.TempDir(), "tiny-"+string(c.Kind), "r1", policy.Name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Convert(dst, ck, Options{Model: "tiny-" + string(c.Kind), Revision: "r1", Rungs: []int{64, 128}, Platform: platform, Policy: policy})
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
			// The smallest rung's goldens, and one that fills each other gated rung.
			if !slices.Equal(m.Parity.Rungs, []int{64, 128}) {
				t.Fatalf("the gate ran at %v, want both rungs", m.Parity.Rungs)
			}
			if err := json.Unmarshal(data, &goldens); err != nil || len(goldens) != DefaultPolicy.Goldens+1 || goldens[len(goldens)-1].Rung != 128 ||
				len(goldens[len(goldens)-1].Tokens) != 128 {
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

// TestLargeResidualsConvertAndTheGateJudgesEachGoldenByCosine: token embeddings in the
// hundreds (squares past fp16's 65,504 in the first norm, which gave inf and zeroed the
// position before the norms were scaled) convert within the default gate, on real text, with
// the cosine recorded; a gate that asks for more than fp16 gives refuses the conversion by
// cosine and leaves nothing.
func TestLargeResidualsConvertAndTheGateJudgesEachGoldenByCosine(t *testing.T) {
	_, m, err := convertTiny(t, tinymodel.Qwen3(), 2000)
	if err != nil {
		t.Fatalf("large residuals: %v", err)
	}
	if m.Parity.MinCosine < DefaultPolicy.ParityMinCosine || !strings.Contains(m.Parity.Input, "the tokenizer's encoding of the parity sample") {
		t.Fatalf("parity %+v", m.Parity)
	}
	strict := DefaultPolicy
	strict.Name, strict.ParityMinCosine = "strict", 0.99999999
	dir, _, err := convertTinyUnder(t, tinymodel.Qwen3(), 1, strict)
	var pe *artifact.ParityError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "cosine") {
		t.Fatalf("conversion: %v, want an ArtifactParityError on the cosine", err)
	}
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
		func(p *Policy) { p.ParityMaxRung *= 2 }, func(p *Policy) { p.ParitySampled++ },
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

// writeCheckpoint writes a tiny checkpoint of c whose weights (tinymodel's, changed by edit)
// are stored as dtype, with its tokenizer and pooling.
func writeCheckpoint(t *testing.T, c family.Config, scale float64, dtype safetensors.DType, edit func(map[string]aneartifact.Tensor)) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(dir, c, 3, scale, tinymodel.Tokenizer); err != nil {
		t.Fatal(err)
	}
	weights := map[string]aneartifact.Tensor{}
	for name, w := range tinymodel.Weights(c, 3, scale) {
		weights["model."+name] = w
	}
	if edit != nil {
		edit(weights)
	}
	if err := aneartifact.Write(filepath.Join(dir, "model.safetensors"), dtype, weights); err != nil {
		t.Fatal(err)
	}
	return dir
}

func convertCheckpoint(t *testing.T, ckDir string, p Policy, rungs []int) (*artifact.Manifest, error) {
	t.Helper()
	ck, err := OpenCheckpoint(ckDir, p)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	return Convert(filepath.Join(t.TempDir(), "tiny", "r1", p.Name), ck, Options{Model: "tiny", Revision: "r1", Rungs: rungs, Platform: platform, Policy: p})
}

// A BF16 or F32 weight beyond fp16's largest value would become infinite in the artifact, or
// (up to 65519) be rounded down to 65504 without a word: the conversion is refused naming the
// tensor, the index and the value.
func TestWeightsOutsideFP16sRangeAreRefusedByName(t *testing.T) {
	for _, c := range []struct {
		dtype safetensors.DType
		value float32
	}{{safetensors.BF16, -1e5}, {safetensors.F32, -1e5}, {safetensors.F32, -65510}} {
		t.Run(fmt.Sprintf("%s %g", c.dtype, c.value), func(t *testing.T) {
			ck := writeCheckpoint(t, tinymodel.Qwen3(), 1, c.dtype, func(w map[string]aneartifact.Tensor) {
				w["model.layers.1.mlp.down_proj.weight"].Values[5] = c.value
			})
			_, err := convertCheckpoint(t, ck, DefaultPolicy, []int{64})
			var re *RangeError
			if !errors.As(err, &re) || re.Tensor != "layers.1.mlp.down_proj.weight" || re.Index != 5 || re.Value > -65504 {
				t.Fatalf("conversion: %v; want a RangeError naming layers.1.mlp.down_proj.weight at 5", err)
			}
			t.Log(err)
		})
	}
}

// The gate compares the fp16 programs with the checkpoint's own weights. Token embeddings of
// about 1e-7 are fp16 subnormals: cast, they keep a digit or two, and the embeddings' norm
// turns that into a different direction, although every activation fits fp16. Stored as F32,
// the cast is measured and the conversion fails; the same values stored in F16 (already what
// the device holds) convert.
func TestTheParityGateMeasuresTheCastOfTheWeightsToFP16(t *testing.T) {
	_, err := convertCheckpoint(t, writeCheckpoint(t, tinymodel.ModernBERT(), 1e-6, safetensors.F32, nil), DefaultPolicy, []int{64})
	var pe *artifact.ParityError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "checkpoint's own precision") {
		t.Fatalf("F32 weights fp16 cannot hold converted: %v", err)
	}
	t.Log(err)
	m, err := convertCheckpoint(t, writeCheckpoint(t, tinymodel.ModernBERT(), 1e-6, safetensors.F16, nil), DefaultPolicy, []int{64})
	if err != nil {
		t.Fatalf("the same weights in F16: %v", err)
	}
	t.Logf("in F16: largest difference %.5f", m.Parity.MaxAbsError)
	m, err = convertCheckpoint(t, writeCheckpoint(t, tinymodel.ModernBERT(), 1, safetensors.F32, nil), DefaultPolicy, []int{64})
	if err != nil {
		t.Fatalf("ordinary F32 weights: %v", err)
	}
	t.Logf("ordinary F32 weights: largest difference %.5f", m.Parity.MaxAbsError)
}

func TestTheParityGateRunsAtTheSmallestTheLargestItCanAndASampledRung(t *testing.T) {
	p := Policy{Version: 2, ParityMaxRung: 256, ParitySampled: 1}
	for _, c := range []struct {
		rungs []int
		p     func(*Policy)
		want  []int // nil: the smallest, one of between and the largest up to the limit
	}{
		{[]int{64, 128, 192, 256, 320}, nil, nil},
		{[]int{64, 128, 192, 256, 320}, func(p *Policy) { p.ParitySampled = 0 }, []int{64, 256}},
		{[]int{64, 128, 192, 256, 320}, func(p *Policy) { p.ParitySampled = 9 }, []int{64, 128, 192, 256}},
		{[]int{512, 1024}, nil, []int{512}},
		{[]int{64}, nil, []int{64}},
	} {
		q := p
		if c.p != nil {
			c.p(&q)
		}
		got := ParityRungs(c.rungs, q)
		if c.want != nil && !slices.Equal(got, c.want) {
			t.Errorf("%v under %+v: %v, want %v", c.rungs, q, got, c.want)
		}
		if c.want == nil && (len(got) != 3 || got[0] != 64 || got[2] != 256 || (got[1] != 128 && got[1] != 192)) {
			t.Errorf("%v under %+v: %v, want 64, one of 128 and 192, and 256", c.rungs, q, got)
		}
		if !slices.Equal(got, ParityRungs(c.rungs, q)) {
			t.Errorf("%v: the sampled rungs change from one conversion to the next", c.rungs)
		}
	}
	// A conversion records where it gated and holds goldens there.
	q := DefaultPolicy
	q.ParityMaxRung = 192
	m, err := convertCheckpoint(t, writeCheckpoint(t, tinymodel.Qwen3(), 1, safetensors.F32, nil), q, []int{64, 128, 192, 256})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Parity.Rungs, []int{64, 128, 192}) {
		t.Fatalf("the gate ran at %v", m.Parity.Rungs)
	}
}

// The pooling is the checkpoint's own (its sentence-transformers configuration), never a
// family default: a policy that says otherwise, a checkpoint that says nothing (unless the
// policy names one), a pooling the programs do not reproduce or a pipeline with more modules
// are refused by name.
func TestThePoolingIsTheCheckpointsOwnAndAPolicyThatDisagreesIsRefused(t *testing.T) {
	mean := tinymodel.ModernBERT()
	mean.Pooling = family.PoolMean // not the family's usual cls
	ck := writeCheckpoint(t, mean, 1, safetensors.F32, nil)
	opened, err := OpenCheckpoint(ck, DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	opened.Close()
	if opened.Config.Pooling != family.PoolMean {
		t.Fatalf("pooling %s, want the checkpoint's mean", opened.Config.Pooling)
	}
	refused := func(name, dir string, p Policy, want string) {
		t.Helper()
		_, err := OpenCheckpoint(dir, p)
		var pe *PoolingError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a PoolingError saying %q", name, err, want)
		}
	}
	cls := DefaultPolicy
	cls.Pooling = family.PoolCLS
	refused("a policy that disagrees", ck, cls, "the policy pools by cls, the checkpoint's sentence-transformers configuration by mean")

	edit := func(file string, change func(map[string]any)) string {
		dir := writeCheckpoint(t, mean, 1, safetensors.F32, nil)
		path := filepath.Join(dir, filepath.FromSlash(file))
		var doc map[string]any
		data, _ := os.ReadFile(path)
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		change(doc)
		data, _ = json.Marshal(doc)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	refused("max pooling", edit("1_Pooling/config.json", func(d map[string]any) { d["pooling_mode_mean_tokens"], d["pooling_mode_max_tokens"] = false, true }),
		DefaultPolicy, "max_tokens")
	refused("two modes", edit("1_Pooling/config.json", func(d map[string]any) { d["pooling_mode_cls_token"] = true }), DefaultPolicy, "exactly one")
	refused("no prompt", edit("1_Pooling/config.json", func(d map[string]any) { d["include_prompt"] = false }), DefaultPolicy, "include_prompt")
	refused("another width", edit("1_Pooling/config.json", func(d map[string]any) { d["word_embedding_dimension"] = 64 }), DefaultPolicy, "64 dimensions")

	dense := writeCheckpoint(t, mean, 1, safetensors.F32, nil)
	modules := `[{"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"}, {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
		{"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"}, {"idx": 3, "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}]`
	if err := os.WriteFile(filepath.Join(dense, "modules.json"), []byte(modules), 0o644); err != nil {
		t.Fatal(err)
	}
	refused("a Dense module", dense, DefaultPolicy, "sentence_transformers.models.Dense")

	bare := writeCheckpoint(t, mean, 1, safetensors.F32, nil)
	for _, f := range []string{"modules.json", "1_Pooling"} {
		if err := os.RemoveAll(filepath.Join(bare, f)); err != nil {
			t.Fatal(err)
		}
	}
	refused("no configuration and no policy pooling", bare, DefaultPolicy, "names none")
	named := DefaultPolicy
	named.Pooling = family.PoolMean
	if opened, err := OpenCheckpoint(bare, named); err != nil || opened.Config.Pooling != family.PoolMean {
		t.Fatalf("a checkpoint without configuration under a policy that names mean: %v", err)
	} else {
		opened.Close()
	}
}
