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

package agentcmd

import (
	"fmt"
	"math"
	"os"
	"runtime/debug"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"
)

// DefaultMemoryLimit is the agent's soft memory limit unless --memory-limit or GOMEMLIMIT says
// otherwise. The agent's own work needs a few tens of MiB; what grows is garbage a flood of
// calls leaves between collections (bodies read and refused, a 32 MiB one among them), which the
// collector, paced by GOGC alone, lets reach twice the live heap before it runs: under make load
// the agent's RSS peaked at 254 MiB of its 256 MiB bound. Near the limit the collector runs
// sooner and hands memory back to the system (the Go runtime's GC guide, "Memory limit").
const DefaultMemoryLimit = "192Mi"

// memoryLimit sets the Go runtime's soft memory limit from --memory-limit (a quantity, "0" for
// none). The flag's default gives way to GOMEMLIMIT when that is set; a flag given explicitly
// wins over both. It returns the limit in force, in bytes (math.MaxInt64 for none).
func memoryLimit(value string, explicit bool, log logr.Logger) (int64, error) {
	if !explicit && os.Getenv("GOMEMLIMIT") != "" {
		limit := debug.SetMemoryLimit(-1) // read, not changed: the runtime applied GOMEMLIMIT
		log.Info("the soft memory limit is GOMEMLIMIT's", "bytes", limit)
		return limit, nil
	}
	q, err := resource.ParseQuantity(value)
	if err != nil {
		return 0, fmt.Errorf("--memory-limit %q: %w", value, err)
	}
	limit := q.Value()
	switch {
	case limit < 0:
		return 0, fmt.Errorf("--memory-limit %q: a limit is not negative", value)
	case limit == 0:
		limit = math.MaxInt64
	}
	debug.SetMemoryLimit(limit)
	return limit, nil
}
