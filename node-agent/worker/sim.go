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
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/protocol"
	pb "github.com/ck-synapse/synapse-fleet/node-agent/protocol/workerv3"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
)

// Separator splits a rerank sequence into its query and its document.
const Separator = 0

// Sim is the sim backend: the model runs on the simane stand-in, and its outputs are real,
// checkable numbers: an embedding is a deterministic function of the model identity and the
// token ids, L2-normalised, of the model's dimension; a rerank score is the cosine of the
// query's and the document's embeddings.
type Sim struct {
	Machine   *simane.Machine
	SigningID string
	Clock     clock.PassiveClock
	// ProbeRatio is the device-to-CPU time ratio the placement probe reports: the stand-in has
	// no CPU reference, so it times the device and models the reference. 0 means 0.4, the
	// middle of what the Neural Engine measures; above 0.8 the probe fails, as a model that
	// runs on the CPU would. ProbeRatios overrides it for single rungs.
	ProbeRatio  float64
	ProbeRatios map[uint32]float64

	mu       sync.Mutex
	model    *pb.Load
	seed     string         // the model's outputs follow from it: the artifact's, else the identity
	resident map[uint32]int // rung -> layers loaded
}

// simParams is a sim artifact's params.json (see package artifact).
type simParams struct {
	Seed       string `json:"seed"`
	Layers     uint32 `json:"layers"`
	Dimensions uint32 `json:"dimensions"`
}

func (s *Sim) layer(i int, rung uint32) simane.Layer {
	return simane.Layer{Model: s.model.Identity, Index: i, Rung: int(rung), WeightsDigest: s.model.Identity + "/weights"}
}

// Load records the model and checks, for each rung, whether aned holds its first and last
// layers: layers compile in order within one admission, so a cached last layer means the whole
// rung was compiled once.
func (s *Sim) Load(ctx context.Context, l *pb.Load) ([]uint32, error) {
	if l.Layers == 0 || l.Dimensions == 0 || len(l.Rungs) == 0 {
		return nil, &Error{Code: "invalid_model", Message: "the model needs layers, dimensions and rungs"}
	}
	seed := l.Identity
	if l.ArtifactDir != "" {
		// The agent verified the artifact before this load; the worker reads what it holds.
		data, err := os.ReadFile(filepath.Join(l.ArtifactDir, "params.json"))
		if err != nil {
			return nil, &Error{Code: "artifact_unreadable", Message: err.Error()}
		}
		var p simParams
		if err := json.Unmarshal(data, &p); err != nil {
			return nil, &Error{Code: "artifact_unreadable", Message: err.Error()}
		}
		if p.Layers != l.Layers || p.Dimensions != l.Dimensions {
			return nil, &Error{Code: "invalid_model", Message: fmt.Sprintf("the artifact has %d layers of %d dimensions; %d of %d were asked for",
				p.Layers, p.Dimensions, l.Layers, l.Dimensions)}
		}
		seed = p.Seed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A model loaded again replaces the one before, whose programs are given back.
	s.releaseLocked()
	s.model, s.seed = l, seed
	s.resident = map[uint32]int{}
	cached := []uint32{}
	for _, r := range l.Rungs {
		if s.Machine.Cached(s.SigningID, s.layer(0, r)) && s.Machine.Cached(s.SigningID, s.layer(int(l.Layers)-1, r)) {
			cached = append(cached, r)
		}
	}
	return cached, nil
}

// Release gives back every program the worker holds, as the device does when the worker's
// process exits. A worker whose process ends needs nothing of it; it is for a stand-in whose
// workers run in the agent's own process (the hollow Macs of test/scale), where no process
// exit frees them and the machine would count them held for good.
func (s *Sim) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked()
	s.model = nil
}

func (s *Sim) releaseLocked() {
	for r := range s.resident {
		s.unloadLocked(r)
	}
}

// unloadLocked gives back the programs of a resident rung's layers.
func (s *Sim) unloadLocked(rung uint32) {
	for range s.resident[rung] {
		s.Machine.Unload()
	}
	delete(s.resident, rung)
}

