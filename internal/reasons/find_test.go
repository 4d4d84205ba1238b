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

package reasons

import (
	"slices"
	"testing"
)

// TestFindFollowsValuesToTheirConstants reads testdata/sample, which emits a reason in each
// way the finder follows (a helper's parameter, a field, a result of several, a variable set on
// two branches, an assignment to the condition's field, a function's result, an event), and one
// it cannot (fmt.Sprint), which must be reported as built at run time rather than dropped.
func TestFindFollowsValuesToTheirConstants(t *testing.T) {
	r, err := Find(".", nil, "./testdata/sample")
	if err != nil {
		t.Fatal(err)
	}
	var conditions, events []string
	for _, v := range r.Values {
		switch v.Kind {
		case ConditionReason:
			conditions = append(conditions, v.Value)
		case EventReason:
			events = append(events, v.Value)
		}
	}
	slices.Sort(conditions)
	conditions = slices.Compact(conditions)
	want := []string{"FromAConstant", "FromAField", "FromAHelper", "FromAResult", "FromATuple", "FromAVariable", "FromTheOtherBranch"}
	if !slices.Equal(conditions, want) {
		t.Errorf("condition reasons: got %v, want %v", conditions, want)
	}
	if !slices.Equal(events, []string{"AnEvent"}) {
		t.Errorf("event reasons: got %v, want [AnEvent]", events)
	}
	if len(r.Dynamic) != 1 || r.Dynamic[0].Expr != "fmt.Sprint(n)" || r.Dynamic[0].Func != "kindOf" {
		t.Errorf("sites built at run time: got %+v, want fmt.Sprint(n) in kindOf", r.Dynamic)
	}
}
