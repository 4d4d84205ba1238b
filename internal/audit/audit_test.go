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

package audit

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onsi/ginkgo/v2/types"
)

const doc = "| # | Path | Handling | Pinned by |\n" +
	"| --- | --- | --- | --- |\n" +
	"| 1 | a path | handled | `node-agent/x`: `TestA`, `TestB`; `test/e2e`: \"should do it\" |\n" +
	"| 2 | another | handled | `node-agent/x`: `TestB`, `TestC`; `node-agent/y` (darwin): `TestOnTheDevice` |\n" +
	"\n" +
	"| Where | Discarded | Class | Why |\n" +
	"| --- | --- | --- | --- |\n" +
	"| `node-agent/x/x.go` `T.Close` | `f.Close()` | cleanup | the file was only read |\n"

func TestParseReadsThePathsTheirPinsAndTheDiscards(t *testing.T) {
	a, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Rows) != 2 || a.Rows[1].Number != 2 || a.Rows[0].Path != "a path" {
		t.Fatalf("rows %+v", a.Rows)
	}
	want := []Pin{
		{Package: "node-agent/x", Tests: []string{"TestA", "TestB", "TestC"}},
		{Package: "node-agent/y", Darwin: true, Tests: []string{"TestOnTheDevice"}},
		{Package: "test/e2e", Specs: []string{"should do it"}},
	}
	if got := a.Packages(); !reflect.DeepEqual(got, want) {
		t.Fatalf("packages %+v, want %+v", got, want)
	}
	if len(a.Allowed) != 1 || a.Allowed[0].Class != Cleanup || a.Allowed[0].Key() != "node-agent/x/x.go T.Close f.Close()" {
		t.Fatalf("allowed %+v", a.Allowed)
	}
	missing, stale := a.Unclassified([]Discard{{File: "node-agent/x/x.go", Func: "T.Close", What: "f.Close()"}, {File: "node-agent/x/x.go", Func: "run", What: "_ = save()"}})
	if len(missing) != 1 || missing[0].What != "_ = save()" || len(stale) != 0 {
		t.Fatalf("missing %v, stale %v", missing, stale)
	}
	if _, stale := a.Unclassified(nil); len(stale) != 1 {
		t.Fatal("a row for a discard that is gone was not reported")
	}
	for name, bad := range map[string]string{
		"a row without tests": "| 1 | p | h | nothing |\n",
		"a row twice":         "| 1 | p | h | `a`: `TestA` |\n| 1 | p | h | `a`: `TestB` |\n",
		"an unknown class":    "| 1 | p | h | `a`: `TestA` |\n| `a.go` `f` | `g()` | harmless | why |\n",
		"darwin specs":        "| 1 | p | h | `a` (darwin): \"spec\" |\n",
		"no table":            "nothing here\n",
	} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

func TestATestIsJudgedByItsOwnFinalActionOnly(t *testing.T) {
	stream := strings.Join([]string{
		`{"Action":"run","Test":"TestA"}`, `{"Action":"pass","Test":"TestA"}`,
		`{"Action":"run","Test":"TestB"}`, `{"Action":"skip","Test":"TestB"}`,
		`{"Action":"run","Test":"TestC"}`, `{"Action":"run","Test":"TestC/inner"}`, `{"Action":"pass","Test":"TestC/inner"}`, `{"Action":"fail","Test":"TestC"}`,
		`{"Action":"pass","Test":"TestD/inner"}`,
		`# github.com/x/y [build failed]`,
		`{"Action":"fail","Package":"x"}`,
	}, "\n")
	got, err := judgeEvents(strings.NewReader(stream), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"TestA": Passed, "TestB": Skipped, "TestC": Failed}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%v, want %v (a subtest alone does not make its parent run)", got, want)
	}
}

func TestASpecIsJudgedByEverySpecOfItsText(t *testing.T) {
	spec := func(text string, state types.SpecState) types.SpecReport {
		return types.SpecReport{LeafNodeType: types.NodeTypeIt, LeafNodeText: text, State: state}
	}
	data, err := json.Marshal([]types.Report{{SpecReports: types.SpecReports{
		spec("passes", types.SpecStatePassed), spec("twice", types.SpecStatePassed), spec("twice", types.SpecStateFailed),
		spec("skipped", types.SpecStateSkipped), spec("pending", types.SpecStatePending), spec("panics", types.SpecStatePanicked),
		{LeafNodeType: types.NodeTypeBeforeSuite, State: types.SpecStateFailed},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := judgeSpecs(data, []string{"passes", "twice", "skipped", "pending", "panics", "absent"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"passes": Passed, "twice": Failed, "skipped": Skipped, "pending": Skipped, "panics": Failed}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
	if got, err := judgeSpecs(nil, []string{"passes"}); err != nil || len(got) != 0 {
		t.Fatalf("an empty report: %v, %v", got, err)
	}
}

// A real run of a fixture package holding one test of each outcome: only the passing ones
// (and, darwin-only, the ones compiled for darwin) pin anything; a test the run never saw is
// missing.
func TestTheRunnerJudgesEveryNamedTestFromARealRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the fixture package")
	}
	const fixture = "internal/audit/testdata/fixture"
	r := Runner{Dir: "../..", Timeout: 5 * time.Minute}
	got, err := r.Run(context.Background(), []Pin{
		{Package: fixture, Tests: []string{"TestPasses", "TestSkips", "TestFails", "TestPassesWithASubtest", "TestAbsent"},
			Specs: []string{"passes", "is skipped", "fails", "is absent"}},
		{Package: fixture, Darwin: true, Tests: []string{"TestOnlyOnDarwin", "TestAbsent"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Outcome{
		{fixture, "TestPasses", false, Passed}, {fixture, "TestSkips", false, Skipped}, {fixture, "TestFails", false, Failed},
		{fixture, "TestPassesWithASubtest", false, Passed}, {fixture, "TestAbsent", false, Missing},
		{fixture, "passes", false, Passed}, {fixture, "is skipped", false, Skipped}, {fixture, "fails", false, Failed}, {fixture, "is absent", false, Missing},
		{fixture, "TestOnlyOnDarwin", true, Compiled}, {fixture, "TestAbsent", true, Missing},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outcomes\n%v\nwant\n%v", got, want)
	}
	for _, o := range got {
		if o.OK() != (o.Result == Passed || o.Result == Compiled) {
			t.Errorf("%+v judged %v", o, o.OK())
		}
	}
}
