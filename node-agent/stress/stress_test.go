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

package stress

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/go-logr/logr"

	"github.com/ck-synapse/synapse-fleet/node-agent/internal/workertest"
)

var workerBinary string

func TestMain(m *testing.M) { os.Exit(workertest.Main(m, &workerBinary)) }

// TestEveryCaseRunsAndTheSafetyChecksPass runs each case at a small sim scale and checks the
// report: schema 2, a timeline of the named events, and every check of the gated cases passed.
func TestEveryCaseRunsAndTheSafetyChecksPass(t *testing.T) {
	for _, c := range Cases {
		t.Run(c, func(t *testing.T) {
			rep, err := Run(context.Background(), Config{Case: c, WorkerBinary: workerBinary, StateDir: t.TempDir(), Scale: 0.0002, Log: logr.Discard()})
			if err != nil {
				t.Fatal(err)
			}
			data, err := json.Marshal(rep)
			if err != nil {
				t.Fatal(err)
			}
			if rep.Schema != 2 || len(rep.Timeline) == 0 || len(rep.Requests) == 0 {
				t.Fatalf("report %s", data)
			}
			seen := map[string]bool{}
			for _, e := range rep.Timeline {
				seen[e.Event] = true
			}
			for _, want := range []string{"queue_entry", "reservation", "stream_grant", "rpc_start", "rpc_end", "lease_grant"} {
				if !seen[want] {
					t.Errorf("the timeline has no %s event", want)
				}
			}
			if !rep.Passed {
				t.Fatalf("checks failed: %+v", rep.Checks)
			}
			t.Logf("%s: %d requests, %d events, wall %.0f ms, checks %+v", c, len(rep.Requests), len(rep.Timeline), rep.WallMs, rep.Checks)
		})
	}
}

// TestTheSafetyChecksCanFail feeds the checks what a broken supervisor or device would
// produce, and runs a case on a device that holds fewer programs than the supervisor's budget:
// a check that cannot fail proves nothing.
func TestTheSafetyChecksCanFail(t *testing.T) {
	t.Run("budget", func(t *testing.T) {
		layers := map[string]int{"a": 60, "b": 22}
		overcharged := []TimelineEvent{{Event: "reservation", Model: "a", Used: 60}, {Event: "reservation", Model: "a", Used: 120}}
		refundedTwice := []TimelineEvent{{Event: "reservation", Model: "b", Used: 22}, {Event: "exit_confirmed", Model: "b"},
			{Event: "refund", Model: "b", Used: 0}, {Event: "eviction_ack", Model: "b", Used: 0}}
		refundedAtClose := []TimelineEvent{{Event: "reservation", Model: "b", Used: 22}, {Event: "refund", Model: "b", Used: 0}}
		misreported := []TimelineEvent{{Event: "reservation", Model: "b", Used: 20}}
		for _, tl := range [][]TimelineEvent{overcharged, refundedTwice, refundedAtClose, misreported} {
			if c := budgetHeld(tl, 100, layers); c.Passed {
				t.Fatalf("budgetHeld passed %+v", tl)
			}
		}
		fine := []TimelineEvent{{Event: "reservation", Model: "b", Shape: 128, Used: 22}, {Event: "admission_refused", Model: "b", Shape: 256},
			{Event: "reservation", Model: "b", Shape: 256, Used: 44}, {Event: "admission_refused", Model: "b", Shape: 256},
			{Event: "refund", Model: "b", Shape: 256, Used: 22}, {Event: "exit_confirmed", Model: "b"}, {Event: "refund", Model: "b", Shape: 128, Used: 0}}
		if c := budgetHeld(fine, 100, layers); !c.Passed {
			t.Fatalf("budgetHeld failed a sound timeline: %s", c.Detail)
		}
	})
	t.Run("no-resource-refusal", func(t *testing.T) {
		// 25 programs: one gte shape (22 layers) fits, a qwen shape (28) never does.
		rep, err := Run(context.Background(), Config{Case: "residency-safety", WorkerBinary: workerBinary, StateDir: t.TempDir(),
			Scale: 0.0002, ProgramLimit: 25, Log: logr.Discard()})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range rep.Checks {
			if c.Name == "no-resource-refusal" && c.Passed {
				t.Fatalf("no request was refused for resources on a device of 25 programs: %+v", rep.Checks)
			}
		}
		if rep.Passed {
			t.Fatal("the report passed")
		}
	})
}
