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

package localfleet

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// ApplySamples creates every object of every YAML file in dir (kustomization.yaml aside):
// certified identities first, each with its artifact installed on the Macs, then everything
// else, then the lanes, so a lane is placed only once what it needs exists. A CertifiedIdentity
// approves the worker binary the fleet's Macs run: its binaryDigest is set to that binary's and
// its backend to sim (the fleet's Macs are simulated), as a release engineer certifying this
// build on the stand-in would; its answers then say sim, never ane.
func (f *Fleet) ApplySamples(ctx context.Context, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	type doc struct {
		file string
		obj  *unstructured.Unstructured
	}
	var docs []doc
	for _, file := range files {
		if filepath.Base(file) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		for _, text := range strings.Split(string(data), "\n---\n") {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(text), &obj.Object); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			if len(obj.Object) != 0 {
				docs = append(docs, doc{file, obj})
			}
		}
	}
	rank := func(kind string) int {
		switch kind {
		case "CertifiedIdentity":
			return 0
		case "CatalogLane":
			return 2
		}
		return 1
	}
	slices.SortStableFunc(docs, func(a, b doc) int { return rank(a.obj.GetKind()) - rank(b.obj.GetKind()) })
	for _, d := range docs {
		obj := d.obj
		if obj.GetKind() == "CertifiedIdentity" {
			if err := unstructured.SetNestedField(obj.Object, string(f.WorkerDigest), "spec", "worker", "binaryDigest"); err != nil {
				return fmt.Errorf("%s: %w", d.file, err)
			}
			if err := unstructured.SetNestedField(obj.Object, string(v1.BackendSim), "spec", "worker", "backend"); err != nil {
				return fmt.Errorf("%s: %w", d.file, err)
			}
		}
		if err := f.Client.Create(ctx, obj); err != nil {
			return fmt.Errorf("%s: %w", d.file, err)
		}
		if obj.GetKind() == "CertifiedIdentity" {
			id := &v1.CertifiedIdentity{}
			if err := f.Client.Get(ctx, client.ObjectKey{Name: obj.GetName()}, id); err != nil {
				return err
			}
			if err := f.InstallArtifact(id); err != nil {
				return err
			}
		}
	}
	return nil
}
