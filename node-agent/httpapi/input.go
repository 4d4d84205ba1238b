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
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// rawJSON is a field's JSON kept as a slice of the request body it was read from. The body is
// read once into a buffer this package owns and decoded with json.Unmarshal, which hands an
// Unmarshaler a slice of that buffer; keeping it (rather than json.RawMessage's copy) means the
// inputs are read from the body itself, with no copy in between whose size follows the body's.
type rawJSON []byte

func (r *rawJSON) UnmarshalJSON(b []byte) error {
	*r = b
	return nil
}

// The scanner below looks only at what tells values apart. It walks JSON that json.Unmarshal or
// json.Valid has checked, and also, to refuse an input for its size before it is checked (a
// body of 600 KB of token ids costs two passes of encoding/json's scanner, and a flood of them
// took most of the agent's CPU), bytes that may not be JSON at all: on those it never reads past
// the slice or loops, and it says so (errMalformed) where it can tell; it never accepts them, as
// what it lets through is checked before anything runs.

// skipSpace returns the index of the first non-space byte of b at or after i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd returns the index just past the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '[', '{':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = stringEnd(b, i)
				continue
			case '[', '{':
				depth++
			case ']', '}':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default:
		for i < len(b) && b[i] != ',' && b[i] != ']' && b[i] != '}' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
			i++
		}
		return i
	}
}

// stringEnd returns the index just past the string that starts at b[i] (a quote), or len(b) if
// the string does not end.
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// errMalformed stops a walk over bytes that are not the JSON it expects.
var errMalformed = errors.New("not well-formed JSON")

// elements calls f with each element of the array that starts at b[i], in order, until f
// returns an error; it returns errMalformed where the array does not read as one.
func elements(b []byte, i int, f func(elem []byte) error) error {
	i = skipSpace(b, i+1) // past '['
	for i < len(b) && b[i] != ']' {
		end := valueEnd(b, i)
		if end <= i || end > len(b) {
			return errMalformed
		}
		if err := f(b[i:end]); err != nil {
			return err
		}
		i = skipSpace(b, end)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] != ']':
			return errMalformed
		}
	}
	if i >= len(b) {
		return errMalformed
	}
	return nil
}

// deferValue finds, in a body that is a JSON object, the value of the top-level key that names
// field as encoding/json matches one (case-insensitively; the last occurrence wins), without
// reading that value: it returns the body with the value replaced by null, for json.Unmarshal
// to check and decode, and the value itself, which the caller checks (json.Valid) before it
// runs anything from it. ok is false when the body does not read as such an object, or the
// value is not most of it; the caller then decodes the body whole. Whatever deferValue makes of bytes that are not JSON, the two
// checks together pass only a body json.Valid passes: the value replaced is one whole value
// token of the rest.
func deferValue(body []byte, field string) (rest, value []byte, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, nil, false
	}
	start, end := -1, -1
	for i = skipSpace(body, i+1); ; {
		if i >= len(body) || body[i] != '"' {
			return nil, nil, false
		}
		keyEnd := stringEnd(body, i)
		if keyEnd > len(body) || body[keyEnd-1] != '"' || keyEnd-i < 2 || bytes.IndexByte(body[i:keyEnd], '\\') >= 0 {
			// A key with an escape is left to the decoder: clients do not send one, and
			// reading each with json.Unmarshal made a body of such keys cost more than the
			// decoder's own pass.
			return nil, nil, false
		}
		key, err := jsonString(body[i:keyEnd])
		if err != nil {
			return nil, nil, false
		}
		if i = skipSpace(body, keyEnd); i >= len(body) || body[i] != ':' {
			return nil, nil, false
		}
		if i = skipSpace(body, i+1); i >= len(body) {
			return nil, nil, false
		}
		vEnd := valueEnd(body, i)
		if vEnd <= i || vEnd > len(body) {
			return nil, nil, false
		}
		if strings.EqualFold(key, field) {
			start, end = i, vEnd
		}
		if i = skipSpace(body, vEnd); i >= len(body) {
			return nil, nil, false
		}
		if body[i] == '}' {
			break
		}
		if body[i] != ',' {
			return nil, nil, false
		}
		i = skipSpace(body, i+1)
	}
	// Only a value that is most of the body is worth it: the rest is copied, so a body whose
	// bulk is in another field (an unknown one, say) would cost a copy of that bulk and the
	// decoder's pass over it all the same.
	if skipSpace(body, i+1) != len(body) || start < 0 || 2*(end-start) < len(body) {
		return nil, nil, false
	}
	rest = make([]byte, 0, len(body)-(end-start)+len("null"))
	rest = append(append(append(rest, body[:start]...), "null"...), body[end:]...)
	return rest, body[start:end], true
}

