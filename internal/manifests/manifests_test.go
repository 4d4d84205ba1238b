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

package manifests

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestReadFollowsConfigDefault reads the kustomization every cluster installs: it reaches the
// RBAC, the agents' namespaces and the node-restriction policies.
func TestReadFollowsConfigDefault(t *testing.T) {
	objs, err := Read(filepath.Join("..", "..", "config", "default"))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
	}
	for _, want := range []string{"Namespace/synapse-nodes", "Namespace/synapse-node-lease", "ClusterRole/synapse-agent",
		"ClusterRole/synapse-controller", "Role/synapse-controller-leader-election", "ValidatingAdmissionPolicy/synapse-agent-nothing-else",
		"Deployment/synapse-controller", "CustomResourceDefinition/macnodes.fleet.synapse.dev"} {
		if !slices.Contains(kinds, want) {
			t.Errorf("config/default lacks %s: %v", want, kinds)
		}
	}
	for _, o := range Without(objs, "Deployment") {
		if o.GetKind() == "Deployment" {
			t.Errorf("Without kept %s", o.GetName())
		}
	}
}

func TestReadRefusesWhatItCannotApply(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte("resources: [a.yaml]\npatches:\n- path: p.yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(dir); err == nil {
		t.Fatal("a kustomization with patches was read as if it had none")
	}
}
