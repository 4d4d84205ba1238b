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
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// repository serves one archive of spec's artifact from a directory, and over HTTP.
func repository(t *testing.T, corrupt bool) (dir string, srv *httptest.Server, hits *int) {
	t.Helper()
	path, sum := archive(t, spec)
	dir = t.TempDir()
	data, _ := os.ReadFile(path)
	if corrupt {
		data[len(data)/2] ^= 0xff
	}
	_ = os.WriteFile(filepath.Join(dir, "gte.tar.gz"), data, 0o644)
	idx, _ := json.Marshal(Index{Artifacts: []IndexEntry{{Model: spec.Model, Revision: spec.Revision, ConversionPolicy: spec.ConversionPolicy.Name,
		Backend: "sim", Platform: mac, Path: "gte.tar.gz", SHA256: sum, Size: int64(len(data))}}})
	_ = os.WriteFile(filepath.Join(dir, "index.json"), idx, 0o644)
	n := 0
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		http.FileServer(http.Dir(dir)).ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return dir, srv, &n
}

func TestFetchFromADirectoryOrOverHTTP(t *testing.T) {
	dir, srv, _ := repository(t, false)
	for _, repo := range []string{dir, srv.URL} {
		im, _ := newImporter(t)
		res, err := im.Fetch(context.Background(), repo, spec.Model, spec.Revision, spec.ConversionPolicy.Name, false, false)
		if err != nil {
			t.Fatalf("%s: %v", repo, err)
		}
		if _, err := verifier.Verify(res.Dir, want); err != nil {
			t.Fatalf("%s: the fetched artifact does not verify: %v", repo, err)
		}
	}
}

func TestFetchRefusesWhatItCannotTrust(t *testing.T) {
	ctx := context.Background()
	_, bad, _ := repository(t, true)
	im, _ := newImporter(t)
	_, err := im.Fetch(ctx, bad.URL, spec.Model, spec.Revision, spec.ConversionPolicy.Name, false, false)
	var ie *IntegrityError
	if !errors.As(err, &ie) || ie.Check != "archive" || !strings.Contains(err.Error(), "the index says") {
		t.Fatalf("a corrupted download: %v", err)
	}

	if _, err := im.Fetch(ctx, "", spec.Model, spec.Revision, spec.ConversionPolicy.Name, false, false); err == nil || !strings.Contains(err.Error(), RepoEnv) {
		t.Fatalf("no repository: %v", err)
	}

	_, good, _ := repository(t, false)
	other, _ := newImporter(t)
	other.Machine.ChipFamily = "M1"
	_, err = other.Fetch(ctx, good.URL, spec.Model, spec.Revision, spec.ConversionPolicy.Name, false, false)
	var mi *MissingError
	if !errors.As(err, &mi) || !strings.Contains(err.Error(), "another platform is never used") {
		t.Fatalf("another platform: %v", err)
	}
}

func TestOfflineFetchNeverTouchesTheRepository(t *testing.T) {
	ctx := context.Background()
	_, srv, hits := repository(t, false)
	im, _ := newImporter(t)
	_, err := im.Fetch(ctx, srv.URL, spec.Model, spec.Revision, spec.ConversionPolicy.Name, true, false)
	var mi *MissingError
	if !errors.As(err, &mi) || !strings.Contains(err.Error(), "artifacts import") || *hits != 0 {
		t.Fatalf("offline and not installed: %v (%d requests)", err, *hits)
	}
	if _, err := im.Fetch(ctx, srv.URL, spec.Model, spec.Revision, spec.ConversionPolicy.Name, false, false); err != nil {
		t.Fatal(err)
	}
	before := *hits
	res, err := im.Fetch(ctx, srv.URL, spec.Model, spec.Revision, spec.ConversionPolicy.Name, true, false)
	if err != nil || !res.AlreadyRegistered || *hits != before {
		t.Fatalf("offline and installed: %+v, %v (%d requests)", res, err, *hits-before)
	}
}
