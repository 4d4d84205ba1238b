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
	"fmt"
	"strings"
	"unicode/utf8"
)

// A text's size bounds its tokens from below when every byte of it ends up in some token and
// no token covers more than a known number of its bytes: a text longer than max tokens' worth
// of bytes then certainly has more than max tokens and is refused unread, so the work and
// memory an encoding costs follow the lane's ceiling rather than the text (the library holds
// several words of bookkeeping per byte of the text it encodes).
//
// The facts used below are the tokenizer library's (github.com/sugarme/tokenizer v0.3.0):
//   - its NFC, NFD, NFKC and NFKD normalizers leave a text that is already in the form alone
//     and otherwise decompose it (normalizer/normalized.go, NormalizedString.NFC and the others
//     iterate with norm.NFD or norm.NFKD), and Lowercase maps rune to rune (strings.ToLower):
//     each rune of the text (at most 4 bytes) becomes at least one rune (at least 1 byte), so
//     these, and Prepend, never shrink a text to less than a quarter of its bytes;
//   - BertNormalizer, Strip, StripAccents, Replace, Nmt and Precompiled can delete text, and so
//     can the Whitespace, WhitespaceSplit, BertPreTokenizer, CharDelimiterSplit and
//     UnicodeScripts pre-tokenizers (UnicodeScript.PreTokenize drops what comes before the first
//     character with a script, spaces included), a Metaspace without a replacement and a Split
//     or Punctuation that removes its delimiters (pretokenizer/*.go): those tokenizers have no
//     bound;
//   - ByteLevel maps each byte to one character of its alphabet (pretokenizer/bytelevel.go,
//     BytesChar), so behind it a token covers as many bytes as it has runes;
//   - BPE builds a token from single characters and merges (model/bpe/bpe.go, MergeWord): one
//     token is a character, the unknown token standing for one character (the library does not
//     fuse unknown characters, but a merge may join unknown tokens like any others, so each
//     counts as a character's bytes), or a merge's result, never longer than its two parts (with
//     ignore_merges, any vocabulary entry); WordPiece answers a word of any length with one
//     unknown token, and Unigram and WordLevel likewise, so they have no bound;
//   - an added token is matched in the text (added-vocabulary.go) and covers its content, or
//     that and any whitespace around it when it strips (lstrip, rstrip): no bound then; one
//     matched in the normalized text may come from other bytes of the original: no bound
//     when there is a normalizer. Otherwise an occurrence is one token (see pastBound).

// bytesPerToken is the most bytes of the original text one token of the tokenizer.json doc can
// cover, or 0 and why there is no such bound.
func bytesPerToken(doc map[string]any) (int, string) {
	shrink := 1
	if cfg, ok := doc["normalizer"].(map[string]any); ok {
		if why := shrinkingNormalizer(cfg); why != "" {
			return 0, why
		}
		shrink = utf8.UTFMax
	}
	byteLevel := false
	if cfg, ok := doc["pre_tokenizer"].(map[string]any); ok {
		var why string
		if byteLevel, why = keepingPreTokenizer(cfg); why != "" {
			return 0, why
		}
	}
	model, _ := doc["model"].(map[string]any)
	if t := modelType(doc); t != "BPE" {
		return 0, fmt.Sprintf("a %v model can answer a word of any length with one token", t)
	}
	// literal is how many bytes of normalized text a token string stands for, character by
	// character: behind ByteLevel one a character, otherwise one a byte.
	literal := func(s string) int {
		if byteLevel {
			return utf8.RuneCountInString(s)
		}
		return len(s)
	}
	// size is literal, except that the unknown token stands for one character of the text,
	// up to 4 bytes (1 behind ByteLevel), whatever its own length: a token merged from unknown
	// tokens (a merge "? ?" with unk_token "?") covers that many bytes for each of them. Each
	// occurrence of the unknown token's string counts as the larger of the two readings.
	unk, _ := model["unk_token"].(string)
	size := literal
	if unk != "" {
		perChar := utf8.UTFMax
		if byteLevel {
			perChar = 1
		}
		perUnk := max(literal(unk), perChar)
		size = func(s string) int {
			n := strings.Count(s, unk)
			return literal(strings.ReplaceAll(s, unk, "")) + n*perUnk
		}
	}
	longest := utf8.UTFMax // a single character, or the unknown token standing for one
	merges, _ := model["merges"].([]any)
	for _, m := range merges {
		var a, b string
		switch m := m.(type) {
		case string:
			a, b, _ = strings.Cut(m, " ")
		case []any:
			if len(m) == 2 {
				a, _ = m[0].(string)
				b, _ = m[1].(string)
			}
		}
		longest = max(longest, size(a)+size(b))
	}
	if ignore, _ := model["ignore_merges"].(bool); ignore {
		// A word found whole in the vocabulary is one token then, merges or not.
		vocab, _ := model["vocab"].(map[string]any)
		for tok := range vocab {
			longest = max(longest, size(tok))
		}
	}
	added, _ := doc["added_tokens"].([]any)
	for _, a := range added {
		at, _ := a.(map[string]any)
		if l, _ := at["lstrip"].(bool); l {
			return 0, fmt.Sprintf("added token %v takes the whitespace before it", at["content"])
		}
		if r, _ := at["rstrip"].(bool); r {
			return 0, fmt.Sprintf("added token %v takes the whitespace after it", at["content"])
		}
		if n, _ := at["normalized"].(bool); n && shrink > 1 {
			return 0, fmt.Sprintf("added token %v is matched in the normalized text", at["content"])
		}
	}
	return longest * shrink, ""
}

