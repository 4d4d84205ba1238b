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

// budgetHeld: the charges recomputed from scratch — every reservation of a lane's shape at
// what the stress tool knows one charges, less every acknowledged eviction and every refund —
// equal what the supervisor says it charged, and never pass the budget; and a charge is refunded
// only after its worker's exit was confirmed or the worker refused the admission.
func budgetHeld(tl []TimelineEvent, budget int, layers map[string]int) Check {
	charged := 0
	exited := map[string]bool{}  // a lane's exit was confirmed: its shapes' refunds follow
	refused := map[string]bool{} // lane/shape: the worker refused its admission
	for _, e := range tl {
		key := fmt.Sprintf("%s/%d", e.Model, e.Shape)
		switch e.Event {
		case "exit_confirmed":
			exited[e.Model] = true
			continue
		case "admission_refused":
			refused[key] = true
			continue
		case "reservation":
			exited[e.Model] = false
			charged += layers[e.Model]
		case "eviction_ack":
			charged -= layers[e.Model]
		case "refund":
			if !exited[e.Model] && !refused[key] {
				return Check{Name: "budget", Detail: fmt.Sprintf("%s refunded at %.1f ms without a confirmed exit or a refused admission", key, e.Ms)}
			}
			delete(refused, key)
			charged -= layers[e.Model]
		default:
			continue
		}
		if charged != e.Used {
			return Check{Name: "budget", Detail: fmt.Sprintf("%s of %s at %.1f ms: the supervisor charges %d, the timeline adds up to %d",
				e.Event, key, e.Ms, e.Used, charged)}
		}
		if charged > budget || charged < 0 {
			return Check{Name: "budget", Detail: fmt.Sprintf("%d executables charged at %.1f ms, of %d", charged, e.Ms, budget)}
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
