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
	"sync"
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
	text := strings.Repeat("a", 64) + "c"
	_, err = tk.EncodeContext(context.Background(), text, 0)
	if !errors.Is(err, ErrMatchTimeout) {
		t.Fatalf("%v: want the match timeout's refusal", err)
	}
	// The refusal goes back to the caller: it must not quote the text (regexp2's own error
	// does, whole).
	if strings.Contains(err.Error(), text[:32]) {
		t.Fatalf("the refusal quotes the text: %v", err)
	}
}

// A text longer than the most its bound's tokens can cover is refused for its size before the
// library reads it, so a text of tens of MiB costs an error value, not its encoding; a text at
// the bound is encoded as before. The bounds are those bound.go derives from each file: the
// byte-level BPE's longest merge is Ġwor+ld (6 bytes of text, no normalizer); the Qwen-style
// one's NFC may shrink a text to a quarter, so a token of at most 4 bytes (a character; its
// merges are shorter) covers up to 16 bytes of the original text. An added token counts as one
// token whatever its length, as HuggingFace's tokenizers count it (the library drops it), so a
// text of more of them than the budget is refused unread, whatever its size.
func TestATextPastItsByteBoundIsRefusedUnread(t *testing.T) {
	huge := strings.Repeat(" world", 32<<20/6)
	for _, tc := range []struct {
		file               string
		perToken, specials int
		max                int
		fits, added, word  string
		want               []uint32
	}{
		{"bytelevel_bpe.json", 6, 2, 5, " world world world", "[CLS]", " world", []uint32{0, 17, 17, 17, 1}},
		{"qwen_split_bpe.json", 16, 1, 5, "a  b!\n", "<|endoftext|>", " b", []uint32{1, 2, 4, 7, 0}},
	} {
		t.Run(tc.file, func(t *testing.T) {
			tk := load(t, tc.file)
			if tk.BytesPerToken() != tc.perToken || tk.specials != tc.specials {
				t.Fatalf("%d bytes a token, %d special tokens (%s); want %d, %d", tk.BytesPerToken(), tk.specials, tk.BoundReason(), tc.perToken, tc.specials)
			}
			limit, ok := tk.MaxBytes(tc.max)
			if !ok || limit != (tc.max-tc.specials)*tc.perToken {
				t.Fatalf("MaxBytes(%d) = %d, %v", tc.max, limit, ok)
			}
			// Exactly the ceiling's tokens passes.
			if got, err := tk.EncodeContext(context.Background(), tc.fits, tc.max); err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("%q under %d: %v, %v; want %v", tc.fits, tc.max, got, err, tc.want)
			}
			// A few added tokens within the budget (here one in place of a word) still encode;
			// one more than the budget is refused unread, short as the text is, and so is a text
			// of nothing else the size of the bound (and of a body, below).
			budget := tc.max - tc.specials
			few := strings.Repeat(tc.word, budget-1) + tc.added
			if _, err := tk.EncodeContext(context.Background(), few, tc.max); err != nil {
				t.Fatalf("%q under %d: %v", few, tc.max, err)
			}
			for _, n := range []int{budget + 1, limit} {
				many := strings.Repeat(tc.added, n)
				var tl *TooLongError
				if _, err := tk.EncodeContext(context.Background(), many, tc.max); !errors.As(err, &tl) || tl.Tokens != 0 {
					t.Fatalf("%d added tokens under %d: %v; want a refusal for its size", n, tc.max, err)
				}
			}
			// One byte past the bound is refused for its size, unread.
			over := tc.fits + strings.Repeat("!", limit+1-len(tc.fits))
			var tl *TooLongError
			if _, err := tk.EncodeContext(context.Background(), over, tc.max); !errors.As(err, &tl) || tl.Tokens != 0 || tl.Bytes != limit+1 {
				t.Fatalf("%d bytes under %d tokens: %v; want a refusal for its size", len(over), tc.max, err)
			}
			// 32 MiB, of words or of added tokens, costs the refusal's allocation, not the
			// library's encoding (which makes several per byte), even while another encoding
			// holds the tokenizer.
			hugeAdded := strings.Repeat(tc.added, 32<<20/len(tc.added))
			tk.sem <- struct{}{}
			allocs := testing.AllocsPerRun(3, func() {
				if _, err := tk.EncodeContext(context.Background(), huge, 512); !IsTooLong(err) {
					t.Fatalf("32 MiB under 512 tokens: %v", err)
				}
				if _, err := tk.EncodeContext(context.Background(), hugeAdded, 512); !IsTooLong(err) {
					t.Fatalf("32 MiB of added tokens under 512 tokens: %v", err)
				}
			})
			<-tk.sem
			if allocs > 4 {
				t.Fatalf("refusing 32 MiB allocated %v times", allocs)
			}
		})
	}
}

