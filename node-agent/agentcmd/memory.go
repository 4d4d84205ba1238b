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
	"math"
	"runtime/debug"

	"github.com/go-logr/logr"

	"github.com/ck-synapse/synapse-fleet/internal/memlimit"
)

// DefaultMemoryLimit is the agent's soft memory limit unless --memory-limit or GOMEMLIMIT says
// otherwise: none. What the agent may hold by its own bounds grows with the Mac (a 32 MiB body
// per bulk work slot, which is one per core; a lane's batch of 2,048 vectors; each lane's
// tokenizer), and a limit below that would have the collector run without end; a Mac's
// operator sets one that fits it (the Go runtime's GC guide, "Memory limit").
const DefaultMemoryLimit = "0"

// memoryLimit sets the Go runtime's soft memory limit from --memory-limit (a quantity, "0" for
// none). The flag's default gives way to GOMEMLIMIT when that is set; a flag given explicitly
// wins over both. It returns the limit in force, in bytes (math.MaxInt64 for none).
func memoryLimit(value string, explicit bool, log logr.Logger) (int64, error) {
	if !explicit && memlimit.FromEnv() {
		limit := debug.SetMemoryLimit(-1) // read, not changed: the runtime applied GOMEMLIMIT
		log.Info("the soft memory limit is GOMEMLIMIT's", "bytes", limit)
		return limit, nil
	}
	limit, err := memlimit.Parse("--memory-limit", value)
	if err != nil {
		return 0, err
	}
	if limit == 0 {
		limit = math.MaxInt64
	}
	debug.SetMemoryLimit(limit)
	if limit != math.MaxInt64 {
		log.Info("the soft memory limit is --memory-limit's", "bytes", limit)
	}
	return limit, nil
}
