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
	"fmt"
	"sync"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// scheduling runs the compile-scheduling scenarios, each on a cold machine of its own.
func scheduling(ctx context.Context, cfg Config, rep *Report, start time.Time) ([]*rig, error) {
	var rigs []*rig
	scenario := func(name string, run func(r *rig) error) error {
		r, err := newRig(ctx, cfg, fmt.Sprintf("%s/%s/%s", cfg.StateDir, cfg.Case, name), start)
		if err != nil {
			return err
		}
		rigs = append(rigs, r)
		defer r.close(ctx)
		return run(r)
	}
	standalone := map[string]float64{}
	alone := func(name string, m model, tokens int) error {
		return scenario(name, func(r *rig) error {
			rec, _, err := r.request(ctx, name, m, tokens, time.Time{}, false)
			standalone[name] = rec.Ms
			rep.Latencies = append(rep.Latencies, Latency{Scenario: name, RequestID: name, Ms: rec.Ms})
			return err
		})
	}
	if err := alone("gte-alone-128", gte, 100); err != nil {
		return rigs, err
	}
	if err := alone("qwen-alone-4096", qwen, 3000); err != nil {
		return rigs, err
	}
	err := scenario("small-beside-wide", func(r *rig) error {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		recs := make([]RequestRecord, 2)
		wg.Add(2)
		go func() { defer wg.Done(); recs[0], _, errs[0] = r.request(ctx, "wide", qwen, 3000, time.Time{}, false) }()
		time.Sleep(10 * time.Millisecond) // the small shape is asked just after the wide one
		go func() { defer wg.Done(); recs[1], _, errs[1] = r.request(ctx, "small", gte, 100, time.Time{}, false) }()
		wg.Wait()
		rep.Latencies = append(rep.Latencies,
			Latency{Scenario: "small-beside-wide", RequestID: "wide", Ms: recs[0].Ms, StandaloneMs: standalone["qwen-alone-4096"]},
			Latency{Scenario: "small-beside-wide", RequestID: "small", Ms: recs[1].Ms, StandaloneMs: standalone["gte-alone-128"]})
		return firstErr(errs)
	})
	if err != nil {
		return rigs, err
	}
	err = scenario("six-at-once", func(r *rig) error {
		var wg sync.WaitGroup
		var mu sync.Mutex
		errs := make([]error, 6)
		for i, w := range []struct {
			m      model
			tokens int
		}{{gte, 100}, {gte, 200}, {gte, 500}, {qwen, 100}, {qwen, 200}, {qwen, 500}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := fmt.Sprintf("six-%d", i)
				var rec RequestRecord
				rec, _, errs[i] = r.request(ctx, id, w.m, w.tokens, time.Time{}, false)
				mu.Lock()
				rep.Latencies = append(rep.Latencies, Latency{Scenario: "six-at-once", RequestID: id, Ms: rec.Ms})
				mu.Unlock()
			}()
		}
		wg.Wait()
		return firstErr(errs)
	})
	if err != nil {
		return rigs, err
	}
	err = scenario("refused-early", func(r *rig) error {
		// A cold 8192 rung with a 30 s deadline: predicted far later, answered at once.
		rec, _, err := r.request(ctx, "early", qwen, 8000, time.Now().Add(30*time.Second), false)
		rep.Latencies = append(rep.Latencies, Latency{Scenario: "refused-early", RequestID: "early", Ms: rec.Ms})
		if refusal.CodeOf(err) != refusal.ShapeCompiling {
			return fmt.Errorf("the early refusal answered %v, want shape_compiling", err)
		}
		rep.Checks = append(rep.Checks, Check{Name: "refused-early", Passed: rec.Ms < 1000,
			Detail: fmt.Sprintf("answered shape_compiling in %.1f ms", rec.Ms)})
		return nil
	})
	return rigs, err
}

func firstErr(errs []error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}