// modelType is the type of doc's model, or, when it has none, the one the library guesses from
// the decoder's (github.com/sugarme/tokenizer pretrained/model.go, CreateModel).
func modelType(doc map[string]any) any {
	model, _ := doc["model"].(map[string]any)
	if t, ok := model["type"]; ok {
		return t
	}
	decoder, _ := doc["decoder"].(map[string]any)
	switch t := decoder["type"]; t {
	case "WordPiece", "WordLevel", "Unigram":
		return t
	}
	return "BPE"
}

// shrinkingNormalizer says why a normalizer may shrink a text below a quarter of its bytes, or ""
// when it cannot.
func shrinkingNormalizer(cfg map[string]any) string {
	switch t := cfg["type"]; t {
	case "NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Prepend":
		return ""
	case "Sequence":
		subs, _ := cfg["normalizers"].([]any)
		for _, s := range subs {
			m, _ := s.(map[string]any)
			if why := shrinkingNormalizer(m); why != "" {
				return why
			}
		}
		return ""
	default:
		return fmt.Sprintf("a %v normalizer can delete text", t)
	}
}

// keepingPreTokenizer says why a pre-tokenizer may drop text, or "" when every byte is kept,
// and whether it maps bytes to ByteLevel's alphabet.
func keepingPreTokenizer(cfg map[string]any) (byteLevel bool, why string) {
	switch t := cfg["type"]; t {
	case "ByteLevel":
		return true, ""
	case "Digits":
		return false, ""
	case "Metaspace":
		// The library reads a missing replacement as "" (pretrained/pretokenizer.go,
		// createMetaspacePreTokenizer), and replacing whitespace with "" deletes it.
		if r, _ := cfg["replacement"].(string); r == "" {
			return false, "a Metaspace pre-tokenizer without a replacement deletes whitespace"
		}
		return false, ""
	case "Split", "Punctuation":
		if cfg["behavior"] == "Removed" {
			return false, fmt.Sprintf("a %v pre-tokenizer removes its delimiters", t)
		}
		return false, ""
	case "Sequence":
		subs, _ := cfg["pretokenizers"].([]any)
		for _, s := range subs {
			m, _ := s.(map[string]any)
			bl, why := keepingPreTokenizer(m)
			if why != "" {
				return false, why
			}
			byteLevel = byteLevel || bl
		}
		return byteLevel, ""
	default:
		return false, fmt.Sprintf("a %v pre-tokenizer can drop text", t)
	}
}

// addedToken is one added token as the scan sees it: its content and what an occurrence of it
// costs against the byte budget (see pastBound).
type addedToken struct {
	content string
	cost    int
}

// addedTokens are doc's added tokens by the pass that matches them (0: those matched in the
// text as it is, 1: those matched in what is left of it, normalized; see pastBound) and their
// first byte, and the longest content of the second pass.
type addedTokens struct {
	byFirst       [2][256][]addedToken
	longestSecond int
	// costsMoreThanItsBytes: some added token counts for more bytes than it has.
	costsMoreThanItsBytes bool
}

