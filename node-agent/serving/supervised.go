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

package serving

import (
	"context"
	"time"

	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// Supervised leases from the residency supervisor.
func Supervised(s *supervisor.Supervisor) Acquirer { return supervised{s} }

type supervised struct{ s *supervisor.Supervisor }

func (a supervised) Acquire(ctx context.Context, lane string, rung int, deadline time.Time) (Lease, error) {
	l, err := a.s.Acquire(ctx, lane, rung, deadline)
	if err != nil {
		return nil, err // never a typed nil inside the interface
	}
	return &l, nil
}
