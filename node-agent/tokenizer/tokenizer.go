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

// Package tokenizer turns text into token ids. The sim backend's models use Sim, a simple
// deterministic tokenizer; real models bring their own in their artifact. Token-id input
// bypasses tokenisation altogether.
package tokenizer

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"unicode"
	"unicode/utf8"
)

// Tokenizer encodes text. An error means the text cannot be encoded by this tokenizer (its
// vocabulary lacks a character, say); the caller refuses the input rather than drop it.
type Tokenizer interface {
	// EncodeContext encodes text, giving up with ctx's error once ctx ends and with a
	// *TooLongError once the text is known to have more than max tokens (max <= 0: no bound),
	// so a request's deadline and its lane's ceiling bound the work and memory one text costs.
	EncodeContext(ctx context.Context, text string, max int) ([]uint32, error)
}

// TooLongError says a text has more tokens than the bound it was encoded under.
type TooLongError struct {
	// Max is the bound; Tokens what was counted before encoding stopped (at least Max+1), or 0
	// when the text was refused unread for its size, Bytes, which no Max tokens can cover.
	Max, Tokens, Bytes int
}

func (e *TooLongError) Error() string {
	if e.Tokens == 0 {
		return fmt.Sprintf("the text has over %d tokens (its %d bytes cannot fit in fewer)", e.Max, e.Bytes)
	}
	return fmt.Sprintf("the text has over %d tokens (%d counted before encoding stopped)", e.Max, e.Tokens)
}

// IsTooLong reports whether err is a *TooLongError.
func IsTooLong(err error) bool {
	var t *TooLongError
	return errors.As(err, &t)
}

// checkEvery is how many runes the Sim tokenizer reads between two looks at its context.
const checkEvery = 4096

// Separator is the token id reserved between a rerank query and its document; Sim never
// produces it.
const Separator = 0

// Sim splits text into words (runs of letters and digits, lower-cased) and single other
// non-space characters, and maps each to an id in [1, Vocabulary) by hashing. Equal text gives
// equal ids on every machine.
type Sim struct {
	// Vocabulary is the number of ids, the separator included; 30522 if zero.
	Vocabulary uint32
}

// Encode encodes text without a bound; Sim encodes every text.
func (s Sim) Encode(text string) ([]uint32, error) { return s.ids(text), nil }

// EncodeContext implements Tokenizer: it stops at the max+1st token, so an oversize text costs
// no more than max+1 ids, and looks at ctx every few thousand characters.
func (s Sim) EncodeContext(ctx context.Context, text string, max int) ([]uint32, error) {
	return s.encode(ctx, text, max)
}

func (s Sim) ids(text string) []uint32 {
	ids, _ := s.encode(context.Background(), text, 0)
	return ids
}

func (s Sim) encode(ctx context.Context, text string, max int) ([]uint32, error) {
	vocab := s.Vocabulary
	if vocab == 0 {
		vocab = 30522
	}
	var out []uint32
	id := func(word string) uint32 {
		h := fnv.New32a()
		h.Write([]byte(word))
		return 1 + h.Sum32()%(vocab-1)
	}
	// A word is hashed as it is read, rune by rune, rather than gathered first: one long word
	// costs no memory (gathered as runes it took four times its bytes).
	word, inWord := fnv.New32a(), false
	var buf [utf8.UTFMax]byte
	flush := func() {
		if inWord {
			out = append(out, 1+word.Sum32()%(vocab-1))
			word.Reset()
			inWord = false
		}
	}
	for i, runes := 0, 0; i < len(text); runes++ {
		if runes%checkEvery == checkEvery-1 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
		}
		if max > 0 && len(out) > max {
			return nil, &TooLongError{Max: max, Tokens: len(out)}
		}
		r, n := utf8.DecodeRuneInString(text[i:])
		i += n
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			word.Write(utf8.AppendRune(buf[:0], unicode.ToLower(r)))
			inWord = true
		case unicode.IsSpace(r):
			flush()
		default:
			flush()
			out = append(out, id(string(r)))
		}
	}
	flush()
	if max > 0 && len(out) > max {
		return nil, &TooLongError{Max: max, Tokens: len(out)}
	}
	return out, nil
}
