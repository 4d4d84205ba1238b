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
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// Limits are a tokenizer.json's truncation and padding sections, as written. The tokenizer
// library applies both inside encoding: a text longer than the truncation's max_length would
// be cut before the lane's ceiling is checked and answered as if whole, and a Fixed padding
// would move every input to the bucket of its padded length. Neither may happen here: the
// converter records them and strips them, and a tokenizer.json that still has them is refused.
type Limits struct {
	// Truncation and Padding are the sections' JSON; empty when the file has none (null).
	Truncation json.RawMessage `json:"truncation,omitempty"`
	Padding    json.RawMessage `json:"padding,omitempty"`
}

// Empty reports whether neither section is set.
func (l Limits) Empty() bool { return len(l.Truncation) == 0 && len(l.Padding) == 0 }

func (l Limits) String() string {
	var parts []string
	if len(l.Truncation) > 0 {
		parts = append(parts, "truncation "+string(l.Truncation))
	}
	if len(l.Padding) > 0 {
		parts = append(parts, "padding "+string(l.Padding))
	}
	return strings.Join(parts, " and ")
}

// LimitsError refuses a tokenizer.json that would truncate or pad the texts it encodes.
type LimitsError struct{ Limits Limits }

func (e *LimitsError) Error() string {
	return fmt.Sprintf("tokenizer.json sets %s, which the tokenizer library would apply silently (cutting or padding the tokens); "+
		"texts are never cut or padded here: convert the checkpoint, which records and strips them", e.Limits)
}

// limitsOf reads the truncation and padding sections of doc (a parsed tokenizer.json).
func limitsOf(doc map[string]json.RawMessage) Limits {
	var l Limits
	if v := bytes.TrimSpace(doc["truncation"]); len(v) > 0 && !bytes.Equal(v, []byte("null")) {
		l.Truncation = v
	}
	if v := bytes.TrimSpace(doc["padding"]); len(v) > 0 && !bytes.Equal(v, []byte("null")) {
		l.Padding = v
	}
	return l
}

// StripLimits returns the tokenizer.json data with its truncation and padding set to null,
// and what they were. The rest of the file is kept as it is (its keys re-ordered).
func StripLimits(data []byte) ([]byte, Limits, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		return nil, Limits{}, fmt.Errorf("tokenizer.json: %w", err)
	}
	l := limitsOf(doc)
	if l.Empty() {
		return data, l, nil
	}
	doc["truncation"], doc["padding"] = json.RawMessage("null"), json.RawMessage("null")
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, Limits{}, err
	}
	return out, l, nil
}
