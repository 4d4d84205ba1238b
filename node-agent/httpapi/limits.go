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

package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

// DefaultMaxBatchTokens bounds the tokens of one call on a lane that sets no bound of its own
// (TEI's max_batch_tokens plays this part); a lane's bound is never below its ceiling.
const DefaultMaxBatchTokens = 65536

// CodeBatchTooLarge refuses a call whose inputs together have more tokens than its lane takes in
// one call (413): split it into smaller calls.
const CodeBatchTooLarge = "batch_too_large"

// maxBatchTokens is the lane's bound on one call's tokens.
func (l Lane) maxBatchTokens() int {
	n := l.MaxBatchTokens
	if n <= 0 {
		n = DefaultMaxBatchTokens
	}
	return max(n, l.Ceiling)
}

// reader reads a call's inputs into token sequences for one lane, under the lane's limits: each
// input is bounded by the ceiling and all of them by the batch bound while they are read, and
// the lane's deadline bounds the tokenizer's work.
type reader struct {
	ctx  context.Context
	lane Lane
	// left is what the call may still have of the lane's batch bound.
	left int
}

func newReader(ctx context.Context, lane Lane) *reader {
	return &reader{ctx: ctx, lane: lane, left: lane.maxBatchTokens()}
}

// tooLong says an input has more tokens than the lane's ceiling. While routing it rules one lane
// out; it is the call's answer (unsupported_shape) when no lane is left.
type tooLong struct {
	lane Lane
	what string
	max  int
	// tokens is the input's count when it is known (token ids are counted without being read);
	// bytes its size when it was refused for that, unread (no ceiling's worth of tokens covers it).
	tokens, bytes int
}

func (e *tooLong) Error() string {
	return fmt.Sprintf("%s has more tokens than lane %s takes (%d); it is not truncated", e.what, e.lane.Key, e.max)
}

func (e *tooLong) refusal() error {
	if e.bytes > 0 {
		return refusal.New(refusal.UnsupportedShape, e.lane.Key, "%s has %d bytes, more than the %d tokens the lane's ceiling leaves it can hold; it is not truncated", e.what, e.bytes, e.max)
	}
	if e.tokens > 0 {
		return refusal.New(refusal.UnsupportedShape, e.lane.Key, "%s has %d tokens, more than the %d the lane's ceiling leaves it; it is not truncated", e.what, e.tokens, e.max)
	}
	return refusal.New(refusal.UnsupportedShape, e.lane.Key, "%s has more than the %d tokens the lane's ceiling leaves it; it is not truncated", e.what, e.max)
}

// over is the refusal of an input that did not fit in max tokens: past what the batch has left
// when that was the tighter bound, else over the ceiling.
func (r *reader) over(what string, max int) error {
	if r.left < r.lane.Ceiling {
		return r.batchTooLarge()
	}
	return &tooLong{lane: r.lane, what: what, max: max}
}

func (r *reader) batchTooLarge() error {
	n := r.lane.maxBatchTokens()
	return &apiError{status: http.StatusRequestEntityTooLarge, code: CodeBatchTooLarge, param: "input", message: fmt.Sprintf(
		"the call's inputs have more than %d tokens together, which lane %s takes in one call (its maxBatchTokens); split it into smaller calls", n, r.lane.Key)}
}

// charge counts n tokens against the batch bound.
func (r *reader) charge(n int) error {
	if n > r.left {
		return r.batchTooLarge()
	}
	r.left -= n
	return nil
}

// text tokenises one text: at most the ceiling's tokens, and at most what the batch has left.
func (r *reader) text(text, param, what string) ([]uint32, error) {
	return r.textWithin(text, param, what, min(r.lane.Ceiling, r.left), 0)
}

// textWithin tokenises one text within max tokens and charges it with extra more (a rerank
// pair's query and separator).
func (r *reader) textWithin(text, param, what string, max, extra int) ([]uint32, error) {
	if r.lane.Tokenizer == nil {
		return nil, badRequest("text_input_unsupported", param, fmt.Sprintf("lane %s has no tokenizer: send token ids", r.lane.Key))
	}
	if max < 1 {
		return nil, r.over(what, max)
	}
	ids, err := r.lane.Tokenizer.EncodeContext(r.ctx, text, max)
	var tl *tokenizer.TooLongError
	switch {
	case errors.As(err, &tl):
		err := r.over(what, max)
		if e, ok := err.(*tooLong); ok && tl.Tokens == 0 {
			e.bytes = tl.Bytes
		}
		return nil, err
	case errors.Is(r.ctx.Err(), context.DeadlineExceeded):
		// Passed during the tokenising, or before it (the call's deadline runs from its
		// arrival): a text encoded whole after it is not run either.
		return nil, refusal.New(refusal.DeadlineExceeded, r.lane.Key, "the request's deadline passed while its text was tokenised")
	case r.ctx.Err() != nil:
		return nil, r.ctx.Err()
	case err != nil:
		return nil, &apiError{status: http.StatusUnprocessableEntity, code: "tokenization_failed", param: param, message: fmt.Sprintf("%s: %s", what, tokenizerReason(err))}
	}
	return ids, r.charge(len(ids) + extra)
}

// ids reads one input of token ids from the body: at most the ceiling's, and at most what the
// batch has left.
func (r *reader) ids(arr []byte, param, what string) ([]uint32, error) {
	max := min(r.lane.Ceiling, r.left)
	ids, err := tokenIDs(arr, max)
	switch {
	case errors.Is(err, errTooManyIDs):
		err := r.over(what, max)
		if tl, ok := err.(*tooLong); ok {
			tl.tokens = countElementsUpTo(arr, 0) // a scan that reads no id, so the answer can say how many
		}
		return nil, err
	case err != nil:
		return nil, badRequest("invalid_request", param, fmt.Sprintf("%s: %v", what, err))
	}
	return ids, r.charge(len(ids))
}

// inputSize refuses an input whose size alone is past the lane's bounds: an array of token ids
// longer than the ceiling (or what the batch bound leaves), or a batch of more than MaxInputs
// inputs. It counts elements without reading them, and it runs before the input is checked as
// JSON (its bytes may not be JSON at all): an input it cannot count is left to that check.
func (r *reader) inputSize(raw []byte) error {
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil
	}
	first := skipSpace(raw, i+1)
	if first >= len(raw) {
		return nil
	}
	switch c := raw[first]; {
	case c >= '0' && c <= '9':
		// Counted whole, so the answer can say how many (a scan of a byte or two an id, far
		// less than reading them); an element that is not an id leaves the input to the
		// parse, which says what is wrong with it.
		max := min(r.lane.Ceiling, r.left)
		if n, err := countUpTo(raw[i:], 0, digits); err == nil && n > max {
			err := r.over("input", max)
			if tl, ok := err.(*tooLong); ok {
				tl.tokens = n
			}
			return err
		}
	case c == '"' || c == '[':
		if n, err := countUpTo(raw[i:], MaxInputs+1, nil); err == nil && n > MaxInputs {
			return tooManyInputs()
		}
	}
	return nil
}

// MaxReasonBytes bounds a tokenizer's reason in a refusal: a tokenizer's error may quote the
// text it could not encode, which the caller sent and need not get back at any size.
const MaxReasonBytes = 256

// tokenizerReason is err's text, cut at MaxReasonBytes (on a character's boundary) and marked
// so.
func tokenizerReason(err error) string {
	msg := err.Error()
	if len(msg) <= MaxReasonBytes {
		return msg
	}
	cut := MaxReasonBytes
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + fmt.Sprintf("... (%d more bytes)", len(msg)-cut)
}
