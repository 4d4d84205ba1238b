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

package index_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/index"
)

// recorder is a FieldIndexer that keeps what is registered.
type recorder map[string]client.IndexerFunc

func (r recorder) IndexField(_ context.Context, obj client.Object, field string, f client.IndexerFunc) error {
	r[typeName(obj)+"/"+field] = f
	return nil
}

func typeName(obj client.Object) string {
	switch obj.(type) {
	case *v1.LanePlacement:
		return "LanePlacement"
	case *v1.CatalogLane:
		return "CatalogLane"
	case *v1.MacNode:
		return "MacNode"
	}
	return "?"
}

// Each index reads its field, and its name is a selectableField of its kind's CRD: a client
// without the cache selects by the same name on the API server.
func TestEveryIndexIsItsKindsSelectableField(t *testing.T) {
	r := recorder{}
	if err := index.Register(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: v1.LanePlacementSpec{Node: "mac-a", Identity: "gte"}}
	l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "l"}, Spec: v1.CatalogLaneSpec{IdentityRef: v1.LocalObjectReference{Name: "gte"}}}
	for key, want := range map[string]struct {
		obj   client.Object
		value string
		crd   string
	}{
		"LanePlacement/" + v1.FieldPlacementNode:     {p, "mac-a", "fleet.synapse.dev_laneplacements.yaml"},
		"LanePlacement/" + v1.FieldPlacementIdentity: {p, "gte", "fleet.synapse.dev_laneplacements.yaml"},
		"CatalogLane/" + v1.FieldLaneIdentity:        {l, "gte", "fleet.synapse.dev_cataloglanes.yaml"},
	} {
		f := r[key]
		if f == nil {
			t.Fatalf("no index %s (registered: %v)", key, keys(r))
		}
		if got := f(want.obj); !slices.Equal(got, []string{want.value}) {
			t.Errorf("index %s reads %v, want %s", key, got, want.value)
		}
		data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "crd", "bases", want.crd))
		if err != nil {
			t.Fatal(err)
		}
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal(data, &crd); err != nil {
			t.Fatal(err)
		}
		field := strings.SplitN(key, "/", 2)[1]
		if !slices.ContainsFunc(crd.Spec.Versions[0].SelectableFields, func(sf apiextensionsv1.SelectableField) bool { return sf.JSONPath == "."+field }) {
			t.Errorf("%s is not a selectableField of %s", field, want.crd)
		}
	}
	// The three above and FieldNodeAddress, a list no selectableField can name.
	if len(r) != 4 {
		t.Errorf("%d indexes registered: %v", len(r), keys(r))
	}
}

// The address index keys each address as a client verifying a certificate compares it: two
// spellings of one address or host name are one key, and a node reporting one twice is listed
// once.
func TestNodeAddressIndexKeysWhatAClientCannotTellApart(t *testing.T) {
	r := recorder{}
	if err := index.Register(context.Background(), r); err != nil {
		t.Fatal(err)
	}
	f := r["MacNode/"+index.FieldNodeAddress]
	if f == nil {
		t.Fatalf("no index MacNode/%s (registered: %v)", index.FieldNodeAddress, keys(r))
	}
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: "mac-a"}}
	n.Status.Addresses = []v1.NodeAddress{{Type: "InternalIP", Address: "192.0.2.7"}, {Type: "ExternalIP", Address: "::ffff:192.0.2.7"},
		{Type: "Hostname", Address: "Mac-A.Example."}, {Type: "InternalDNS", Address: "mac-a.example"}, {Type: "InternalIP", Address: "2001:DB8::1"}}
	want := []string{"192.0.2.7", "mac-a.example", "2001:db8::1"}
	if got := f(n); !slices.Equal(got, want) {
		t.Errorf("index reads %v, want %v", got, want)
	}
	for _, a := range n.Status.Addresses {
		if k := index.AddressKey(a.Address); !slices.Contains(want, k) {
			t.Errorf("AddressKey(%q) = %q, not one of the index's keys %v", a.Address, k, want)
		}
	}
}

func keys(r recorder) []string {
	var out []string
	for k := range r {
		out = append(out, k)
	}
	return out
}
