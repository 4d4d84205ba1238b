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

package flowclasses

import (
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

func objects(t *testing.T, docs ...string) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, d := range docs {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(d), &u.Object); err != nil {
			t.Fatal(err)
		}
		out = append(out, u)
	}
	return out
}

const level = `
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: PriorityLevelConfiguration
metadata: {name: %s}
spec: {type: Limited, limited: {nominalConcurrencyShares: %s}}`

const schema = `
apiVersion: flowcontrol.apiserver.k8s.io/v1
kind: FlowSchema
metadata: {name: %s}
spec:
  priorityLevelConfiguration: {name: %s}
  matchingPrecedence: 400
  rules:
  - subjects: [{kind: ServiceAccount, serviceAccount: {name: %s, namespace: %s}}]
    resourceRules: [{verbs: ["*"], apiGroups: ["*"], resources: ["*"], clusterScope: true}]`

func f(format string, args ...any) string {
	for _, a := range args {
		format = strings.Replace(format, "%s", a.(string), 1)
	}
	return format
}

// Two renderings that name their objects and the controller's ServiceAccount otherwise
// classify alike; another level spec, a built-in level instead of its own, or no schema does
// not.
func TestTheClassesAreTheSameWhateverTheObjectsAreNamed(t *testing.T) {
	config, err := Of(objects(t, f(level, "beats", "10"), f(schema, "fs", "beats", "synapse-controller", "synapse-system")))
	if err != nil {
		t.Fatal(err)
	}
	chart, err := Of(objects(t, f(level, "release-beats", "10"), f(schema, "release", "release-beats", "release", "ns")))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(config, chart) {
		t.Fatalf("renamed objects classify otherwise:\n%v\n%v", config, chart)
	}
	for _, other := range [][]string{
		{f(level, "beats", "20"), f(schema, "fs", "beats", "synapse-controller", "synapse-system")},
		{f(schema, "fs", "workload-high", "synapse-controller", "synapse-system")},
		{f(level, "beats", "10")},
	} {
		got, err := Of(objects(t, other...))
		if err != nil {
			t.Fatal(err)
		}
		if slices.Equal(config, got) {
			t.Errorf("%v classifies as %v", other, config)
		}
	}
}
