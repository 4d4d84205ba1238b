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

// Package flowclasses says how a set of manifests classifies requests for API Priority and
// Fairness, in a form that does not depend on what the objects are named: each FlowSchema as
// its precedence, distinguisher, rules and the spec of the priority level it sends requests to
// (the level's own spec when the manifests define it, its name when it is one of the API
// server's). A ServiceAccount subject is written as its role, the controller's, since a Helm
// release names the controller's ServiceAccount after itself.
package flowclasses

import (
	"encoding/json"
	"fmt"
	"slices"

	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// Of is the classes of objs, one canonical JSON text per FlowSchema, sorted.
func Of(objs []*unstructured.Unstructured) ([]string, error) {
	levels := map[string]flowcontrolv1.PriorityLevelConfigurationSpec{}
	var schemas []flowcontrolv1.FlowSchema
	for _, u := range objs {
		switch u.GetKind() {
		case "PriorityLevelConfiguration":
			var pl flowcontrolv1.PriorityLevelConfiguration
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &pl); err != nil {
				return nil, fmt.Errorf("PriorityLevelConfiguration %s: %w", u.GetName(), err)
			}
			levels[pl.Name] = pl.Spec
		case "FlowSchema":
			var fs flowcontrolv1.FlowSchema
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &fs); err != nil {
				return nil, fmt.Errorf("FlowSchema %s: %w", u.GetName(), err)
			}
			schemas = append(schemas, fs)
		}
	}
	var out []string
	for _, fs := range schemas {
		spec := fs.Spec.DeepCopy()
		for i := range spec.Rules {
			for j := range spec.Rules[i].Subjects {
				if sa := spec.Rules[i].Subjects[j].ServiceAccount; sa != nil {
					sa.Name, sa.Namespace = "the controller's", "the controller's"
				}
			}
		}
		level := any(spec.PriorityLevelConfiguration.Name)
		if l, ok := levels[spec.PriorityLevelConfiguration.Name]; ok {
			level = l
		}
		spec.PriorityLevelConfiguration.Name = ""
		b, err := json.Marshal(struct {
			Schema *flowcontrolv1.FlowSchemaSpec `json:"schema"`
			Level  any                           `json:"level"`
		}{spec, level})
		if err != nil {
			return nil, err
		}
		out = append(out, string(b))
	}
	slices.Sort(out)
	return out, nil
}
