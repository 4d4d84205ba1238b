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
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
)

// Answers are encoded into a pooled buffer and written once, with their Content-Length: one
// write instead of a chunked stream flushed every 4 KiB (an answer of 768 floats is about 8 KiB),
// and no buffer of the answer's size allocated per call.
var answers = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledAnswer is the largest buffer kept for reuse; a larger answer's buffer goes to the
// collector, so one big batch does not pin its memory.
const maxPooledAnswer = 1 << 20

// writeJSON answers status with v encoded as encoding/json does.
func writeJSON(w http.ResponseWriter, status int, v any) {
	_ = writeAnswer(w, status, func(b []byte) ([]byte, error) {
		out, err := json.Marshal(v)
		return append(b, out...), err
	})
}

// writeAnswer answers status with the JSON that encode appends, or, if it cannot encode the
// answer, 500 internal_error (and returns the error).
func writeAnswer(w http.ResponseWriter, status int, encode func([]byte) ([]byte, error)) error {
	bp := answers.Get().(*[]byte)
	b, err := encode((*bp)[:0])
	if err != nil {
		status, b = http.StatusInternalServerError, append(b[:0], `{"error":{"message":"the answer could not be encoded","type":"server_error","code":"internal_error","param":null}}`...)
		w.Header().Set("X-Synapse-Error-Code", "internal_error")
	}
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
	if cap(b) <= maxPooledAnswer {
		*bp = b
		answers.Put(bp)
	}
	return err
}

// appendJSON appends the embeddings answer exactly as encoding/json encodes it (a test holds
// them equal), without reflection: vectors are most of an answer's bytes, and their floats are
// appended straight from the result.
func (r *embeddingsResponse) appendJSON(b []byte) ([]byte, error) {
	b = append(b, `{"object":`...)
	b = appendString(b, r.Object)
	b = append(b, `,"data":[`...)
	for i, d := range r.Data {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"object":`...)
		b = appendString(b, d.Object)
		b = append(b, `,"index":`...)
		b = strconv.AppendInt(b, int64(d.Index), 10)
		b = append(b, `,"embedding":`...)
		switch e := d.Embedding.(type) {
		case []float32:
			if e == nil {
				b = append(b, "null"...) // as encoding/json writes a nil slice
				break
			}
			var err error
			if b, err = appendFloats(b, e); err != nil {
				return b, err
			}
		default:
			out, err := json.Marshal(e)
			if err != nil {
				return b, err
			}
			b = append(b, out...)
		}
		b = append(b, '}')
	}
	b = append(b, `],"model":`...)
	b = appendString(b, r.Model)
	b = append(b, `,"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(r.Usage.PromptTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(r.Usage.TotalTokens), 10)
	b = append(b, `},"synapse":`...)
	out, err := json.Marshal(r.Synapse)
	if err != nil {
		return b, err
	}
	b = append(b, out...)
	return append(b, '}'), nil
}

// appendString appends s as a JSON string, escaped as encoding/json escapes it.
func appendString(b []byte, s string) []byte {
	out, _ := json.Marshal(s) // a string always encodes
	return append(b, out...)
}

// appendFloats appends v as a JSON array of numbers formatted as encoding/json formats a
// float32: the shortest decimal that reads back as the same float32, in exponent form below
// 1e-6 and from 1e21 on, with a one-digit negative exponent unpadded (Go's
// src/encoding/json/encode.go, floatEncoder.encode). A NaN or an infinity is not JSON.
func appendFloats(b []byte, v []float32) ([]byte, error) {
	b = append(b, '[')
	for i, x := range v {
		if i > 0 {
			b = append(b, ',')
		}
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return b, fmt.Errorf("vector element %d is %v, which JSON cannot hold", i, x)
		}
		format := byte('f')
		if abs := float32(math.Abs(f)); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
			format = 'e'
		}
		b = strconv.AppendFloat(b, f, format, -1, 32)
		if format == 'e' {
			// e-09 is written e-9, as encoding/json does.
			if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
				b[n-2] = b[n-1]
				b = b[:n-1]
			}
		}
	}
	return append(b, ']'), nil
}
