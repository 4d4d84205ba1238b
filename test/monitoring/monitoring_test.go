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

// Package monitoring checks the chart's dashboard and alerting rules against the code: every
// query parses as PromQL and reads only metrics the controller and the agents export, with
// labels they have.
package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"

	"github.com/ck-synapse/synapse-fleet/internal/promnames"
)

const chartFiles = "../../charts/synapse-fleet/files/monitoring"

// targetLabels are the labels Prometheus gives every series of a scrape target.
var targetLabels = []string{"instance", "job"}

// grafanaVariables are Grafana's built-in interval variables, which are not PromQL; each is
// replaced by a duration before a query is parsed.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// exported reads the code's metrics: for each series name, the labels it may carry.
func exported(t *testing.T) map[string][]string {
	t.Helper()
	metrics, err := promnames.Find("../..", ".", "./controllers/...", "./node-agent/...")
	if err != nil {
		t.Fatal(err)
	}
	series := map[string][]string{}
	for _, m := range metrics {
		for name, extra := range m.Series() {
			series[name] = slices.Concat(m.Labels, extra, targetLabels)
		}
	}
	// The check would pass by not looking if the code went unread.
	for _, name := range []string{"synapse_macnode_ready", "synapse_agent_requests_total", "synapse_agent_compile_queue_length", "synapse_agent_request_duration_seconds_bucket"} {
		if _, ok := series[name]; !ok {
			t.Fatalf("the code's metrics do not include %s: found %d series", name, len(series))
		}
	}
	return series
}

// checkQuery parses query and returns what is wrong with it: a metric the code does not
// export, a label it does not have (in a matcher, a grouping, or the legend or annotation
// labels the caller passes).
func checkQuery(series map[string][]string, query string, usedLabels []string) []string {
	expr, err := parser.ParseExpr(grafanaVariables.Replace(query))
	if err != nil {
		return []string{fmt.Sprintf("does not parse: %v", err)}
	}
	var problems []string
	labelsOf := func(node parser.Node) []string {
		var out []string
		for _, vs := range selectors(node) {
			out = append(out, series[vs.Name]...)
		}
		return out
	}
	sawSelector := false
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			sawSelector = true
			known, ok := series[n.Name]
			if !ok {
				problems = append(problems, fmt.Sprintf("reads %q, which the code does not export", n.Name))
				return nil
			}
			for _, m := range n.LabelMatchers {
				if m.Name != model.MetricNameLabel && !slices.Contains(known, m.Name) {
					problems = append(problems, fmt.Sprintf("matches label %q, which %s does not have", m.Name, n.Name))
				}
			}
		case *parser.AggregateExpr:
			have := labelsOf(n.Expr)
			for _, l := range n.Grouping {
				if !slices.Contains(have, l) {
					problems = append(problems, fmt.Sprintf("groups by %q, which none of %s has", l, names(n.Expr)))
				}
			}
		}
		return nil
	})
	if !sawSelector {
		problems = append(problems, "reads no metric")
	}
	have := labelsOf(expr)
	for _, l := range usedLabels {
		if !slices.Contains(have, l) {
			problems = append(problems, fmt.Sprintf("names label %q, which none of %s has", l, names(expr)))
		}
	}
	return problems
}

func selectors(node parser.Node) []*parser.VectorSelector {
	var out []*parser.VectorSelector
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

func names(node parser.Node) string {
	var out []string
	for _, vs := range selectors(node) {
		out = append(out, vs.Name)
	}
	return strings.Join(out, ", ")
}

var (
	legendLabel     = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)
	annotationLabel = regexp.MustCompile(`\$labels\.(\w+)`)
)

func submatches(re *regexp.Regexp, s string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

type panel struct {
	ID      int     `json:"id"`
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

// TestEveryDashboardQueryReadsWhatTheCodeExports parses every panel's queries and checks their
// metrics, matchers, groupings and legend labels against the code's metrics.
func TestEveryDashboardQueryReadsWhatTheCodeExports(t *testing.T) {
	series := exported(t)
	data, err := os.ReadFile(filepath.Join(chartFiles, "synapse-fleet-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		UID    string  `json:"uid"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(data, &dashboard); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dashboard.UID == "" {
		t.Error("the dashboard has no uid: Grafana would make a new copy on every import")
	}
	ids := map[int]bool{}
	queries := 0
	var walk func([]panel)
	walk = func(panels []panel) {
		for _, p := range panels {
			if ids[p.ID] {
				t.Errorf("panel %q reuses id %d", p.Title, p.ID)
			}
			ids[p.ID] = true
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, target := range p.Targets {
				queries++
				for _, problem := range checkQuery(series, target.Expr, submatches(legendLabel, target.LegendFormat)) {
					t.Errorf("panel %q, query %q: %s", p.Title, target.Expr, problem)
				}
			}
		}
	}
	walk(dashboard.Panels)
	if queries < 20 {
		t.Fatalf("read %d queries: the dashboard was not read", queries)
	}
}

// TestEveryAlertingRuleReadsWhatTheCodeExports parses every rule's expression and duration and
// checks its metrics, matchers, groupings and the labels its annotations name.
func TestEveryAlertingRuleReadsWhatTheCodeExports(t *testing.T) {
	series := exported(t)
	data, err := os.ReadFile(filepath.Join(chartFiles, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `json:"name"`
			Rules []struct {
				Alert       string            `json:"alert"`
				Expr        string            `json:"expr"`
				For         string            `json:"for"`
				Labels      map[string]string `json:"labels"`
				Annotations map[string]string `json:"annotations"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.UnmarshalStrict(data, &rules); err != nil {
		t.Fatalf("the rules do not read as rule groups: %v", err)
	}
	alerts := map[string]bool{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || alerts[r.Alert] {
				t.Errorf("group %s: an alert without a name, or named twice (%q)", g.Name, r.Alert)
			}
			alerts[r.Alert] = true
			if r.For != "" {
				if _, err := model.ParseDuration(r.For); err != nil {
					t.Errorf("%s: for %q: %v", r.Alert, r.For, err)
				}
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["runbook"] == "" {
				t.Errorf("%s: every alert says its severity, a summary and where its runbook is", r.Alert)
			}
			var used []string
			for _, text := range r.Annotations {
				used = append(used, submatches(annotationLabel, text)...)
			}
			for _, problem := range checkQuery(series, r.Expr, used) {
				t.Errorf("%s: %s", r.Alert, problem)
			}
		}
	}
	if len(alerts) < 6 {
		t.Fatalf("read %d alerts: the rules were not read", len(alerts))
	}
}
