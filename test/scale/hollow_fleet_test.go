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

package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
)

// runFleet runs a scenario: the fleet, the rollout, the checks, the steady state and the storms.
// Where the lanes went is checked before any figure is kept; a run that fails a check fails.
func runFleet(tb testing.TB, sc fleetScenario) *report {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f, err := startFleet(ctx, sc)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.stop()
	defer func() {
		if tb.Failed() {
			tb.Logf("logs are in %s", sc.Dir)
			tail(tb, filepath.Join(sc.Dir, "controller.log"), 10)
		}
	}()
	rep := &report{Nodes: sc.Nodes, Lanes: sc.Lanes, BootSeconds: f.bootSeconds}
	if sc.Report != "" {
		// Written whatever happens, so a run that fails still says how far it got.
		defer func() {
			if !f.usagesTaken {
				// A run cut short: usages as far as it got. Once taken (after the rollout, or
				// the first storm), they are not taken again: a restarted controller's process
				// is another's, and it would replace the first one's figures.
				f.usages(rep)
			}
			if out, err := json.MarshalIndent(rep, "", "  "); err == nil {
				_ = os.WriteFile(sc.Report, out, 0o644)
			}
		}()
	}
	rep.Config.SimScale, rep.Config.LeaseSeconds, rep.Config.StatusSeconds = sc.SimScale, sc.LeaseDuration.Seconds(), sc.StatusInterval.Seconds()
	rep.Config.GraceSeconds, rep.Config.EvictSeconds, rep.Config.ControllerSeen = sc.Grace.Seconds(), sc.Eviction.Seconds(), controllerUser
	rep.Config.EvictionRate = sc.EvictionRate
	if rep.Config.EvictionRate <= 0 {
		rep.Config.EvictionRate = lifecycle.DefaultEvictionRate
	}

	if err := f.rollout(ctx, rep); err != nil {
		tb.Fatal(err)
	}
	st, err := f.state()
	if err != nil {
		tb.Fatal(err)
	}
	if rep.Spread, err = f.check(st, nil); err != nil {
		tb.Fatalf("after the rollout: %v", err)
	}
	if err := f.steady(ctx, rep); err != nil {
		tb.Fatal(err)
	}
	if !sc.Storms {
		f.usages(rep)
		return rep
	}
	dead := f.dead
	s, err := f.stormKill(ctx, rep, dead)
	if err != nil {
		f.logf("%s: %v", s.Name, err)
		tb.Fatal(err)
	}
	rep.Storms = append(rep.Storms, s)
	f.usages(rep) // the first controller's, over the rollout and the first storm
	for _, run := range []func(context.Context, *report, map[string]bool) (storm, error){f.stormController, f.stormAPIServer} {
		s, err := run(ctx, rep, dead)
		if err != nil {
			// Said in the progress too: a benchmark's failure message comes only at its end,
			// after the fleet has stopped.
			f.logf("%s: %v", s.Name, err)
			tb.Fatal(err)
		}
		rep.Storms = append(rep.Storms, s)
	}
	st, err = f.state()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := f.check(st, dead); err != nil {
		tb.Fatalf("after the storms: %v", err)
	}
	return rep
}

func tail(tb testing.TB, path string, n int) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	lines := slices.DeleteFunc(splitLines(string(data)), func(s string) bool { return s == "" })
	for i, l := range lines {
		if len(l) > 400 {
			lines[i] = l[:400] + " ..."
		}
	}
	tb.Logf("the last lines of %s:\n%s", path, joinLines(lines[max(0, len(lines)-n):]))
}

