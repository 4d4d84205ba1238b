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
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
	hf "github.com/sugarme/tokenizer"
	"github.com/sugarme/tokenizer/normalizer"
	"github.com/sugarme/tokenizer/pretokenizer"
	"github.com/sugarme/tokenizer/pretrained"
)

// HF is a model's own tokenizer, read from its tokenizer.json with github.com/sugarme/tokenizer
// (the maintained pure-Go reader of that format). Two of the format's pre-tokenizers that the
// library does not reproduce exactly are built here from its parts instead: a Split whose
// pattern Go's regexp cannot compile (Qwen's uses a lookahead) runs on regexp2, and a
// ByteLevel with use_regex false only maps bytes, as it should, rather than splitting again.
// Anything else the library cannot read is refused with an error naming it.
type HF struct {
	// sem serialises encodings (the library's tokenizer keeps mutable state between calls);
	// a channel rather than a mutex, so that waiting for it ends with the caller's context.
	sem chan struct{}
	tk  *hf.Tokenizer
	// cur is the context of the encoding that holds sem, which the regexp2 patterns look at
	// between matches: the library's pre-tokenizers have no way to return an error.
	cur *encodeState
	// perToken is the most bytes of text one token covers (0: no bound, for noBound's reason);
	// specials the tokens the post-processor adds to every text. See bound.go.
	perToken, specials int
	noBound            string
	// added are the added tokens, each occurrence of which counts as one token against the
	// bound (see pastBound).
	added *addedTokens
}

type encodeState struct{ ctx context.Context }

// MatchTimeout bounds one regexp2 match of a Split pattern. regexp2 backtracks, so a pattern
// and text chosen together could otherwise run for minutes; a match that takes longer refuses
// the text (a real pre-tokenizer pattern matches one piece in microseconds).
const MatchTimeout = time.Second

// ErrMatchTimeout is a text the pre-tokenizer's pattern took over MatchTimeout to match once.
var ErrMatchTimeout = errors.New("the pre-tokenizer's pattern took too long to match this text")

// stopped carries an encoding's end out of the library, which has no error path there.
type stopped struct{ err error }

// LoadHF reads a tokenizer.json.
func LoadHF(path string) (*HF, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseHF(data)
}

// ParseHF reads the contents of a tokenizer.json. One that truncates or pads is refused with a
// *LimitsError (StripLimits removes both, as the converter does).
func ParseHF(data []byte) (t *HF, err error) {
	var sections map[string]json.RawMessage
	if err := json.Unmarshal(data, &sections); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if l := limitsOf(sections); !l.Empty() {
		return nil, &LimitsError{Limits: l}
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	perToken, noBound := bytesPerToken(doc)
	var pre hf.PreTokenizer
	st := &encodeState{ctx: context.Background()}
	if cfg, ok := doc["pre_tokenizer"].(map[string]any); ok && needsOwnPreTokenizer(cfg) {
		if pre, err = buildPreTokenizer(cfg, st); err != nil {
			return nil, fmt.Errorf("tokenizer.json: pre_tokenizer: %w", err)
		}
		doc["pre_tokenizer"] = nil
		if data, err = json.Marshal(doc); err != nil {
			return nil, err
		}
	}
	// The library panics on configurations it does not expect; that is a refusal here.
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("tokenizer.json: the tokenizer library cannot read it: %v", r)
		}
	}()
	tk, err := pretrained.FromReader(strings.NewReader(string(data)))
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if pre != nil {
		tk.WithPreTokenizer(pre)
	}
	// The model is asked for each piece the pre-tokenizer split the text into: there the
	// encoding looks at its context, so that a long text's encoding ends with its call's
	// deadline whatever the tokenizer (a WordPiece or Unigram one has no byte bound, so its
	// text is encoded whatever its size).
	tk.WithModel(cancellableModel{Model: tk.GetModel(), st: st})
	t = &HF{tk: tk, sem: make(chan struct{}, 1), cur: st, perToken: perToken, noBound: noBound, added: newAddedTokens(doc, perToken)}
	if perToken > 0 {
		// The empty text's tokens are exactly what the post-processor adds to every text.
		if empty, err := t.Encode(""); err != nil {
			t.perToken, t.noBound = 0, fmt.Sprintf("the empty text cannot be encoded to count the special tokens: %v", err)
		} else {
			t.specials = len(empty)
		}
	}
	return t, nil
}

// MaxBytes is the size in bytes past which a text certainly has more than max tokens, so that
// it is refused without being encoded, each added token it holds counting as BytesPerToken
// bytes whatever its length (see pastBound); false when the tokenizer has no such bound
// (BoundReason says why), or max is not a bound.
func (t *HF) MaxBytes(max int) (int, bool) {
	if t.perToken == 0 || max <= 0 {
		return 0, false
	}
	// At least specials + ceil(n/perToken) tokens for a text of n bytes.
	return (max - t.specials) * t.perToken, true
}

