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

package servingcert

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"
)

// The manager reads its template, and its template loop may read a newer one before the
// request made with the first is created: the request still holds the template it asked with,
// or the manager, handed the newer one, would abandon it and ask again.
func TestARequestHoldsTheTemplateItAskedWithThoughANewerWasHandedMeanwhile(t *testing.T) {
	s, err := New(Config{Node: "mac-a", Addresses: []string{"192.0.2.1"}, Client: fake.NewClientset(), Clock: clocktesting.NewFakeClock(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	s.open = true // the node reports its addresses
	first := s.currentTemplate()
	s.ServeLanes([]types.NamespacedName{{Namespace: "default", Name: "gte"}})
	if newer := s.currentTemplate(); newer == first {
		t.Fatal("a lane placed did not change the template")
	}
	s.requested(first.DNSNames)
	for range 3 {
		if got := s.currentTemplate(); got != first {
			t.Fatalf("handed %v while the request made with %v waits", got.DNSNames, first.DNSNames)
		}
	}
}
