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
	"errors"
	"testing"
)

// TestOpenProbesEveryPrivateMethod runs on a Mac: the frameworks load and every private class
// and selector is present, or Open names what is missing (or says there is no Neural Engine,
// in a virtual machine). It never aborts the process.
func TestOpenProbesEveryPrivateMethod(t *testing.T) {
	r, err := Open()
	var missing *MissingError
	switch {
	case err == nil:
		if len(r.classes) != 4 {
			t.Fatalf("%d classes resolved, want 4", len(r.classes))
		}
	case errors.As(err, &missing):
		t.Skipf("this macOS build lacks part of the private API: %v", err)
	case errors.Is(err, ErrUnsupported):
		t.Skipf("no Neural Engine here: %v", err)
	default:
		t.Fatalf("Open: an untyped error %v", err)
	}
}
