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

// The scanner below walks JSON that json.Unmarshal has already checked, so it looks only at
// what tells values apart and never meets a syntax error.

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

// stringEnd returns the index just past the string that starts at b[i] (a quote).
func stringEnd(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// elements calls f with each element of the array that starts at b[i], in order, until f
// returns an error.
func elements(b []byte, i int, f func(elem []byte) error) error {
	i = skipSpace(b, i+1) // past '['
	for i < len(b) && b[i] != ']' {
		end := valueEnd(b, i)
		if err := f(b[i:end]); err != nil {
			return err
		}
		i = skipSpace(b, end)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
		}
	}
	return nil
}

// countElementsUpTo counts the elements of the array that starts at b[0] without reading them,
// up to limit (limit <= 0: all).
func countElementsUpTo(b []byte, limit int) int {
	n := 0
	errEnough := errors.New("enough")
	_ = elements(b, 0, func([]byte) error {
		n++
		if limit > 0 && n >= limit {
			return errEnough
		}
		return nil
	})
	return n
}

// countElements counts the elements of the array that starts at b[i] without reading them.
func countElements(b []byte) int {
	n := 0
	_ = elements(b, 0, func([]byte) error { n++; return nil })
	return n
}

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