// TestHollowFleet is the short form of make scale, run by make test: a few hollow Macs, a few
// dozen lanes, the three storms on short timings. It checks behaviour, never speed: every lane
// placed where it may be and Ready, no Mac past its budget, the lanes spread, the dead Macs'
// lanes placed elsewhere, and a controller restart with nothing to change writing nothing.
func TestHollowFleet(t *testing.T) {
	if testing.Short() {
		t.Skip("the hollow fleet runs a control plane")
	}
	sc := fleetScenario{Nodes: env("SCALE_NODES", 10), Lanes: env("SCALE_LANES", 30), SimScale: 0.01,
		LeaseDuration: 6 * time.Second, StatusInterval: time.Second, Grace: 8 * time.Second, Eviction: 8 * time.Second,
		Steady: 5 * time.Second, Storms: true, Dir: t.TempDir(), Progress: testWriter{t}}
	rep := runFleet(t, sc)
	for _, s := range rep.Storms {
		if s.Name == "controller restarted" {
			if w := s.ControllerWrites.total(writeVerbs...); w != 0 {
				t.Errorf("the restarted controller wrote %v with nothing to change", s.ControllerWrites)
			}
		}
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("report:\n%s", out)
}

// BenchmarkHollowFleet is make scale: SCALE_NODES hollow Macs (default 100) and SCALE_LANES
// lanes (default 500) against the real controller, at the agents' and controller's real
// intervals, then the three storms. It prints the report and writes it as JSON to
// SCALE_REPORT, with CPU profiles of the controller, the API server and the hollow fleet during
// the rollout beside it. It runs once, whatever -benchtime says.
func BenchmarkHollowFleet(b *testing.B) {
	dir, err := os.MkdirTemp("", "synapse-scale-")
	if err != nil {
		b.Fatal(err)
	}
	if os.Getenv("SCALE_KEEP") != "" {
		fmt.Printf("the run's directory, kept: %s\n", dir)
	}
	defer func() {
		if !b.Failed() && os.Getenv("SCALE_KEEP") == "" {
			os.RemoveAll(dir) // a failed run's logs stay for a look, and any run's with SCALE_KEEP set
		}
	}()
	reportPath := os.Getenv("SCALE_REPORT")
	profiles := ""
	if reportPath != "" {
		profiles = filepath.Dir(reportPath)
	}
	sc := fleetScenario{Nodes: env("SCALE_NODES", 100), Lanes: env("SCALE_LANES", 500), SimScale: 0.05,
		LeaseDuration: 30 * time.Second, StatusInterval: time.Second, Grace: 40 * time.Second, Eviction: 5 * time.Minute,
		Steady: time.Minute, Storms: os.Getenv("SCALE_STORMS") != "0", Dir: dir, Profile: profiles, Report: reportPath, Progress: os.Stdout}
	if d, err := time.ParseDuration(os.Getenv("SCALE_PROFILE_FOR")); err == nil && d > 0 {
		sc.ProfileFor = d
	}
	if rate, err := strconv.ParseFloat(os.Getenv("SCALE_EVICTION_RATE"), 64); err == nil && rate > 0 {
		// The controller's default (one lost node every 10 s, as the kubelet's node lifecycle
		// controller) re-places a tenth of a thousand Macs in no less than 990 s after the
		// eviction timeout: a fleet that size raises it.
		sc.EvictionRate = rate
	}
	b.ResetTimer()
	rep := runFleet(b, sc)
	b.StopTimer()
	printReport(os.Stdout, rep)
	b.ReportMetric(rep.Rollout.PlacedSeconds, "s-to-place-all")
	b.ReportMetric(rep.Rollout.ReadySeconds, "s-to-ready-all")
	b.ReportMetric(rep.Rollout.ServicedSeconds, "s-to-services-all")
	b.ReportMetric(rep.Rollout.ControllerWritesPerPlacement, "controller-writes/placement")
	b.ReportMetric(rep.Rollout.ReconcilesPerLane, "reconciles/lane")
	b.ReportMetric(float64(rep.Controller.PeakRSSBytes)/(1<<20), "controller-peak-MiB")
	b.ReportMetric(rep.Controller.CPUSeconds, "controller-cpu-s")
}

func printReport(w io.Writer, rep *report) {
	fmt.Fprintf(w, "\n%d hollow Macs, %d lanes (%d placements): lanes per Mac %d to %d, budget charged %.0f%% to %.0f%%\n",
		rep.Nodes, rep.Lanes, rep.Spread.Placements, rep.Spread.LanesPerNodeMin, rep.Spread.LanesPerNodeMax,
		100*rep.Spread.ChargedShareMin, 100*rep.Spread.ChargedShareMax)
	r := rep.Rollout
	fmt.Fprintf(w, "rollout: applied %.1fs, placed %.1fs, Ready %.1fs, callable through the Services %.1fs; controller writes/placement %.2f (%v); API writes/placement %.2f (all clients); reconciles/lane %.2f\n",
		r.AppliedSeconds, r.PlacedSeconds, r.ReadySeconds, r.ServicedSeconds, r.ControllerWritesPerPlacement, r.ControllerWrites, r.APIWritesPerPlacement, r.ReconcilesPerLane)
	fmt.Fprintf(w, "rollout API requests/s: %v\n", r.APIRequestsPerSecond)
	fmt.Fprintf(w, "steady-state API requests/s: %v\n", rep.Steady.APIRequestsPerSecond)
	fmt.Fprintf(w, "controller: %.1f CPU s, peak RSS %.0f MiB; API server %.1f CPU s, %.0f MiB; etcd %.1f CPU s; hollow fleet %.1f CPU s, %.0f MiB\n",
		rep.Controller.CPUSeconds, float64(rep.Controller.PeakRSSBytes)/(1<<20), rep.APIServer.CPUSeconds, float64(rep.APIServer.PeakRSSBytes)/(1<<20),
		rep.Etcd.CPUSeconds, rep.Hollow.CPUSeconds, float64(rep.Hollow.PeakRSSBytes)/(1<<20))
	if len(rep.Storms) > 0 {
		fmt.Fprintf(w, "storms: node grace period %.0fs, eviction timeout %.0fs, eviction rate %g nodes/s\n",
			rep.Config.GraceSeconds, rep.Config.EvictSeconds, rep.Config.EvictionRate)
	}
	for _, s := range rep.Storms {
		fmt.Fprintf(w, "storm %q: re-placed %.1fs, reconverged %.1fs, %.0f API writes (%.0f over the steady rate), controller writes %v\n",
			s.Name, s.ReplacedSeconds, s.ReconvergeSeconds, s.APIWrites, s.ExtraAPIWrites, s.ControllerWrites)
	}
}

// testWriter sends progress lines to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func splitLines(s string) []string { return strings.Split(s, "\n") }

func joinLines(lines []string) string { return strings.Join(lines, "\n") }
