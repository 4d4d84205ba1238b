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
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// TestTheEmbeddingsAnswerIsEncodedAsEncodingJSONWould: the reflection-free encoder writes the
// same bytes as encoding/json for vectors of every magnitude (the exponent forms at both ends,
// negative zero, the float32 extremes), for base64 vectors, and for names that need escaping.
func TestTheEmbeddingsAnswerIsEncodedAsEncodingJSONWould(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 1e-6, 9.99999e-7, 1e-7, 1.5e-9, 1e21, 9.9999e20, 3e38,
		math.MaxFloat32, math.SmallestNonzeroFloat32, -math.MaxFloat32, 0.1, 1.0 / 3, 123456.79}
	vec := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			switch rng.IntN(3) {
			case 0:
				v[i] = special[rng.IntN(len(special))]
			case 1:
				v[i] = float32(rng.NormFloat64())
			default:
				v[i] = math.Float32frombits(rng.Uint32() &^ (0xff << 23)) // any mantissa, small exponents
			}
		}
		return v
	}
	for round := range 200 {
		out := embeddingsResponse{Object: "list", Model: "team/<embed>\u2028\"x\"", Data: make([]embedding, 1+round%5),
			Synapse: ranOn{Lane: "team/embed", Node: "mac-1", Device: "sim", Buckets: []int{128}, WorkerGenerations: []int64{3}, RoutingReason: "named", VectorSpace: "s&1"}}
		for i := range out.Data {
			out.Data[i] = embedding{Object: "embedding", Index: i, Embedding: vec(1 + rng.IntN(64))}
			switch {
			case round%7 == 0:
				out.Data[i].Embedding = encodeBase64(vec(8))
			case round%11 == 0:
				out.Data[i].Embedding = []float32(nil)
			}
		}
		out.Usage.PromptTokens, out.Usage.TotalTokens = round, round
		want, err := json.Marshal(out)
		if err != nil {
			t.Fatal(err)
		}
		got, err := out.appendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Fatalf("round %d:\n got %s\nwant %s", round, got, want)
		}
	}
}

// TestAnAnswerThatCannotBeEncodedIs500NotAPartialBody: a vector holding a NaN (which JSON
// cannot carry) is answered 500 internal_error in the error envelope, never a cut-off body.
func TestAnAnswerThatCannotBeEncodedIs500NotAPartialBody(t *testing.T) {
	out := embeddingsResponse{Object: "list", Data: []embedding{{Object: "embedding", Embedding: []float32{1, float32(math.NaN())}}}}
	rec := httptest.NewRecorder()
	if err := writeAnswer(rec, http.StatusOK, out.appendJSON); err == nil {
		t.Fatal("a NaN was encoded")
	}
	var body map[string]any
	if rec.Code != http.StatusInternalServerError || json.Unmarshal(rec.Body.Bytes(), &body) != nil || errorCodeOf(body) != "internal_error" {
		t.Fatalf("%d %q, want 500 internal_error in the error envelope", rec.Code, rec.Body.String())
	}
	if rec.Header().Get("X-Synapse-Error-Code") != "internal_error" {
		t.Fatalf("X-Synapse-Error-Code %q, want internal_error as every error answer says it", rec.Header().Get("X-Synapse-Error-Code"))
	}
	if rec.Header().Get("Content-Length") != strconv.Itoa(rec.Body.Len()) {
		t.Fatalf("Content-Length %q for %d bytes", rec.Header().Get("Content-Length"), rec.Body.Len())
	}
}
