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

// Command kubectl-synapse is the fleet's kubectl plugin: on the PATH, `kubectl synapse lanes`
// (and macs, compiles, why LANE) runs it.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/kubectl-synapse/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := cli.NewCommand(cli.Options{Out: os.Stdout, Clock: clock.RealClock{}}).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}