// newAddedTokens lists doc's added tokens for pastBound. An occurrence counts as one token,
// perToken bytes of the budget; one that must stand alone as a word (single_word) counts as
// the fewer of that and its own bytes, since HuggingFace's tokenizers leave it to the model,
// as text, where it touches a word.
func newAddedTokens(doc map[string]any, perToken int) *addedTokens {
	out := new(addedTokens)
	added, _ := doc["added_tokens"].([]any)
	for _, a := range added {
		at, _ := a.(map[string]any)
		c, _ := at["content"].(string)
		if c == "" {
			continue
		}
		cost := perToken
		if single, _ := at["single_word"].(bool); single {
			cost = min(cost, len(c))
		}
		out.costsMoreThanItsBytes = out.costsMoreThanItsBytes || cost > len(c)
		pass := 0
		if n, _ := at["normalized"].(bool); n {
			pass = 1
			out.longestSecond = max(out.longestSecond, len(c))
		}
		out.byFirst[pass][c[0]] = append(out.byFirst[pass][c[0]], addedToken{content: c, cost: cost})
	}
	return out
}

// longestAt is the length and cost of the longest added token of the pass that text begins
// with, or 0.
func (a *addedTokens) longestAt(pass int, text string) (n, cost int) {
	if text == "" {
		return 0, 0
	}
	for _, t := range a.byFirst[pass][text[0]] {
		if len(t.content) > n && strings.HasPrefix(text, t.content) {
			n, cost = len(t.content), t.cost
		}
	}
	return n, cost
}

// checkBytesEvery is how many steps pastBound takes between two looks at its context.
const checkBytesEvery = 1 << 16

// pastBound reports whether text certainly has more than limit/p tokens, p being the most bytes
// a token covers and limit MaxBytes's answer, a whole number of tokens' bytes: whether the bytes
// the model must cover, plus p for each added token found, exceed limit. That is exact: with o
// such bytes and k added tokens the text has at least ceil(o/p) + k tokens, which exceeds the
// budget limit/p exactly when o + k*p exceeds limit.
//
// Added tokens are found as HuggingFace's tokenizers find them (huggingface/tokenizers,
// tokenizers/src/tokenizer/added_vocabulary.rs, extract_and_normalize and find_matches): the
// non-normalized ones first, leftmost-longest and without overlap, then the normalized ones
// likewise in the pieces between those (bytesPerToken gives no bound where a normalizer could
// make the two texts differ). Each occurrence is a token there, so it counts as one here.
// The library (github.com/sugarme/tokenizer v0.3.0, added-vocabulary.go) instead drops the
// added tokens it finds, a defect of its own: counting them as nothing would let a text of
// nothing but added tokens through at any size, and its findMatches re-sorts the remaining
// matches once per match, under the tokenizer's lock, with no look at the caller's context.
//
// The scan allocates nothing and stops at the first byte past the limit, or with ctx's error.
func pastBound(ctx context.Context, text string, limit int, added *addedTokens) (bool, error) {
	// s0, e0 and c0 are the next first-pass match at or after i (s0 < 0: none found up to q,
	// the first pass's cursor). The first pass is looked ahead of i only as far as a
	// second-pass match from i could reach, so the scan's work follows i, which the limit bounds.
	cost, steps := 0, 0
	s0, e0, c0, q := -1, 0, 0, 0
	for i := 0; i < len(text); {
		for upTo := min(len(text), i+max(added.longestSecond, 1)); s0 < 0 && q < upTo; q++ {
			if steps++; steps%checkBytesEvery == 0 {
				if err := ctx.Err(); err != nil {
					return false, err
				}
			}
			if n, c := added.longestAt(0, text[q:]); n > 0 {
				s0, e0, c0 = q, q+n, c
				break
			}
		}
		if steps++; steps%checkBytesEvery == 0 {
			if err := ctx.Err(); err != nil {
				return false, err
			}
		}
		if s0 == i {
			cost += c0
			i, q, s0 = e0, e0, -1
		} else {
			end := len(text)
			if s0 >= 0 {
				end = s0 // a second-pass match does not cross a first-pass one
			}
			if n, c := added.longestAt(1, text[i:end]); n > 0 {
				cost += c
				i += n
			} else {
				cost++
				i++
			}
		}
		if cost > limit {
			return true, nil
		}
	}
	return false, nil
}