// Admit loads every layer of rung, from aned's cache where it can, compiling the rest.
func (s *Sim) Admit(ctx context.Context, rung uint32) (Admission, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.model == nil {
		return Admission{}, &Error{Code: "not_loaded", Message: "no model is loaded"}
	}
	if !slices.Contains(s.model.Rungs, rung) {
		return Admission{}, &Error{Code: "unsupported_shape", Message: fmt.Sprintf("rung %d is not in the ladder %v", rung, s.model.Rungs)}
	}
	if _, ok := s.resident[rung]; ok {
		return Admission{Layers: s.resident[rung], CacheHit: s.resident[rung]}, nil
	}
	start := s.Clock.Now()
	var a Admission
	for i := range int(s.model.Layers) {
		layerStart := s.Clock.Now()
		out, err := s.Machine.Load(ctx, s.SigningID, s.layer(i, rung))
		if err != nil {
			for range a.Layers {
				s.Machine.Unload()
			}
			a.Took = s.Clock.Since(start)
			switch {
			case errors.Is(err, simane.ErrResourcesExhausted):
				return a, &Error{Code: "ane_resources_exhausted", Message: err.Error()}
			case errors.Is(err, simane.ErrTempSpaceLow):
				return a, &Error{Code: "ane_temp_space_low", Message: err.Error()}
			case errors.Is(err, simane.ErrCompileFailed):
				return a, &Error{Code: "compile_failed", Message: err.Error()}
			}
			return a, err
		}
		a.Layers++
		if out.FromCache {
			a.CacheHit++
		} else {
			a.Compiled++
		}
		a.LayerLoads = append(a.LayerLoads, LayerLoad{Layer: i, Origin: originOf(out.FromCache), Took: s.Clock.Since(layerStart)})
		reportProgress(ctx, a.Layers, int(s.model.Layers))
	}
	a.Took = s.Clock.Since(start)
	s.resident[rung] = a.Layers
	return a, nil
}

// Evict releases a resident rung.
func (s *Sim) Evict(rung uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.resident[rung]; !ok {
		return &Error{Code: "not_resident", Message: fmt.Sprintf("rung %d is not resident", rung)}
	}
	s.unloadLocked(rung)
	return nil
}

// Resident lists the resident rungs.
func (s *Sim) Resident() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.resident))
}

// Execute computes the outputs of sequences on a resident rung. A sequence longer than the
// rung is refused, never truncated. Every sequence is checked before any runs, so a refused
// input ran nothing (protocol.InputRefusal).
func (s *Sim) Execute(ctx context.Context, e *pb.Execute) (*pb.Reply, error) {
	s.mu.Lock()
	model, seed := s.model, s.seed
	_, ok := s.resident[e.Rung]
	s.mu.Unlock()
	if !ok {
		return nil, &Error{Code: "not_resident", Message: fmt.Sprintf("rung %d is not resident", e.Rung)}
	}
	if e.Task != "embed" && e.Task != "rerank" {
		return nil, &Error{Code: protocol.CodeInvalidInput, Message: fmt.Sprintf("unknown task %q", e.Task)}
	}
	for i, seq := range e.Sequences {
		if len(seq.TokenIds) == 0 || len(seq.TokenIds) > int(e.Rung) {
			return nil, &Error{Code: protocol.CodeUnsupportedShape, Message: fmt.Sprintf("sequence %d has %d tokens; rung %d takes 1 to %d", i, len(seq.TokenIds), e.Rung, e.Rung)}
		}
		if e.Task != "rerank" {
			continue
		}
		if q, d, found := cut(seq.TokenIds); !found || len(q) == 0 || len(d) == 0 {
			return nil, &Error{Code: protocol.CodeInvalidInput, Message: fmt.Sprintf("rerank sequence %d is not query, separator, document", i)}
		}
	}
	reply := &pb.Reply{}
	for _, seq := range e.Sequences {
		if e.Task == "embed" {
			reply.Vectors = append(reply.Vectors, &pb.Vector{Values: Embed(seed, int(model.Dimensions), seq.TokenIds)})
			continue
		}
		q, d, _ := cut(seq.TokenIds)
		reply.Scores = append(reply.Scores, Score(seed, int(model.Dimensions), q, d))
	}
	return reply, nil
}

