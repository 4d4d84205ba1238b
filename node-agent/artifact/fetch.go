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
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
)

// RepoEnv names the artifact repository when no flag does.
const RepoEnv = "SYNAPSE_ARTIFACT_REPO"

// Index is a repository's index.json: the archives it serves.
type Index struct {
	Artifacts []IndexEntry `json:"artifacts"`
}

// IndexEntry is one archive: what it holds, where it is (relative to the repository) and its
// SHA-256 and size.
type IndexEntry struct {
	Model            string   `json:"model"`
	Revision         string   `json:"revision"`
	ConversionPolicy string   `json:"conversionPolicy"`
	Backend          string   `json:"backend"`
	Platform         Platform `json:"platform"`
	Path             string   `json:"path"`
	SHA256           string   `json:"sha256"`
	Size             int64    `json:"size"`
}

// Fetch finds the archive of model, revision and policy for this machine in the repository
// repo (an http(s) URL or a local directory; "" refuses, it never guesses one), downloads it
// and imports it. Offline, it never touches the repository: an artifact that is not
// registered already is an error that says how to get it.
func (im Importer) Fetch(ctx context.Context, repo, model, revision, policy string, offline, force bool) (*ImportResult, error) {
	dest, err := Path(im.Root, model, revision, policy)
	if err != nil {
		return nil, err
	}
	if offline {
		if _, err := os.Stat(filepath.Join(dest, ManifestFile)); err == nil {
			return &ImportResult{Dir: dest, AlreadyRegistered: true}, nil
		}
		return nil, &MissingError{Dir: dest, Message: fmt.Sprintf("offline, and %s %s (%s) is not installed; run 'synapse-agent artifacts fetch' online, or copy its archive here and run 'synapse-agent artifacts import'", model, revision, policy)}
	}
	if repo == "" {
		return nil, fmt.Errorf("no artifact repository: pass --repo or set %s (there is no default)", RepoEnv)
	}
	data, err := read(ctx, repo, "index.json", 64<<20)
	if err != nil {
		return nil, fmt.Errorf("reading the repository's index: %w", err)
	}
	var idx Index
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, fmt.Errorf("the repository's index is not valid: %w", err)
	}
	var found *IndexEntry
	for i, e := range idx.Artifacts {
		if e.Model == model && e.Revision == revision && e.ConversionPolicy == policy && e.Backend == im.Backend && e.Platform == im.Machine {
			found = &idx.Artifacts[i]
			break
		}
	}
	if found == nil {
		return nil, &MissingError{Dir: dest, Message: fmt.Sprintf("the repository has no archive of %s %s (%s) for %s on %s %s; an archive for another platform is never used: build one with 'synapse-agent artifacts build' on such a machine",
			model, revision, policy, im.Backend, im.Machine.ChipFamily, im.Machine.MacOSBuild)}
	}
	limit := im.Limit
	if limit == 0 {
		limit = MaxArchiveBytes
	}
	if found.Size <= 0 || found.Size > limit {
		return nil, fmt.Errorf("the index gives archive %s a size of %d bytes; at most %d", found.Path, found.Size, limit)
	}
	body, err := read(ctx, repo, found.Path, found.Size)
	if err != nil {
		return nil, fmt.Errorf("downloading %s: %w", found.Path, err)
	}
	tmp, err := os.CreateTemp("", "synapse-artifact-*.tar.gz")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(body); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	return im.Import(tmp.Name(), found.SHA256, force)
}

// read reads name from the repository, at most limit bytes.
func read(ctx context.Context, repo, name string, limit int64) ([]byte, error) {
	if strings.Contains(name, "..") || strings.HasPrefix(name, "/") {
		return nil, fmt.Errorf("%q is not a path inside the repository", name)
	}
	var r io.ReadCloser
	if u, err := url.Parse(repo); err == nil && (u.Scheme == "http" || u.Scheme == "https") {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(repo, "/")+"/"+name, nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			resp.Body.Close()
			return nil, fmt.Errorf("%s answered %s", req.URL, resp.Status)
		}
		r = resp.Body
	} else {
		f, err := os.Open(filepath.Join(repo, filepath.FromSlash(name)))
		if err != nil {
			return nil, err
		}
		r = f
	}
	defer r.Close()
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, errors.New("larger than the index says")
	}
	return data, nil
}
