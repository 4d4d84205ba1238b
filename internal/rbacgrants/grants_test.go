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

package rbacgrants

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ck-synapse/synapse-fleet/internal/manifests"
)

// install renders a small install: the controller's Deployment running as sa, a ClusterRole
// named role with verbs on macnodes, bound to sa, and a Role bound to a group.
func install(t *testing.T, sa, role, verbs string) []*unstructured.Unstructured {
	t.Helper()
	doc := strings.NewReplacer("$SA", sa, "$ROLE", role, "$VERBS", verbs).Replace(`
apiVersion: apps/v1
kind: Deployment
metadata: {name: c, namespace: sys}
spec: {template: {spec: {serviceAccountName: $SA}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: $ROLE}
rules:
- {apiGroups: [fleet.synapse.dev], resources: [macnodes], verbs: [$VERBS]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: $ROLE}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: $ROLE}
subjects: [{kind: ServiceAccount, name: $SA, namespace: sys}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: $ROLE-lease, namespace: leases}
rules:
- {apiGroups: [coordination.k8s.io], resources: [leases], resourceNames: [a, b], verbs: [get]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: $ROLE-lease, namespace: leases}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: $ROLE-lease}
subjects: [{kind: Group, name: "system:serviceaccounts:nodes"}]
`)
	path := filepath.Join(t.TempDir(), "install.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	objs, err := manifests.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func grantsOf(t *testing.T, objs []*unstructured.Unstructured) []Grant {
	t.Helper()
	g, err := Of(objs)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestOfSplitsRulesIntoRightsAndNamesTheControllerByItsDeployment(t *testing.T) {
	got := grantsOf(t, install(t, "synapse-controller", "synapse-controller", "get, list"))
	want := []string{
		"<the controller> may get macnodes.fleet.synapse.dev cluster-wide",
		"<the controller> may list macnodes.fleet.synapse.dev cluster-wide",
		"Group system:serviceaccounts:nodes may get leases.coordination.k8s.io/a in leases",
		"Group system:serviceaccounts:nodes may get leases.coordination.k8s.io/b in leases",
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("grant %d: got %q, want %q", i, got[i], want[i])
		}
	}
}

func TestDiffIgnoresNamesButNotRights(t *testing.T) {
	config := grantsOf(t, install(t, "synapse-controller", "synapse-controller", "get, list"))
	chart := grantsOf(t, install(t, "synapse-fleet", "synapse-fleet", "get, list"))
	if a, b := Diff(chart, config); len(a)+len(b) != 0 {
		t.Fatalf("renamed objects granting the same rights differ: %v / %v", a, b)
	}
	wider := grantsOf(t, install(t, "synapse-fleet", "synapse-fleet", "get, list, delete"))
	a, b := Diff(wider, config)
	if len(a) != 1 || a[0].String() != "<the controller> may delete macnodes.fleet.synapse.dev cluster-wide" || len(b) != 0 {
		t.Fatalf("a chart that also deletes MacNodes: got %v / %v", a, b)
	}
}

func TestOfRefusesABindingToARoleItDoesNotHold(t *testing.T) {
	objs := install(t, "sa", "r", "get")
	var kept []*unstructured.Unstructured
	for _, u := range objs {
		if u.GetKind() != "Role" {
			kept = append(kept, u)
		}
	}
	if _, err := Of(kept); err == nil || !strings.Contains(err.Error(), "Role/leases/r-lease") {
		t.Fatalf("got %v, want an error naming the missing Role", err)
	}
}

func TestOfWantsExactlyOneDeployment(t *testing.T) {
	objs := install(t, "sa", "r", "get")
	objs = append(objs, objs[0].DeepCopy())
	if _, err := Of(objs); err == nil {
		t.Fatal("two Deployments: which is the controller?")
	}
}