// BytesPerToken is the most bytes of text one token covers (0: no bound).
func (t *HF) BytesPerToken() int { return t.perToken }

// BoundReason says why the tokenizer has no bound on the bytes a token covers ("" if it has).
func (t *HF) BoundReason() string { return t.noBound }

// Encode is EncodeContext without a context or bound.
func (t *HF) Encode(text string) ([]uint32, error) {
	return t.EncodeContext(context.Background(), text, 0)
}

// EncodeContext implements Tokenizer: the ids of text with the tokenizer's special tokens (its
// post-processor's template). A text past MaxBytes(max), its added tokens counted as one
// token each, is refused for its size before anything else (a scan that stops past the
// bound); otherwise the library encodes it whole, and the bound on tokens is checked on its
// result. That scan, the wait for the tokenizer and each regexp2 match end with ctx.
func (t *HF) EncodeContext(ctx context.Context, text string, max int) (ids []uint32, err error) {
	// An added token shorter than a token's worth of bytes counts for more than its length,
	// so a text within the limit's bytes may still be past it.
	if limit, ok := t.MaxBytes(max); ok && (len(text) > limit || t.added.costsMoreThanItsBytes) {
		past, err := pastBound(ctx, text, limit, t.added)
		if err != nil {
			return nil, err
		}
		if past {
			return nil, &TooLongError{Max: max, Bytes: len(text)}
		}
	}
	if !utf8.ValidString(text) {
		return nil, fmt.Errorf("the text is not valid UTF-8")
	}
	select {
	case t.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	t.cur.ctx = ctx
	defer func() {
		t.cur.ctx = context.Background()
		<-t.sem
	}()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer func() {
		if r := recover(); r != nil {
			if s, ok := r.(stopped); ok {
				ids, err = nil, s.err
				return
			}
			ids, err = nil, fmt.Errorf("the tokenizer cannot encode this text: %v", r)
		}
	}()
	enc, err := t.tk.EncodeSingle(text, true)
	if err != nil {
		return nil, err
	}
	if max > 0 && len(enc.Ids) > max {
		return nil, &TooLongError{Max: max, Tokens: len(enc.Ids)}
	}
	ids = make([]uint32, len(enc.Ids))
	for i, id := range enc.Ids {
		if id < 0 {
			return nil, fmt.Errorf("the tokenizer produced id %d", id)
		}
		ids[i] = uint32(id)
	}
	return ids, nil
}

// needsOwnPreTokenizer reports whether cfg holds a pre-tokenizer the library would get wrong.
func needsOwnPreTokenizer(cfg map[string]any) bool {
	switch cfg["type"] {
	case "Sequence":
		subs, _ := cfg["pretokenizers"].([]any)
		for _, s := range subs {
			if m, ok := s.(map[string]any); ok && needsOwnPreTokenizer(m) {
				return true
			}
		}
	case "Split":
		p, _ := cfg["pattern"].(map[string]any)
		if re, ok := p["Regex"].(string); ok {
			_, err := regexp.Compile(re)
			return err != nil
		}
	case "ByteLevel":
		useRegex, ok := cfg["use_regex"].(bool)
		return ok && !useRegex
	}
	return false
}

// buildPreTokenizer builds the Sequence, Split and ByteLevel pre-tokenizers from cfg; other
// kinds are refused (they appear here only inside a configuration that needed its own).
func buildPreTokenizer(cfg map[string]any, st *encodeState) (hf.PreTokenizer, error) {
	switch cfg["type"] {
	case "Sequence":
		subs, _ := cfg["pretokenizers"].([]any)
		var out []hf.PreTokenizer
		for _, s := range subs {
			m, ok := s.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("a Sequence member is not an object")
			}
			p, err := buildPreTokenizer(m, st)
			if err != nil {
				return nil, err
			}
			out = append(out, p)
		}
		return pretokenizer.NewSequence(out), nil
	case "Split":
		p, _ := cfg["pattern"].(map[string]any)
		var pattern normalizer.Pattern
		if re, ok := p["Regex"].(string); ok {
			compiled, err := regexp2.Compile(re, regexp2.Unicode)
			if err != nil {
				return nil, fmt.Errorf("Split pattern %q: %w", re, err)
			}
			compiled.MatchTimeout = MatchTimeout
			pattern = regexp2Pattern{re: compiled, st: st}
		} else if s, ok := p["String"].(string); ok {
			pattern = normalizer.NewRegexpPattern(regexp.QuoteMeta(s))
		} else {
			return nil, fmt.Errorf("a Split pattern is neither Regex nor String")
		}
		behaviors := map[string]normalizer.SplitDelimiterBehavior{"Removed": normalizer.RemovedBehavior, "Isolated": normalizer.IsolatedBehavior,
			"MergedWithNext": normalizer.MergedWithNextBehavior, "MergedWithPrevious": normalizer.MergedWithPreviousBehavior, "Contiguous": normalizer.ContiguousBehavior}
		b, ok := behaviors[fmt.Sprint(cfg["behavior"])]
		if !ok {
			return nil, fmt.Errorf("Split behavior %v", cfg["behavior"])
		}
		invert, _ := cfg["invert"].(bool)
		return pretokenizer.NewSplit(pattern, b, invert), nil
	case "ByteLevel":
		prefix, _ := cfg["add_prefix_space"].(bool)
		if useRegex, ok := cfg["use_regex"].(bool); ok && !useRegex {
			return byteLevelOnly{addPrefixSpace: prefix}, nil
		}
		trim, _ := cfg["trim_offsets"].(bool)
		return &pretokenizer.ByteLevel{AddPrefixSpace: prefix, TrimOffsets: trim}, nil
	default:
		return nil, fmt.Errorf("pre-tokenizer %v beside a pattern Go cannot compile is not supported", cfg["type"])
	}
}

