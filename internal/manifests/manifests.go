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

// Package manifests reads the project's kustomize bases under config/ (plain resource lists,
// no patches) and applies their objects, as `kubectl apply -k` would, so that the local fleet
// and the envtest suites run with exactly the RBAC and policies the project ships.
package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"
)

// Read returns the objects of a kustomize directory, following its resources (files and
// directories) in order. Anything but a plain resource list is refused rather than ignored.
func Read(dir string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s/kustomization.yaml: %w", dir, err)
	}
	var out []*unstructured.Unstructured
	for key, v := range k {
		if key != "resources" && key != "apiVersion" && key != "kind" {
			return nil, fmt.Errorf("%s/kustomization.yaml: %q is not supported here, only resources", dir, key)
		}
		if key != "resources" {
			continue
		}
		list, _ := v.([]any)
		for _, r := range list {
			path := filepath.Join(dir, fmt.Sprint(r))
			info, err := os.Stat(path)
			if err != nil {
				return nil, err
			}
			var objs []*unstructured.Unstructured
			if info.IsDir() {
				objs, err = Read(path)
			} else {
				objs, err = ReadFile(path)
			}
			if err != nil {
				return nil, err
			}
			out = append(out, objs...)
		}
	}
	return out, nil
}

// ReadFile returns the objects of a multi-document YAML file.
func ReadFile(path string) ([]*unstructured.Unstructured, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var out []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if len(u.Object) > 0 {
			out = append(out, u)
		}
	}
}

// Apply creates each object, or updates it to what it says when it exists. Namespaces and
// CRDs go first, so the objects in them can follow.
func Apply(ctx context.Context, c client.Client, objs []*unstructured.Unstructured) error {
	objs = slices.Clone(objs)
	first := func(u *unstructured.Unstructured) int {
		switch u.GetKind() {
		case "Namespace", "CustomResourceDefinition":
			return 0
		}
		return 1
	}
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int { return first(a) - first(b) })
	for _, u := range objs {
		u = u.DeepCopy()
		err := c.Create(ctx, u)
		if apierrors.IsAlreadyExists(err) {
			existing := &unstructured.Unstructured{}
			existing.SetGroupVersionKind(u.GroupVersionKind())
			if err = c.Get(ctx, client.ObjectKeyFromObject(u), existing); err == nil {
				u.SetResourceVersion(existing.GetResourceVersion())
				err = c.Update(ctx, u)
			}
		}
		if err != nil {
			return fmt.Errorf("applying %s %s: %w", u.GetKind(), client.ObjectKeyFromObject(u), err)
		}
	}
	return nil
}

// Without drops the objects of the given kinds.
func Without(objs []*unstructured.Unstructured, kinds ...string) []*unstructured.Unstructured {
	return slices.DeleteFunc(slices.Clone(objs), func(u *unstructured.Unstructured) bool { return slices.Contains(kinds, u.GetKind()) })
}
