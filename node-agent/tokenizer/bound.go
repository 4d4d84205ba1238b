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
//     can the Whitespace, WhitespaceSplit, BertPreTokenizer and CharDelimiterSplit
//     pre-tokenizers and a Split or Punctuation that removes its delimiters
//     (pretokenizer/*.go): those tokenizers have no bound;
//   - ByteLevel maps each byte to one character of its alphabet (pretokenizer/bytelevel.go,
//     BytesChar), so behind it a token covers as many bytes as it has runes;
//   - BPE builds a token from single characters and merges (model/bpe/bpe.go, MergeWord): one
//     token is a character, the unknown token standing for one character (the library does not
//     fuse unknown characters), or a merge's result, never longer than its two parts (with
//     ignore_merges, any vocabulary entry); WordPiece answers a word of any length with one
//     unknown token, and Unigram and WordLevel likewise, so they have no bound;
//   - an added token is matched in the text (added-vocabulary.go) and covers its content, or
//     that and any whitespace around it when it strips (lstrip, rstrip): no bound then; one
//     matched in the normalized text may come from other bytes of the original: no bound
//     when there is a normalizer. The library drops the added tokens it matches (see
//     addedTokens), so their bytes are not counted.

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
	// size is how many bytes of normalized text a token string stands for.
	size := func(s string) int {
		if byteLevel {
			return utf8.RuneCountInString(s)
		}
		return len(s)
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
	case "Metaspace", "Digits", "UnicodeScripts":
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

// addedTokens are the contents of doc's added tokens by their first byte. The library drops
// an added token it finds in a text (a text of N of them encodes to the post-processor's
// tokens alone), so the bytes they may cover are not counted against the bound.
func addedTokens(doc map[string]any) *[256][]string {
	out := new([256][]string)
	added, _ := doc["added_tokens"].([]any)
	for _, a := range added {
		at, _ := a.(map[string]any)
		if c, _ := at["content"].(string); c != "" {
			out[c[0]] = append(out[c[0]], c)
		}
	}
	return out
}

// checkBytesEvery is how many bytes pastBound reads between two looks at its context.
const checkBytesEvery = 1 << 16

// pastBound reports whether text has more than limit bytes outside every occurrence of an
// added token: a lower bound on the bytes the model must cover, whichever occurrences the
// library matches. It stops at the limit's next byte, or with ctx's error.
func pastBound(ctx context.Context, text string, limit int, added *[256][]string) (bool, error) {
	kept, covered := 0, 0
	for i := 0; i < len(text); i++ {
		if i%checkBytesEvery == checkBytesEvery-1 {
			if err := ctx.Err(); err != nil {
				return false, err
			}
		}
		for _, a := range added[text[i]] {
			if strings.HasPrefix(text[i:], a) {
				covered = max(covered, i+len(a))
			}
		}
		if i >= covered {
			if kept++; kept > limit {
				return true, nil
			}
		}
	}
	return false, nil
}
