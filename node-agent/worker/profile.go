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
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// ProfileDirEnv names the folder a worker writes its admit profile to, when set.
const ProfileDirEnv = "SYNAPSE_ANE_PROFILE_DIR"

// admitProfile is one admission's profile record: the seed's cache_hit and compiled counts and a
// layer_loads row per layer, with its origin and time.
type admitProfile struct {
	Record     string            `json:"record"`
	Shape      uint32            `json:"shape"`
	Outcome    string            `json:"outcome"`
	CacheHit   int               `json:"cache_hit"`
	Compiled   int               `json:"compiled"`
	TotalMs    float64           `json:"total_ms"`
	LayerLoads []layerLoadRecord `json:"layer_loads"`
}

type layerLoadRecord struct {
	Layer  int     `json:"layer"`
	Origin string  `json:"origin"`
	Ms     float64 `json:"ms"`
}

// profileAdmit writes an admission's profile record, one JSON object a line.
func (s *Server) profileAdmit(rung uint32, a Admission, outcome string) {
	if s.Profile == nil {
		return
	}
	rec := admitProfile{Record: "admit", Shape: rung, Outcome: outcome, CacheHit: a.CacheHit, Compiled: a.Compiled,
		TotalMs: ms(a.Took), LayerLoads: []layerLoadRecord{}}
	for _, l := range a.LayerLoads {
		rec.LayerLoads = append(rec.LayerLoads, layerLoadRecord{Layer: l.Layer, Origin: l.Origin, Ms: ms(l.Took)})
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return
	}
	if _, err := s.Profile.Write(append(data, '\n')); err != nil {
		fmt.Fprintf(s.Stderr, "ane-direct admit profile: %v\n", err)
	}
}

// OpenProfile opens this process's admit profile in dir: one file per worker process, so
// records of concurrent workers never interleave.
func OpenProfile(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("the admit profile folder: %w", err)
	}
	return os.OpenFile(filepath.Join(dir, fmt.Sprintf("admit-%d.jsonl", os.Getpid())), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
}
