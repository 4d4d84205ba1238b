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

package main

import (
	"fmt"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/ane"
)

// placeable is the part of an in-memory model that placing it on the device uses (*ane.Model
// on a Mac, a fake in tests).
type placeable interface {
	Cached() (bool, error)
	Held() ane.Origin
	Compile() error
	Load() error
	Origin() ane.Origin
	KeepErr() error
}

// place loads a model as the worker does: without a compile when aned or the kept compiled
// folder holds it; otherwise, or when that load fails, compiled once within the run's budget
// and loaded. c records which happened: what the cache check found, the held program's failed
// load, the compile and load times, and where the loaded program came from.
func place(m placeable, c *Check, b *budget, now func() time.Time) error {
	held, err := m.Cached()
	if err != nil {
		return err
	}
	c.Cached, c.Held = held, string(m.Held())
	if held {
		start := now()
		err := m.Load()
		if err == nil {
			c.LoadMS, c.Origin = ms(now().Sub(start)), string(m.Origin())
			return nil
		}
		c.HeldLoadError = describe(err)
	}
	if err := b.take(1); err != nil {
		return err
	}
	start := now()
	if err := m.Compile(); err != nil {
		return err
	}
	c.CompileMS = ms(now().Sub(start))
	start = now()
	if err := m.Load(); err != nil {
		return fmt.Errorf("loading after a compile: %w", err)
	}
	c.LoadMS, c.Origin = ms(now().Sub(start)), string(m.Origin())
	if err := m.KeepErr(); err != nil {
		c.KeepError = err.Error()
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// judgeSecondProcess is stage 6's verdict on the second process's checks: every program the
// first process loaded was rebuilt with the same identifier and loaded without a compile.
// A program the second process had to compile still says how it ended (held and failing to
// load, or not held at all), which tells the cache's two failures apart.
func judgeSecondProcess(ids map[string]string, checks []Check) (string, error) {
	origins := map[string]int{}
	for _, c := range checks {
		want, ok := ids[c.Name]
		switch {
		case !ok:
			return "", fmt.Errorf("the second process checked %q, which this run did not load", c.Name)
		case c.Identifier != want:
			return "", fmt.Errorf("%s: the second process built identifier %s, this run %s: the same program must give the same identifier", c.Name, c.Identifier, want)
		case c.Status != Passed:
			return "", fmt.Errorf("%s: %s", c.Name, c.Detail)
		case c.Origin == string(ane.FromCompile) && c.HeldLoadError != nil:
			return "", fmt.Errorf("%s: held as %s but its load failed (%s); it loaded after a compile", c.Name, c.Held, c.HeldLoadError.Message)
		case c.Origin == string(ane.FromCompile):
			return "", fmt.Errorf("%s: neither aned nor a kept folder held it; it loaded after a compile", c.Name)
		}
		origins[c.Origin]++
	}
	if len(checks) != len(ids) {
		return "", fmt.Errorf("the second process checked %d programs of %d", len(checks), len(ids))
	}
	return fmt.Sprintf("all %d programs loaded without a compile (%d from aned's cache, %d from kept folders)", len(checks), origins[string(ane.FromAned)], origins[string(ane.FromKept)]), nil
}