// A tokenizer whose parts can drop text, or answer a long run of it with one token, has no
// byte bound: a text of any size may fit, so none is refused for its size.
func TestTokenizersThatCanDropTextHaveNoByteBound(t *testing.T) {
	bpe := map[string]any{"type": "BPE", "merges": []any{"a b"}}
	for name, doc := range map[string]map[string]any{
		"BertNormalizer":              {"normalizer": map[string]any{"type": "BertNormalizer"}, "model": bpe},
		"Strip in a Sequence":         {"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{map[string]any{"type": "NFC"}, map[string]any{"type": "Strip"}}}, "model": bpe},
		"Whitespace":                  {"pre_tokenizer": map[string]any{"type": "Whitespace"}, "model": bpe},
		"Split that removes":          {"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "Split", "behavior": "Removed"}}}, "model": bpe},
		"WordPiece":                   {"model": map[string]any{"type": "WordPiece"}},
		"Unigram":                     {"model": map[string]any{"type": "Unigram"}},
		"WordPiece, untyped":          {"model": map[string]any{"vocab": map[string]any{}}, "decoder": map[string]any{"type": "WordPiece"}},
		"an lstrip token":             {"model": bpe, "added_tokens": []any{map[string]any{"content": "<mask>", "lstrip": true}}},
		"UnicodeScripts":              {"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{map[string]any{"type": "UnicodeScripts"}, map[string]any{"type": "ByteLevel"}}}, "model": bpe},
		"Metaspace, no replacement":   {"pre_tokenizer": map[string]any{"type": "Metaspace"}, "model": bpe},
		"Metaspace, replacement \"\"": {"pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": ""}, "model": bpe},
	} {
		if n, why := bytesPerToken(doc); n != 0 || why == "" {
			t.Errorf("%s: %d bytes a token (%q); want no bound", name, n, why)
		}
	}
	if n, why := bytesPerToken(map[string]any{"normalizer": map[string]any{"type": "NFKC"}, "pre_tokenizer": map[string]any{"type": "Metaspace", "replacement": "▁"},
		"model": map[string]any{"type": "BPE", "merges": []any{[]any{"▁a", "bc"}}}}); n != 4*6 || why != "" {
		t.Errorf("NFKC, Metaspace, merge ▁a bc: %d (%q); want 24", n, why)
	}
	if n, why := bytesPerToken(map[string]any{"model": map[string]any{"merges": []any{"abc defg"}}}); n != 7 || why != "" {
		t.Errorf("an untyped model, read as BPE, merge abc defg: %d (%q); want 7", n, why)
	}
}

// UnicodeScripts drops the spaces before a text's first character with a script (the reviewer's
// repro: 1000 spaces and a word are 3 tokens), so a tokenizer with it has no byte bound and such
// a text is encoded, not refused for its size.
func TestUnicodeScriptsDropsTextSoItHasNoByteBound(t *testing.T) {
	data, err := os.ReadFile("testdata/bytelevel_bpe.json")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	doc["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
		map[string]any{"type": "UnicodeScripts"}, doc["pre_tokenizer"]}}
	data, _ = json.Marshal(doc)
	tk, err := ParseHF(data)
	if err != nil {
		t.Fatal(err)
	}
	if tk.BytesPerToken() != 0 || tk.BoundReason() == "" {
		t.Fatalf("%d bytes a token; want no bound", tk.BytesPerToken())
	}
	text := strings.Repeat(" ", 1000) + "hello"
	if got, err := tk.EncodeContext(context.Background(), text, 3); err != nil || len(got) != 3 {
		t.Fatalf("1000 spaces and hello under 3: %v, %v; want 3 tokens", got, err)
	}
}

// With an unknown token merges may join, a token covers a character's bytes (up to 4) for each
// unknown token in it, not the unknown token's own length: here "?" stands for a character
// the vocabulary lacks and the merge "? ?" makes a 6-byte text of two such characters one token,
// which a bound of the strings' lengths (4 bytes a token, the merge being 2) would refuse.
func TestUnknownTokensInMergesCountACharacterEach(t *testing.T) {
	doc := map[string]any{"added_tokens": []any{}, "model": map[string]any{"type": "BPE", "unk_token": "?",
		"vocab": map[string]any{"?": 0, "??": 1, "a": 2}, "merges": []any{"? ?"}}}
	if n, why := bytesPerToken(doc); n != 8 || why != "" {
		t.Fatalf("%d bytes a token (%q); want 8, two unknown characters", n, why)
	}
	data, _ := json.Marshal(doc)
	tk, err := ParseHF(data)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := tk.EncodeContext(context.Background(), "日本", 1); err != nil || !slices.Equal(got, []uint32{1}) {
		t.Fatalf("two unknown characters under 1: %v, %v; want [1]", got, err)
	}
}

// pastBound counts the tokens of HuggingFace's tokenizers: the bytes the model covers, one each,
// and an added token as a token's bytes (4 here), found leftmost-longest, the non-normalized
// ones first and the normalized ones between those; one that must stand alone as a word counts
// as its own bytes when fewer. A text is past a limit exactly when its count exceeds it.
func TestPastBoundCountsAddedTokensAsHuggingFaceDoes(t *testing.T) {
	added := newAddedTokens(map[string]any{"added_tokens": []any{
		map[string]any{"content": "<s>"},
		map[string]any{"content": "ab"},
		map[string]any{"content": "abc"},
		map[string]any{"content": "cd", "normalized": true},
		map[string]any{"content": "ca", "normalized": true},
		map[string]any{"content": "xy", "single_word": true},
	}}, 4)
	for text, want := range map[string]int{
		"":            0,
		"hello":       5,
		"<s><s><s>":   12, // 9 bytes, 3 tokens
		"abcd":        5,  // abc, then d: the longest at the leftmost start
		"cdab":        8,  // ab first, then cd in front of it
		"cabc":        5,  // c, abc: ca would cross abc, which the first pass took
		"xy xy":       5,  // each counted as its 2 bytes, as the model may see them
		"<s>hi<s>!ab": 15,
	} {
		if past, err := pastBound(context.Background(), text, want, added); past || err != nil {
			t.Errorf("%q past %d: %v, %v; want not", text, want, past, err)
		}
		if want == 0 {
			continue
		}
		if past, err := pastBound(context.Background(), text, want-1, added); !past || err != nil {
			t.Errorf("%q past %d: %v, %v; want past", text, want-1, past, err)
		}
	}
}

// The scan ends with the caller's context, among added tokens or plain bytes, long before the
// end of a text within its limit.
func TestPastBoundEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	added := newAddedTokens(map[string]any{"added_tokens": []any{map[string]any{"content": "[CLS]"}}}, 6)
	for name, text := range map[string]string{
		"added tokens": strings.Repeat("[CLS]", 4*checkBytesEvery),
		"plain bytes":  strings.Repeat("!", 4*checkBytesEvery),
	} {
		if past, err := pastBound(ctx, text, 1<<40, added); !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v, %v; want context.Canceled", name, past, err)
		}
	}
}