// regexp2Pattern is a Split pattern on regexp2, for the lookaheads Go's regexp does not have.
// Its offsets are bytes, as the library's own patterns' are. A match that times out, or an
// encoding whose context ends, stops the encoding with an error: a text split on a partial list
// of matches would be tokenised wrongly without a word.
type regexp2Pattern struct {
	re *regexp2.Regexp
	st *encodeState
}

func (p regexp2Pattern) FindMatches(inside string) []normalizer.OffsetsMatch {
	if inside == "" {
		return []normalizer.OffsetsMatch{{Offsets: []int{0, 0}, Match: false}}
	}
	// regexp2 reports rune positions; the library wants byte offsets.
	runeToByte := make([]int, 0, len(inside)+1)
	for i := range inside {
		runeToByte = append(runeToByte, i)
	}
	runeToByte = append(runeToByte, len(inside))
	var out []normalizer.OffsetsMatch
	prev := 0
	m, err := p.re.FindStringMatch(inside)
	for err == nil && m != nil {
		if cerr := p.st.ctx.Err(); cerr != nil {
			panic(stopped{cerr})
		}
		start, end := runeToByte[m.Index], runeToByte[m.Index+m.Length]
		if start > prev {
			out = append(out, normalizer.OffsetsMatch{Offsets: []int{prev, start}, Match: false})
		}
		if end > start {
			out = append(out, normalizer.OffsetsMatch{Offsets: []int{start, end}, Match: true})
		}
		prev = end
		m, err = p.re.FindNextMatch(m)
	}
	if err != nil {
		// Not regexp2's error: it quotes the whole text it was matching, which would go back
		// to the caller in its refusal (and into the log) at any size.
		panic(stopped{fmt.Errorf("%w (%s on one match)", ErrMatchTimeout, MatchTimeout)})
	}
	if prev < len(inside) {
		out = append(out, normalizer.OffsetsMatch{Offsets: []int{prev, len(inside)}, Match: false})
	}
	return out
}

// cancellableModel is the tokenizer's model, which stops the encoding (see stopped) once the
// encoding's context has ended.
type cancellableModel struct {
	hf.Model
	st *encodeState
}

func (m cancellableModel) Tokenize(sequence string) ([]hf.Token, error) {
	if err := m.st.ctx.Err(); err != nil {
		panic(stopped{err})
	}
	return m.Model.Tokenize(sequence)
}

// byteLevelOnly is ByteLevel with use_regex false: each byte of the text becomes its
// printable stand-in, with no further splitting.
type byteLevelOnly struct{ addPrefixSpace bool }

func (b byteLevelOnly) PreTokenize(pts *hf.PreTokenizedString) (*hf.PreTokenizedString, error) {
	if b.addPrefixSpace {
		pts = pts.Split(func(_ int, n *normalizer.NormalizedString) []hf.SplitIdx {
			if !strings.HasPrefix(n.GetNormalized(), " ") {
				n = n.Prepend(" ")
			}
			return []hf.SplitIdx{{Normalized: n}}
		})
	}
	return pts.Normalize(func(n *normalizer.NormalizedString) *normalizer.NormalizedString {
		var changes []normalizer.ChangeMap
		for _, r := range n.GetNormalized() {
			for i, c := range []byte(string(r)) {
				change := 0
				if i > 0 {
					change = 1
				}
				changes = append(changes, normalizer.ChangeMap{RuneVal: pretokenizer.BytesChar[c], Changes: change})
			}
		}
		return n.Transform(changes, 0)
	}), nil
}
