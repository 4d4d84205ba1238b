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

package convert

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ck-synapse/synapse-fleet/node-agent/family"
)

// The sentence-transformers files that say how a checkpoint turns token states into one
// embedding: modules.json lists the pipeline's modules, and the Pooling module's folder holds
// its config.json (huggingface/sentence-transformers,
// sentence_transformers/sentence_transformer/models/Pooling.py: config_keys and the
// constructor's defaults, mean pooling and include_prompt true).
const (
	modulesFile       = "modules.json"
	defaultPoolingDir = "1_Pooling"
	stPooling         = "sentence_transformers.models.Pooling"
	stNormalize       = "sentence_transformers.models.Normalize"
	stTransformer     = "sentence_transformers.models.Transformer"
)

// stPoolingConfig is a Pooling module's config.json. Absent keys take the constructor's
// defaults.
type stPoolingConfig struct {
	WordEmbeddingDimension int   `json:"word_embedding_dimension"`
	CLS                    *bool `json:"pooling_mode_cls_token"`
	Mean                   *bool `json:"pooling_mode_mean_tokens"`
	Max                    *bool `json:"pooling_mode_max_tokens"`
	MeanSqrtLen            *bool `json:"pooling_mode_mean_sqrt_len_tokens"`
	WeightedMean           *bool `json:"pooling_mode_weightedmean_tokens"`
	LastToken              *bool `json:"pooling_mode_lasttoken"`
	IncludePrompt          *bool `json:"include_prompt"`
}

// PoolingError refuses a conversion whose pooling the checkpoint does not say, says in a way
// the programs cannot reproduce, or says otherwise than the policy.
type PoolingError struct{ Message string }

func (e *PoolingError) Error() string { return "pooling: " + e.Message }

// checkpointPooling reads the pooling the checkpoint's sentence-transformers configuration
// says, and the files it read (for the checkpoint's digest). It returns "" when the checkpoint
// has no such configuration. The pipeline must be the model, then Pooling, then Normalize (the
// embeddings are L2-normalised here): any other module would change the vectors and is refused.
func checkpointPooling(dir string, hidden int) (family.Pooling, []string, error) {
	var files []string
	poolingDir := defaultPoolingDir
	data, err := os.ReadFile(filepath.Join(dir, modulesFile))
	switch {
	case err == nil:
		files = append(files, filepath.Join(dir, modulesFile))
		var modules []struct {
			Path string `json:"path"`
			Type string `json:"type"`
		}
		if err := json.Unmarshal(data, &modules); err != nil {
			return "", nil, &PoolingError{Message: fmt.Sprintf("%s: %v", modulesFile, err)}
		}
		var types []string
		for _, m := range modules {
			types = append(types, m.Type)
			if m.Type == stPooling {
				poolingDir = m.Path
			}
		}
		if !slices.Equal(types, []string{stTransformer, stPooling, stNormalize}) {
			return "", nil, &PoolingError{Message: fmt.Sprintf("%s lists the modules %s; the programs reproduce %s, %s, %s and nothing else",
				modulesFile, strings.Join(types, ", "), stTransformer, stPooling, stNormalize)}
		}
	case !errors.Is(err, fs.ErrNotExist):
		return "", nil, err
	}
	path := filepath.Join(dir, filepath.FromSlash(poolingDir), "config.json")
	data, err = os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist) && len(files) == 0:
		return "", nil, nil
	case err != nil:
		return "", nil, &PoolingError{Message: fmt.Sprintf("the Pooling module's config.json: %v", err)}
	}
	files = append(files, path)
	var c stPoolingConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return "", nil, &PoolingError{Message: fmt.Sprintf("%s: %v", path, err)}
	}
	on := func(b *bool, def bool) bool {
		if b == nil {
			return def
		}
		return *b
	}
	var modes []string
	var pooling family.Pooling
	for _, m := range []struct {
		name    string
		set     bool
		pooling family.Pooling
	}{
		{"cls_token", on(c.CLS, false), family.PoolCLS}, {"mean_tokens", on(c.Mean, true), family.PoolMean},
		{"lasttoken", on(c.LastToken, false), family.PoolLast}, {"max_tokens", on(c.Max, false), ""},
		{"mean_sqrt_len_tokens", on(c.MeanSqrtLen, false), ""}, {"weightedmean_tokens", on(c.WeightedMean, false), ""},
	} {
		if m.set {
			modes, pooling = append(modes, m.name), m.pooling
		}
	}
	switch {
	case len(modes) != 1 || pooling == "":
		return "", nil, &PoolingError{Message: fmt.Sprintf("the checkpoint pools by %v; the programs pool by exactly one of cls_token, mean_tokens and lasttoken", modes)}
	case !on(c.IncludePrompt, true):
		return "", nil, &PoolingError{Message: "the checkpoint pools without its prompt tokens (include_prompt false), which the programs do not reproduce"}
	case c.WordEmbeddingDimension != hidden:
		return "", nil, &PoolingError{Message: fmt.Sprintf("the Pooling module is for %d dimensions; the model's hidden size is %d", c.WordEmbeddingDimension, hidden)}
	}
	return pooling, files, nil
}

// resolvePooling is the pooling a conversion uses: the checkpoint's own, which a policy that
// names one must agree with; a policy's only when the checkpoint says none. Nothing defaults.
func resolvePooling(fromCheckpoint, fromPolicy family.Pooling) (family.Pooling, error) {
	switch {
	case fromCheckpoint == "" && fromPolicy == "":
		return "", &PoolingError{Message: "the checkpoint has no sentence-transformers pooling configuration (modules.json, 1_Pooling/config.json) and the policy names none: name it (--pooling cls, mean or last)"}
	case fromCheckpoint == "":
		return fromPolicy, nil
	case fromPolicy != "" && fromPolicy != fromCheckpoint:
		return "", &PoolingError{Message: fmt.Sprintf("the policy pools by %s, the checkpoint's sentence-transformers configuration by %s", fromPolicy, fromCheckpoint)}
	}
	return fromCheckpoint, nil
}