func cut(tokens []uint32) (before, after []uint32, found bool) {
	i := slices.Index(tokens, Separator)
	if i < 0 {
		return tokens, nil, false
	}
	return tokens[:i], tokens[i+1:], true
}

// Embed is the sim model's embedding: the sum over tokens of a pseudo-random vector per
// (model, token), L2-normalised. Equal inputs give equal outputs on every machine.
func Embed(identity string, dims int, tokens []uint32) []float32 {
	h := fnv.New64a()
	h.Write([]byte(identity))
	seed := h.Sum64()
	sum := make([]float64, dims)
	for _, t := range tokens {
		x := seed ^ uint64(t)*0x9e3779b97f4a7c15
		for d := range sum {
			x = splitmix(x)
			sum[d] += float64(int64(x)) / math.MaxInt64
		}
	}
	var norm float64
	for _, v := range sum {
		norm += v * v
	}
	norm = math.Sqrt(norm)
	out := make([]float32, dims)
	for d, v := range sum {
		out[d] = float32(v / norm)
	}
	return out
}

// Score is the sim reranker's relevance of document to query: the cosine of their embeddings.
func Score(identity string, dims int, query, document []uint32) float32 {
	q, d := Embed(identity, dims, query), Embed(identity, dims, document)
	var dot float64
	for i := range q {
		dot += float64(q[i]) * float64(d[i])
	}
	return float32(dot)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// ParseProbeRatios reads the sim's probe ratio setting: a ratio for every rung ("0.97"),
// ratios for single rungs ("512=0.97,1024=0.9"), or both ("0.5,512=0.97").
func ParseProbeRatios(spec string) (all float64, byRung map[uint32]float64, err error) {
	if strings.TrimSpace(spec) == "" {
		return 0, nil, nil
	}
	for _, part := range strings.Split(spec, ",") {
		rung, ratio, perRung := strings.Cut(strings.TrimSpace(part), "=")
		if !perRung {
			ratio = rung
		}
		r, err := strconv.ParseFloat(ratio, 64)
		if err != nil || r <= 0 || math.IsInf(r, 0) {
			return 0, nil, fmt.Errorf("probe ratio %q: want a positive number, a rung=ratio pair, or a comma-separated list of them", part)
		}
		if !perRung {
			all = r
			continue
		}
		n, err := strconv.ParseUint(rung, 10, 32)
		if err != nil || n == 0 {
			return 0, nil, fmt.Errorf("probe ratio %q: %q is not a rung", part, rung)
		}
		if byRung == nil {
			byRung = map[uint32]float64{}
		}
		byRung[uint32(n)] = r
	}
	return all, byRung, nil
}

// Probe times the fastest of 5 evaluations of a resident rung; the CPU reference's time is
// modelled from ProbeRatio.
func (s *Sim) Probe(ctx context.Context, rung uint32) (device, cpu time.Duration, err error) {
	s.mu.Lock()
	model, seed := s.model, s.seed
	_, ok := s.resident[rung]
	s.mu.Unlock()
	if !ok {
		return 0, 0, &Error{Code: "not_resident", Message: fmt.Sprintf("rung %d is not resident", rung)}
	}
	seq := make([]uint32, min(int(rung), 16))
	for i := range seq {
		seq[i] = uint32(i + 1)
	}
	device = time.Duration(math.MaxInt64)
	for range 5 {
		start := s.Clock.Now()
		Embed(seed, int(model.Dimensions), seq)
		device = min(device, max(s.Clock.Since(start), time.Microsecond))
	}
	ratio := s.ProbeRatio
	if r, ok := s.ProbeRatios[rung]; ok {
		ratio = r
	}
	if ratio == 0 {
		ratio = 0.4
	}
	return device, time.Duration(float64(device) / ratio), nil
}
