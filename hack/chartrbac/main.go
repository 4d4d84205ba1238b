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

// Command chartrbac fails when the chart, as `helm template` renders it (read from a file or
// stdin), grants other rights than config/default, or classifies requests for API Priority
// and Fairness otherwise: the local fleet, `make dev` and the e2e suite run the controller and
// the Macs under config/default's RBAC and FlowSchemas, so this is what makes them the
// chart's too. `make helm-lint`, run by CI, runs it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/ck-synapse/synapse-fleet/internal/flowclasses"
	"github.com/ck-synapse/synapse-fleet/internal/manifests"
	"github.com/ck-synapse/synapse-fleet/internal/rbacgrants"
)

func main() {
	config := flag.String("config", "config/default", "the kustomize directory the chart must grant the same rights as")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: chartrbac [--config DIR] RENDERED-CHART.yaml (- for stdin)")
		os.Exit(2)
	}
	if err := run(*config, flag.Arg(0)); err != nil {
		fmt.Fprintln(os.Stderr, "chartrbac:", err)
		os.Exit(1)
	}
}

func run(config, rendered string) error {
	if rendered == "-" {
		rendered = filepath.Join("/dev", "stdin")
	}
	chart, err := manifests.ReadFile(rendered)
	if err != nil {
		return err
	}
	kust, err := manifests.Read(config)
	if err != nil {
		return err
	}
	fromChart, err := rbacgrants.Of(chart)
	if err != nil {
		return fmt.Errorf("the chart: %w", err)
	}
	fromConfig, err := rbacgrants.Of(kust)
	if err != nil {
		return fmt.Errorf("%s: %w", config, err)
	}
	onlyChart, onlyConfig := rbacgrants.Diff(fromChart, fromConfig)
	for _, g := range onlyChart {
		fmt.Fprintln(os.Stderr, "only the chart grants:", g)
	}
	for _, g := range onlyConfig {
		fmt.Fprintln(os.Stderr, "only "+config+" grants:", g)
	}
	if len(onlyChart)+len(onlyConfig) > 0 {
		return fmt.Errorf("the chart and %s grant different rights (%d and %d apart)", config, len(onlyChart), len(onlyConfig))
	}
	fmt.Printf("the chart grants what %s grants: %d rights\n", config, len(fromChart))

	// The chart renders the FlowSchemas by hand (its ServiceAccount is the release's): they
	// must classify requests as config/default's do.
	classesChart, err := flowclasses.Of(chart)
	if err != nil {
		return fmt.Errorf("the chart: %w", err)
	}
	classesConfig, err := flowclasses.Of(kust)
	if err != nil {
		return fmt.Errorf("%s: %w", config, err)
	}
	if !slices.Equal(classesChart, classesConfig) {
		return fmt.Errorf("the chart's FlowSchemas classify requests otherwise than %s's:\nchart:  %v\nconfig: %v", config, classesChart, classesConfig)
	}
	fmt.Printf("the chart's FlowSchemas classify as %s's: %d schemas\n", config, len(classesChart))
	return nil
}
