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

// Command audit runs every test the no-silent-fallback audit names, with `go test -json`, and
// fails when one is missing, skipped or failed: `make audit`, run by CI.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/ck-synapse/synapse-fleet/internal/audit"
)

func main() {
	doc := flag.String("doc", "docs/no-silent-fallback.md", "the audit document, relative to the module")
	dir := flag.String("dir", ".", "the module's root")
	timeout := flag.Duration("timeout", 30*time.Minute, "the bound on each package's run")
	verbose := flag.Bool("v", false, "show the tests' output")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var log io.Writer
	if *verbose {
		log = os.Stderr
	}
	if err := audit.Check(ctx, audit.Runner{Dir: *dir, Timeout: *timeout, Log: log}, *doc, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "audit:", err)
		os.Exit(1)
	}
}
