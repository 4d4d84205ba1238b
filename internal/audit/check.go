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

package audit

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
)

// Check runs every test the audit document at docPath (in the module at dir) names and writes
// one line per test to out. It returns an error when any named test is missing from the run,
// skipped or failed (or, darwin-only, not compiled for darwin).
func Check(ctx context.Context, r Runner, docPath string, out io.Writer) error {
	data, err := os.ReadFile(filepath.Join(r.Dir, docPath))
	if err != nil {
		return err
	}
	a, err := Parse(string(data))
	if err != nil {
		return fmt.Errorf("%s: %w", docPath, err)
	}
	outcomes, err := r.Run(ctx, a.Packages())
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PACKAGE\tTEST\tRESULT")
	bad := 0
	for _, o := range outcomes {
		pkg := o.Package
		if o.Darwin {
			pkg += " (darwin)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", pkg, o.Name, o.Result)
		if !o.OK() {
			bad++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if bad > 0 {
		return fmt.Errorf("%d of the %d tests %s names did not pass: a row they pin is not pinned", bad, len(outcomes), docPath)
	}
	fmt.Fprintf(out, "all %d tests of the %d rows of %s passed (darwin-only ones compiled for darwin/arm64)\n", len(outcomes), len(a.Rows), docPath)
	return nil
}