// countElementsUpTo counts the elements of the array that starts at b[0] without reading them,
// up to limit (limit <= 0: all), in JSON already checked.
func countElementsUpTo(b []byte, limit int) int {
	n, _ := countUpTo(b, limit, nil)
	return n
}

// countUpTo counts the elements of the array that starts at b[0], up to limit (limit <= 0: all),
// without reading them; each must pass like, if given. An error says the array does not read as
// one, or an element did not pass, before the count was reached.
func countUpTo(b []byte, limit int, like func(elem []byte) bool) (int, error) {
	n := 0
	err := elements(b, 0, func(e []byte) error {
		if like != nil && !like(e) {
			return errMalformed
		}
		if n++; limit > 0 && n >= limit {
			return errEnough
		}
		return nil
	})
	if errors.Is(err, errEnough) {
		err = nil
	}
	return n, err
}

var errEnough = errors.New("enough counted")

// digits is true of an element that starts as a token id does.
func digits(e []byte) bool { return e[0] >= '0' && e[0] <= '9' }

// jsonString reads a JSON string literal. Text without escapes is copied once, into the string;
// invalid UTF-8 becomes U+FFFD as encoding/json makes it.
func jsonString(lit []byte) (string, error) {
	if len(lit) < 2 || lit[0] != '"' {
		return "", errors.New("not a string")
	}
	inner := lit[1 : len(lit)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	var s string
	err := json.Unmarshal(lit, &s)
	return s, err
}

// errTooManyIDs stops reading token ids at the first one past the bound.
var errTooManyIDs = errors.New("more token ids than the bound")

// tokenIDs reads an array of token ids, integers in [0, 2^32), straight from the body into the
// one slice the call runs; it stops at the max+1st id (max <= 0: no bound) with errTooManyIDs.
func tokenIDs(arr []byte, max int) ([]uint32, error) {
	if len(arr) == 0 || arr[0] != '[' {
		return nil, errors.New("token ids must be an array of integers")
	}
	// A scan that reads nothing, so the ids are allocated once; it stops at the bound, past
	// which nothing is kept.
	n := countElementsUpTo(arr, max)
	out := make([]uint32, 0, n)
	err := elements(arr, 0, func(e []byte) error {
		if max > 0 && len(out) >= max {
			return errTooManyIDs
		}
		v, ok := uint32Of(e)
		if !ok {
			return fmt.Errorf("token id %d (%s) is not an integer in [0, 4294967295]", len(out), clip(e))
		}
		out = append(out, v)
		return nil
	})
	return out, err
}

// uint32Of reads a JSON number that is an integer in [0, 2^32) written with digits only.
func uint32Of(e []byte) (uint32, bool) {
	if len(e) == 0 || len(e) > 10 {
		return 0, false
	}
	var v uint64
	for _, c := range e {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + uint64(c-'0')
	}
	return uint32(v), v <= math.MaxUint32
}

// clip shortens a value for an error message.
func clip(b []byte) string {
	if len(b) > 32 {
		return string(b[:32]) + "..."
	}
	return string(b)
}
