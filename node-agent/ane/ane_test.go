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

package ane

import (
	"strings"
	"testing"
)

func TestAMissingSelectorIsNamedExactly(t *testing.T) {
	for _, tc := range []struct {
		err  *MissingError
		want string
	}{
		{&MissingError{Class: "_ANEInMemoryModel"}, "no class _ANEInMemoryModel"},
		{&MissingError{Class: "_ANEInMemoryModel", Selector: "compileWithQoS:options:error:", Instance: true}, "-[_ANEInMemoryModel compileWithQoS:options:error:]"},
		{&MissingError{Class: "_ANERequest", Selector: "requestWithInputs:"}, "+[_ANERequest requestWithInputs:]"},
	} {
		if got := tc.err.Error(); !strings.Contains(got, tc.want) {
			t.Errorf("%q does not name %q", got, tc.want)
		}
	}
}

func TestEveryRequiredMethodIsProbedOnce(t *testing.T) {
	seen := map[method]bool{}
	for _, m := range required {
		if seen[m] || m.class == "" || m.selector == "" {
			t.Fatalf("%+v is listed twice or incompletely", m)
		}
		seen[m] = true
	}
	if len(required) < 10 {
		t.Fatalf("%d methods: the call sequence needs at least 10", len(required))
	}
}

func TestACallErrorSaysWhichCallAndWhatTheFrameworkSaid(t *testing.T) {
	e := &CallError{Call: "load", Domain: "com.apple.appleneuralengine", Code: 0x20004, Detail: "program memory full", ResourcesExhausted: true}
	for _, want := range []string{"load failed", "com.apple.appleneuralengine 131076", "program memory full"} {
		if !strings.Contains(e.Error(), want) {
			t.Errorf("%q lacks %q", e.Error(), want)
		}
	}
	if !loadResourceCodes[0x20004] {
		t.Fatal("a full device address window is not a resource refusal")
	}
}
