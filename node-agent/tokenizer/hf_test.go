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

package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
)

func load(t *testing.T, name string) *HF {
	t.Helper()
	tk, err := LoadHF("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

func TestAByteLevelBPETokenizerEncodesWithItsTemplate(t *testing.T) {
	tk := load(t, "bytelevel_bpe.json")
	for text, want := range map[string][]uint32{
		"hello world!":   {0, 13, 17, 18, 1}, // [CLS] hello Ġworld ! [SEP]
		"hello  world":   {0, 13, 6, 17, 1},  // two spaces: Ġ, then Ġworld
		"hello\n\nworld": {0, 13, 20, 20, 7, 15, 19, 1},
		"hello ":         {0, 13, 6, 1}, // a trailing space is kept
	} {
		got, err := tk.Encode(text)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %v, %v; want %v", text, got, err, want)
		}
	}
}

// The Qwen-style pre-tokenizer: a Split whose pattern needs a lookahead, then byte mapping
// only. The expected pieces follow the pattern's semantics: single digits, a run of spaces
// giving its last space to the next word, punctuation keeping its newline.
func TestAQwenStylePreTokenizerSplitsAsItsPatternSays(t *testing.T) {
	tk := load(t, "qwen_split_bpe.json")
	for text, want := range map[string][]uint32{
		"a  b!\n": {1, 2, 4, 7, 0}, // a, Ġ, Ġb, !Ċ, <|endoftext|>
		"123":     {8, 9, 10, 0},   // 1, 2, 3: digits one by one, never the merge 12
	} {
		got, err := tk.Encode(text)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %v, %v; want %v", text, got, err, want)
		}
	}
}

func TestATokenizerThatCannotEncodeSaysSoWithoutCrashing(t *testing.T) {
	tk := load(t, "bytelevel_bpe.json")
	if _, err := tk.Encode("zebra"); err == nil {
		t.Fatal("a text the vocabulary cannot hold was encoded")
	}
	if _, err := tk.Encode("bad \xff utf-8"); err == nil {
		t.Fatal("invalid UTF-8 was encoded")
	}
	for name, doc := range map[string]string{
		"not json":          `{`,
		"unknown model":     `{"model": {"type": "Mystery"}}`,
		"bad split pattern": `{"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(?!"}, "behavior": "Isolated"}]}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`,
		"unknown behavior":  `{"pre_tokenizer": {"type": "Split", "pattern": {"Regex": "x(?=y)"}, "behavior": "Sideways"}, "model": {"type": "BPE", "vocab": {}, "merges": []}}`,
	} {
		if _, err := ParseHF([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestConcurrentEncodingsAgree(t *testing.T) {
	tk := load(t, "bytelevel_bpe.json")
	want, _ := tk.Encode("hello world!")
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if got, err := tk.Encode("hello world!"); err != nil || !slices.Equal(got, want) {
					errs <- fmt.Sprintf("a concurrent encoding gave %v, %v; want %v", got, err, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// withSections is the test tokenizer with its truncation and padding sections replaced.
func withSections(t *testing.T, truncation, padding string) []byte {
	t.Helper()
	data, err := os.ReadFile("testdata/bytelevel_bpe.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	doc["truncation"], doc["padding"] = json.RawMessage(truncation), json.RawMessage(padding)
	out, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// A tokenizer.json's truncation (here to 8 tokens) and padding (Fixed 16) are applied by the
// library inside encoding: a longer text would come back cut, a short one padded to a larger
// bucket. Such a file is refused; stripped, the same text encodes whole and unpadded.
func TestATokenizerThatTruncatesOrPadsIsRefusedAndItsLimitsAreNeverApplied(t *testing.T) {
	const truncation = `{"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}`
	const padding = `{"strategy": {"Fixed": 16}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 1, "pad_type_id": 0, "pad_token": "[SEP]"}`
	text := strings.Repeat("hello world! ", 4) // 16 tokens and [CLS] [SEP]
	want := []uint32{0, 13, 17, 18}
	for range 3 {
		want = append(want, 6, 13, 17, 18)
	}
	want = append(want, 6, 1) // the trailing space, [SEP]
	for name, c := range map[string]struct{ truncation, padding string }{
		"truncation to 8": {truncation, "null"}, "fixed padding": {"null", padding}, "both": {truncation, padding},
	} {
		t.Run(name, func(t *testing.T) {
			data := withSections(t, c.truncation, c.padding)
			_, err := ParseHF(data)
			var le *LimitsError
			if !errors.As(err, &le) {
				t.Fatalf("a tokenizer.json with %s was read (%v); want a LimitsError", name, err)
			}
			stripped, limits, err := StripLimits(data)
			if err != nil {
				t.Fatal(err)
			}
			if (c.truncation != "null") != (len(limits.Truncation) > 0) || (c.padding != "null") != (len(limits.Padding) > 0) {
				t.Fatalf("recorded limits %v for %s", limits, name)
			}
			tk, err := ParseHF(stripped)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := tk.Encode(text); err != nil || !slices.Equal(got, want) {
				t.Fatalf("the long text encoded to %d ids %v (%v); want all %d: %v", len(got), got, err, len(want), want)
			}
			if got, err := tk.Encode("hello"); err != nil || !slices.Equal(got, []uint32{0, 13, 1}) {
				t.Fatalf("a short text encoded to %v (%v); want [0 13 1], unpadded", got, err)
			}
		})
	}
}
