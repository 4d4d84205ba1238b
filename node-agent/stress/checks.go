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
	"fmt"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// noOverlappingCompiles: admissions' RPCs never overlap, machine-wide.
func noOverlappingCompiles(tl []TimelineEvent) Check {
	running := 0
	for _, e := range tl {
		if e.RPC != "admit" {
			continue
		}
		switch e.Event {
		case "rpc_start":
			running++
			if running > 1 {
				return Check{Name: "no-overlapping-compiles", Detail: fmt.Sprintf("two admissions ran at %.1f ms (%s/%d)", e.Ms, e.Model, e.Shape)}
			}
		case "rpc_end":
			running--
		}
	}
	return Check{Name: "no-overlapping-compiles", Passed: true}
}

// noResourceRefusal: no request was refused ane_resources_exhausted.
func noResourceRefusal(reqs []RequestRecord) Check {
	for _, r := range reqs {
		if r.Outcome == string(refusal.ResourcesExhausted) {
			return Check{Name: "no-resource-refusal", Detail: "request " + r.ID + " was refused for resources"}
		}
	}
	return Check{Name: "no-resource-refusal", Passed: true}
}

// noLeasedEviction: no eviction was dispatched for a shape while a lease held it.
func noLeasedEviction(tl []TimelineEvent) Check {
	held := map[string]int{}
	for _, e := range tl {
		key := fmt.Sprintf("%s/%d", e.Model, e.Shape)
		switch e.Event {
		case "lease_grant":
			held[key]++
		case "lease_release":
			held[key]--
		case "eviction_dispatch":
			if held[key] > 0 {
				return Check{Name: "no-leased-eviction", Detail: fmt.Sprintf("%s evicted at %.1f ms while leased", key, e.Ms)}
			}
		}
	}
	return Check{Name: "no-leased-eviction", Passed: true}
}

// budgetHeld: the charged executables never exceeded the budget.
func budgetHeld(tl []TimelineEvent, budget int) Check {
	for _, e := range tl {
		if e.Used > budget {
			return Check{Name: "budget", Detail: fmt.Sprintf("%d executables charged at %.1f ms", e.Used, e.Ms)}
		}
	}
	return Check{Name: "budget", Passed: true}
}

// everyRequestServed: n requests, each answered once and served.
func everyRequestServed(reqs []RequestRecord, n int) Check {
	ok := 0
	for _, r := range reqs {
		if r.Outcome == "ok" {
			ok++
		}
	}
	return Check{Name: "every-request-served", Passed: len(reqs) == n && ok == n, Detail: fmt.Sprintf("%d answers, %d served, of %d", len(reqs), ok, n)}
}
