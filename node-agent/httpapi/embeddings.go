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
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net/http"
)

// MaxInputs bounds the inputs of one call, as the OpenAI API does; more are refused, never cut.
const MaxInputs = 2048

// embeddingsRequest is the OpenAI embeddings request. Input is a string, an array of strings,
// an array of token ids or an array of arrays of token ids.
type embeddingsRequest struct {
	Model          string  `json:"model"`
	Input          rawJSON `json:"input"`
	EncodingFormat string  `json:"encoding_format"`
	Dimensions     *int    `json:"dimensions"`
	User           string  `json:"user"`
}

type embeddingsResponse struct {
	Object string      `json:"object"`
	Data   []embedding `json:"data"`
	Model  string      `json:"model"`
	Usage  usage       `json:"usage"`
	// Synapse says where the call ran; OpenAI clients ignore it.
	Synapse ranOn `json:"synapse"`
}

type embedding struct {
	Object string `json:"object"`
	Index  int    `json:"index"`
	// Embedding is a []float32, or a base64 string of little-endian float32s.
	Embedding any `json:"embedding"`
}

type usage struct {
	PromptTokens int `json:"prompt_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	c := s.begin(w, r, "embeddings")
	// A panic in the handler (net/http recovers it) must not keep the call's work slot.
	defer c.release()
	var req embeddingsRequest
	input, deferred, err := c.decodeDeferring(&req, "input")
	if err != nil {
		c.fail(err)
		return
	}
	if deferred {
		req.Input = input
	}
	if req.EncodingFormat != "" && req.EncodingFormat != "float" && req.EncodingFormat != "base64" {
		c.fail(badRequest("invalid_request", "encoding_format", fmt.Sprintf("encoding_format must be float or base64, not %q", req.EncodingFormat)))
		return
	}
	lanes, byName, err := s.candidates(c, req.Model, "embed")
	if err != nil {
		c.fail(err)
		return
	}
	checked := !deferred
	lane, sequences, err := s.route(c, req.Model, "embed", lanes, byName, func(r *reader) ([][]uint32, error) {
		// An input past the lane's bounds by its size alone is refused before it is checked.
		if err := r.inputSize(req.Input); err != nil {
			return nil, err
		}
		if !checked {
			if err := checkDeferred(req.Input, "input"); err != nil {
				return nil, err
			}
			checked = true
		}
		return parseInput(r, req.Input)
	})
	if err != nil {
		c.fail(err)
		return
	}
	if req.Dimensions != nil && *req.Dimensions != lane.Dimensions {
		c.fail(badRequest("unsupported_dimensions", "dimensions", fmt.Sprintf(
			"lane %s/%s answers %d dimensions; %d were asked for and vectors are never shortened", lane.Namespace, lane.Name, lane.Dimensions, *req.Dimensions)))
		return
	}
	res, err := c.run(lane, "embed", sequences)
	if err != nil {
		c.fail(err)
		return
	}
	out := embeddingsResponse{Object: "list", Model: req.Model, Data: make([]embedding, len(res.Vectors)), Synapse: c.ranOn(lane, res)}
	for i, v := range res.Vectors {
		out.Data[i] = embedding{Object: "embedding", Index: i, Embedding: v}
		if req.EncodingFormat == "base64" {
			out.Data[i].Embedding = encodeBase64(v)
		}
	}
	out.Usage.PromptTokens, out.Usage.TotalTokens = c.tokens, c.tokens
	c.answer(out.appendJSON)
}

// tooManyInputs refuses a call of more than MaxInputs inputs.
func tooManyInputs() error {
	return badRequest("too_many_inputs", "input", fmt.Sprintf("more than %d inputs in one call; at most %d", MaxInputs, MaxInputs))
}

func encodeBase64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// parseInput reads the input union into token sequences for the lane, under its limits: text is
// tokenised by the lane's tokenizer, token ids are read from the body as they are. Every input
// is checked against the lane's ceiling, and the call's total against its batch bound, as it is
// read, so an oversize input costs at most the bound's tokens before it is refused.
func parseInput(r *reader, raw rawJSON) ([][]uint32, error) {
	i := skipSpace(raw, 0)
	if i == len(raw) || raw[i] == 'n' { // absent or null
		return nil, badRequest("invalid_request", "input", "input is required: a string, an array of strings, an array of token ids or an array of arrays of token ids")
	}
	raw = raw[i:]
	switch raw[0] {
	case '"':
		text, err := jsonString(raw)
		if err != nil {
			return nil, badRequest("invalid_request", "input", err.Error())
		}
		ids, err := r.text(text, "input", "input")
		if err != nil {
			return nil, err
		}
		return [][]uint32{ids}, nil
	case '[':
	default:
		return nil, badRequest("invalid_request", "input", "input must be a string or an array")
	}
	first := skipSpace(raw, 1)
	if raw[first] == ']' {
		return nil, badRequest("invalid_request", "input", "input is an empty array")
	}
	if raw[first] != '"' && raw[first] != '[' {
		// An array of numbers is one input of token ids.
		ids, err := r.ids(raw, "input", "input")
		if err != nil {
			return nil, err
		}
		return [][]uint32{ids}, nil
	}
	// An array of strings or of arrays is a batch.
	if n := countElementsUpTo(raw, MaxInputs+1); n > MaxInputs {
		return nil, tooManyInputs()
	}
	kind := raw[first]
	var out [][]uint32
	err := elements(raw, 0, func(e []byte) error {
		what := fmt.Sprintf("input[%d]", len(out))
		if e[0] != kind {
			return badRequest("invalid_request", "input", fmt.Sprintf("%s: every element must be %s like the first", what, map[byte]string{'"': "a string", '[': "an array of token ids"}[kind]))
		}
		var ids []uint32
		if kind == '[' {
			var err error
			if ids, err = r.ids(e, "input", what); err != nil {
				return err
			}
		} else {
			text, err := jsonString(e)
			if err != nil {
				return badRequest("invalid_request", "input", fmt.Sprintf("%s: %v", what, err))
			}
			if ids, err = r.text(text, "input", what); err != nil {
				return err
			}
		}
		out = append(out, ids)
		return nil
	})
	return out, err
}