// One long word is hashed as it is read: the Sim tokenizer's memory follows the tokens it keeps,
// not the text (gathered as runes, a 4 MiB word took 16 MiB).
func TestSimMemoryFollowsTheTokensNotTheText(t *testing.T) {
	word := strings.Repeat("w", 4<<20)
	var got []uint32
	allocs := testing.AllocsPerRun(3, func() {
		got, _ = Sim{}.EncodeContext(context.Background(), word, 8)
	})
	if len(got) != 1 || got[0] == Separator {
		t.Fatalf("%v: want one token", got)
	}
	if allocs > 8 {
		t.Fatalf("one word of 4 MiB made %v allocations", allocs)
	}
}

// endsAfter is a context whose Err turns Canceled after n calls (its Done never closes): an
// encoding that looks at its context only before it starts runs to its end on it.
type endsAfter struct {
	context.Context
	mu sync.Mutex
	n  int
}

func (c *endsAfter) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n--; c.n < 0 {
		return context.Canceled
	}
	return nil
}

// A tokenizer with no byte bound (WordPiece here) encodes a text whatever its size, so its
// encoding must end when its context does, between the pieces the pre-tokenizer split the text
// into, rather than run over the whole text.
func TestAnEncodingWithNoByteBoundEndsWithItsContext(t *testing.T) {
	doc := `{"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null,
		"pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
		"model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
			"vocab": {"[UNK]": 0, "a": 1, "b": 2}}}`
	tk, err := ParseHF([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	if tk.perToken != 0 {
		t.Fatalf("a WordPiece tokenizer with a byte bound of %d: the test needs one with none", tk.perToken)
	}
	text := strings.Repeat("a b ", 10000)
	ids, err := tk.EncodeContext(context.Background(), text, 0)
	if err != nil || len(ids) != 20000 {
		t.Fatalf("%d ids, %v: want 20000", len(ids), err)
	}
	ctx := &endsAfter{Context: context.Background(), n: 10}
	if ids, err := tk.EncodeContext(ctx, text, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("%d ids, %v: want the encoding ended by its context", len(ids), err)
	}
	// The tokenizer is free again, and encodes as before.
	if ids, err := tk.EncodeContext(context.Background(), "a b", 0); err != nil || !slices.Equal(ids, []uint32{1, 2}) {
		t.Fatalf("after the cancelled encoding: %v, %v", ids, err)
	}
}
