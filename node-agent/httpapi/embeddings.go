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
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
)

// MaxInputs bounds the inputs of one call, as the OpenAI API does; more are refused, never cut.
const MaxInputs = 2048

// embeddingsRequest is the OpenAI embeddings request. Input is a string, an array of strings,
// an array of token ids or an array of arrays of token ids.
type embeddingsRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat string          `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	User           string          `json:"user"`
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
	var req embeddingsRequest
	if err := decode(w, r, &req); err != nil {
		c.fail(err)
		return
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
	lane, sequences, err := s.route(c, req.Model, "embed", lanes, byName, func(l Lane) ([][]uint32, error) { return parseInput(req.Input, l) })
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
	c.ok(out)
}

func encodeBase64(v []float32) string {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// parseInput reads the input union into token sequences: text is tokenised by the lane's
// tokenizer, token ids are taken as they are.
func parseInput(raw json.RawMessage, lane Lane) ([][]uint32, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("invalid_request", "input", "input is required: a string, an array of strings, an array of token ids or an array of arrays of token ids")
	}
	var text string
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, badRequest("invalid_request", "input", err.Error())
		}
		ids, err := encode(lane, text, "input", "input")
		if err != nil {
			return nil, err
		}
		return [][]uint32{ids}, nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest("invalid_request", "input", "input must be a string or an array")
	}
	if len(items) == 0 {
		return nil, badRequest("invalid_request", "input", "input is an empty array")
	}
	first := bytes.TrimSpace(items[0])
	// An array of strings or of arrays is a batch; an array of numbers is one input.
	if len(items) > MaxInputs && len(first) > 0 && (first[0] == '"' || first[0] == '[') {
		return nil, badRequest("too_many_inputs", "input", fmt.Sprintf("%d inputs in one call; at most %d", len(items), MaxInputs))
	}
	switch {
	case len(first) > 0 && first[0] == '"':
		out := make([][]uint32, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &text); err != nil {
				return nil, badRequest("invalid_request", "input", fmt.Sprintf("input[%d]: every element must be a string like the first: %v", i, err))
			}
			var err error
			if out[i], err = encode(lane, text, "input", fmt.Sprintf("input[%d]", i)); err != nil {
				return nil, err
			}
		}
		return out, nil
	case len(first) > 0 && first[0] == '[':
		out := make([][]uint32, len(items))
		for i, it := range items {
			ids, err := tokenIDs(it)
			if err != nil {
				return nil, badRequest("invalid_request", "input", fmt.Sprintf("input[%d]: %v", i, err))
			}
			out[i] = ids
		}
		return out, nil
	default:
		ids, err := tokenIDs(raw)
		if err != nil {
			return nil, badRequest("invalid_request", "input", err.Error())
		}
		return [][]uint32{ids}, nil
	}
}

// tokenIDs reads an array of token ids: integers in [0, 2^32).
func tokenIDs(raw json.RawMessage) ([]uint32, error) {
	var nums []json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&nums); err != nil {
		return nil, fmt.Errorf("token ids must be an array of integers: %v", err)
	}
	out := make([]uint32, len(nums))
	for i, n := range nums {
		v, err := n.Int64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("token id %d (%s) is not an integer in [0, 4294967295]", i, n)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// encode tokenises one text with the lane's model's tokenizer; a lane without one takes token
// ids only, and a text the tokenizer cannot encode is refused, never cut.
func encode(lane Lane, text, param, what string) ([]uint32, error) {
	if lane.Tokenizer == nil {
		return nil, badRequest("text_input_unsupported", param, fmt.Sprintf("lane %s has no tokenizer: send token ids", lane.Key))
	}
	ids, err := lane.Tokenizer.Encode(text)
	if err != nil {
		return nil, &apiError{status: http.StatusUnprocessableEntity, code: "tokenization_failed", param: param,
			message: fmt.Sprintf("%s: %v", what, err)}
	}
	return ids, nil
}
