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

package artifact

import (
	"fmt"
	"path/filepath"
	"regexp"
)

var segmentRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Path is where the artifact of a model revision converted by a conversion policy is
// registered under root: <root>/<model>/<revision>/<policy>. Each part must be a plain name.
func Path(root, model, revision, policy string) (string, error) {
	for _, part := range []string{model, revision, policy} {
		if !segmentRE.MatchString(part) {
			return "", fmt.Errorf("%q cannot name an artifact directory: letters, digits, '.', '_' and '-' only", part)
		}
	}
	return filepath.Join(root, model, revision, policy), nil
}
