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
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
)

// The Sim tokenizer stops at the bound's next token, so an oversize text never costs more ids
// than the lane takes plus one; within the bound it encodes as without one.
func TestSimStopsAtTheTokenAfterItsBound(t *testing.T) {
	text := strings.Repeat("word ", 1<<20)
	_, err := Sim{}.EncodeContext(context.Background(), text, 128)
	var tl *TooLongError
	if !errors.As(err, &tl) || tl.Max != 128 || tl.Tokens != 129 {
		t.Fatalf("%v: want a TooLongError at 129 of 128", err)
	}
	got, err := Sim{}.EncodeContext(context.Background(), "hello, world", 3)
	if err != nil || !slices.Equal(got, Sim{}.ids("hello, world")) {
		t.Fatalf("%v, %v: a text of exactly the bound", got, err)
	}
}

func TestEncodingEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := (Sim{}).EncodeContext(ctx, strings.Repeat("w ", 10000), 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("sim: %v, want context.Canceled", err)
	}
	tk := load(t, "qwen_split_bpe.json")
	if _, err := tk.EncodeContext(ctx, "a b", 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("hf: %v, want context.Canceled", err)
	}
	// A caller waiting for a tokenizer another encoding holds gives up with its context.
	tk.sem <- struct{}{}
	_, err := tk.EncodeContext(ctx, "a b", 0)
	<-tk.sem
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("waiting: %v, want context.Canceled", err)
	}
	if got, err := tk.EncodeContext(context.Background(), "a  b!\n", 0); err != nil || !slices.Equal(got, []uint32{1, 2, 4, 7, 0}) {
		t.Fatalf("after the refusals: %v, %v", got, err)
	}
	if _, err := tk.EncodeContext(context.Background(), "a  b!\n", 4); !IsTooLong(err) {
		t.Fatalf("5 tokens under a bound of 4: %v", err)
	}
}

// A Split pattern that backtracks catastrophically on a text is stopped by regexp2's match
// timeout and refuses the text, rather than tokenising it from the matches found so far or
// holding the lane's tokenizer for minutes.
func TestABacktrackingPatternIsBoundedByTheMatchTimeout(t *testing.T) {
	data, err := os.ReadFile("testdata/qwen_split_bpe.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	split := doc["pre_tokenizer"].(map[string]any)["pretokenizers"].([]any)[0].(map[string]any)
	split["pattern"] = map[string]any{"Regex": `(a|aa)+(?=b)|\s+`} // the lookahead makes it regexp2's
	data, _ = json.Marshal(doc)
	tk, err := ParseHF(data)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tk.EncodeContext(context.Background(), strings.Repeat("a", 64)+"c", 0)
	if err == nil || !strings.Contains(err.Error(), "took over") {
		t.Fatalf("%v: want the match timeout's refusal", err)
	}
}
