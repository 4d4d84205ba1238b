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

package workerhost

import (
	"context"
	"errors"
	"testing"

	"github.com/go-logr/logr/testr"

	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

func TestAWorkerThatCannotBeLaunchedIsSpawnsError(t *testing.T) {
	errNoRoom := errors.New("no room for another worker")
	var launched []int64
	h := New(Config{Backend: "sim", Log: testr.New(t),
		Launch: func(s supervisor.ModelSpec, gen int64) (Streams, error) {
			launched = append(launched, gen)
			return Streams{}, errNoRoom
		}})
	w, _, err := h.Spawn(context.Background(), spec, 4)
	if !errors.Is(err, errNoRoom) || w != nil {
		t.Fatalf("spawning answered %v, %v; want the launch's error", w, err)
	}
	if len(launched) != 1 || launched[0] != 4 {
		t.Errorf("the launch was asked for generations %v, want [4]", launched)
	}
}
