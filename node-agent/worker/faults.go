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

package worker

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
)

type fault int

const (
	faultNone fault = iota
	faultCrash
	faultMalformed
	faultHang
)

// Faults are failures injected into a worker for tests, each at the n-th message of a kind.
type Faults struct {
	mu    sync.Mutex
	rules map[string]fault // "admit#2" -> crash
	seen  map[string]int
}

// ParseFaults reads a fault list such as "crash:admit:2,malformed:execute:1,hang:evict:1":
// crash the process at the second admission, answer the first execution with garbage, never
// answer the first eviction. An empty list injects nothing.
func ParseFaults(spec string) (*Faults, error) {
	f := &Faults{rules: map[string]fault{}, seen: map[string]int{}}
	if spec == "" {
		return f, nil
	}
	for _, item := range strings.Split(spec, ",") {
		parts := strings.Split(item, ":")
		if len(parts) != 3 {
			return nil, fmt.Errorf("fault %q: want kind:message:n, for example crash:admit:2", item)
		}
		kinds := map[string]fault{"crash": faultCrash, "malformed": faultMalformed, "hang": faultHang}
		k, ok := kinds[parts[0]]
		if !ok {
			return nil, fmt.Errorf("fault %q: kind must be crash, malformed or hang", item)
		}
		n, err := strconv.Atoi(parts[2])
		if err != nil || n < 1 {
			return nil, fmt.Errorf("fault %q: n must be a positive number", item)
		}
		f.rules[fmt.Sprintf("%s#%d", parts[1], n)] = k
	}
	return f, nil
}

// next counts a message of kind and returns the fault to inject for it.
func (f *Faults) next(kind string) fault {
	if f == nil {
		return faultNone
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[kind]++
	return f.rules[fmt.Sprintf("%s#%d", kind, f.seen[kind])]
}
