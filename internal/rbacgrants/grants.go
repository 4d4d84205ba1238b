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

// Package rbacgrants says what a set of manifests grants to whom, one atomic right at a time,
// so that two renderings of the same install (the chart's and config/default's) can be
// compared by effect rather than by the names they give their objects: the controller that the
// local fleet and the e2e suite run under config/default's RBAC is then known to run under the
// chart's too.
package rbacgrants

import (
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// Controller stands for the ServiceAccount the Deployment runs as, whatever a rendering
// names it.
const Controller = "<the controller>"

// Grant is one right: a verb on a resource (or non-resource URL) of an API group, optionally
// of one named object, in a namespace ("" for every namespace) to a subject.
type Grant struct {
	Subject, Namespace, APIGroup, Resource, ResourceName, Verb string
}

func (g Grant) String() string {
	where := "cluster-wide"
	if g.Namespace != "" {
		where = "in " + g.Namespace
	}
	what := g.Resource
	if g.APIGroup != "" {
		what += "." + g.APIGroup
	}
	if g.ResourceName != "" {
		what += "/" + g.ResourceName
	}
	return fmt.Sprintf("%s may %s %s %s", g.Subject, g.Verb, what, where)
}

// Of lists the grants the bindings among objs make, each once, sorted. The ServiceAccount of
// the one Deployment among objs is named Controller; a binding to a role objs do not hold is
// an error, since the comparison would otherwise miss it.
func Of(objs []*unstructured.Unstructured) ([]Grant, error) {
	controller, err := controllerAccount(objs)
	if err != nil {
		return nil, err
	}
	roles := map[string][]rbacv1.PolicyRule{} // "ClusterRole/name" or "Role/namespace/name"
	var bindings []rbacv1.RoleBinding         // a ClusterRoleBinding as a RoleBinding of no namespace
	for _, u := range objs {
		switch u.GetKind() {
		case "ClusterRole", "Role":
			var r rbacv1.Role
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
				return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
			}
			roles[roleKey(u.GetKind(), u.GetNamespace(), u.GetName())] = r.Rules
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.RoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
				return nil, fmt.Errorf("%s %s: %w", u.GetKind(), u.GetName(), err)
			}
			if u.GetKind() == "ClusterRoleBinding" {
				b.Namespace = ""
			}
			bindings = append(bindings, b)
		}
	}
	seen := map[Grant]bool{}
	for _, b := range bindings {
		key := roleKey(b.RoleRef.Kind, b.Namespace, b.RoleRef.Name)
		rules, ok := roles[key]
		if !ok {
			return nil, fmt.Errorf("binding %s/%s refers to %s, which the manifests do not hold", b.Namespace, b.Name, key)
		}
		for _, s := range b.Subjects {
			subject := s.Kind + " " + s.Name
			if s.Kind == rbacv1.ServiceAccountKind {
				subject = s.Kind + " " + s.Namespace + "/" + s.Name
				if s.Namespace+"/"+s.Name == controller {
					subject = Controller
				}
			}
			for _, r := range rules {
				for _, g := range expand(r) {
					g.Subject, g.Namespace = subject, b.Namespace
					seen[g] = true
				}
			}
		}
	}
	out := make([]Grant, 0, len(seen))
	for g := range seen {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b Grant) int { return strings.Compare(a.String(), b.String()) })
	return out, nil
}

// Diff lists the grants only a holds and those only b holds.
func Diff(a, b []Grant) (onlyA, onlyB []Grant) {
	for _, g := range a {
		if !slices.Contains(b, g) {
			onlyA = append(onlyA, g)
		}
	}
	for _, g := range b {
		if !slices.Contains(a, g) {
			onlyB = append(onlyB, g)
		}
	}
	return onlyA, onlyB
}

func roleKey(kind, namespace, name string) string {
	if kind == "ClusterRole" {
		return kind + "/" + name
	}
	return kind + "/" + namespace + "/" + name
}

// controllerAccount is "namespace/name" of the ServiceAccount the one Deployment runs as.
func controllerAccount(objs []*unstructured.Unstructured) (string, error) {
	var found []string
	for _, u := range objs {
		if u.GetKind() != "Deployment" {
			continue
		}
		sa, _, err := unstructured.NestedString(u.Object, "spec", "template", "spec", "serviceAccountName")
		if err != nil || sa == "" {
			return "", fmt.Errorf("Deployment %s/%s names no serviceAccountName", u.GetNamespace(), u.GetName())
		}
		found = append(found, u.GetNamespace()+"/"+sa)
	}
	if len(found) != 1 {
		return "", fmt.Errorf("want one Deployment (the controller), found %d", len(found))
	}
	return found[0], nil
}

// expand splits a rule into one grant per group, resource, name and verb (no subject or
// namespace yet).
func expand(r rbacv1.PolicyRule) []Grant {
	var out []Grant
	names := r.ResourceNames
	if len(names) == 0 {
		names = []string{""}
	}
	for _, verb := range r.Verbs {
		for _, url := range r.NonResourceURLs {
			out = append(out, Grant{Resource: url, Verb: verb})
		}
		for _, group := range r.APIGroups {
			for _, res := range r.Resources {
				for _, name := range names {
					out = append(out, Grant{APIGroup: group, Resource: res, ResourceName: name, Verb: verb})
				}
			}
		}
	}
	return out
}
