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

package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/serving"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

// laneState is where a placement's lane is on this node.
type laneState int

const (
	laneLoading   laneState = iota // the worker is starting
	laneSelfCheck                  // the smallest rung is being admitted and checked
	laneReady                      // the self-check passed; prewarm and serving
	laneFailed                     // loading or the self-check failed; retried
	lanePaused                     // the node is paused: unloaded
	laneRetiring                   // the placement is going: unloading
	laneStopped                    // the agent stopped; its next run re-adopts the placement
)

// lane is one placement's lane on this node.
type lane struct {
	placement  types.NamespacedName
	generation int64 // the placement's metadata.generation last reconciled
	// key is the lane's name in the supervisor and serving: <namespace>/<lane>.
	key      string
	spec     v1.LanePlacementSpec
	identity *v1.CertifiedIdentity
	// identityRead is the identity as last read for the placement (placementIdentity).
	identityRead identityCopy
	api          httpapi.Lane
	state        laneState
	// loaded: the supervisor holds the lane (its worker runs or recovers).
	loaded bool
	// failure says why the lane failed or cannot load, for the status.
	failure *v1.Fault
	// verifyReason and verifyMessage say why the identity or the artifact was refused;
	// verified says which artifact passed.
	verifyReason, verifyMessage string
	verified                    *artifact.Verified
	// retryAt is when a failed load is tried again.
	retryAt time.Time
	// probes are the placement probes by rung (each for the generation it names).
	probes map[int]probe
	// said is the placement status the agent last applied (see writePlacementStatus).
	said *saidStatus
}

// identityCopy is a CertifiedIdentity as read for one placement (its UID).
type identityCopy struct {
	placement types.UID
	id        *v1.CertifiedIdentity
}

// saidStatus is a placement's status as the agent applied it, to which placement (its UID), the
// resourceVersion the write left, and when.
type saidStatus struct {
	uid    types.UID
	rv     string
	at     time.Time
	status v1.LanePlacementStatus
}

func laneKey(spec v1.LanePlacementSpec, namespace string) string { return namespace + "/" + spec.Lane }

// Lookup implements httpapi.Catalog: the lane "<namespace>/<lane>" or a lane name unique on
// the node names; else every lane of the model of that name, which the API routes among.
func (a *Agent) Lookup(model string) ([]httpapi.Lane, bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var named, ofModel []*lane
	for _, l := range a.lanes {
		switch {
		case l.key == model || (!strings.Contains(model, "/") && l.spec.Lane == model):
			named = append(named, l)
		case l.identity != nil && l.identity.Spec.Model.Name == model:
			ofModel = append(ofModel, l)
		}
	}
	switch {
	case len(named) > 1:
		keys := make([]string, len(named))
		for i, l := range named {
			keys[i] = l.key
		}
		slices.Sort(keys)
		return nil, false, refusal.New(refusal.InvalidRequest, model, "several lanes of that name are placed here (%s); name one as <namespace>/<lane>", strings.Join(keys, ", "))
	case len(named) == 1:
		if err := a.servable(named[0]); err != nil {
			return nil, false, err
		}
		return []httpapi.Lane{named[0].api}, true, nil
	case len(ofModel) > 0:
		var out []httpapi.Lane
		var first error
		for _, l := range ofModel {
			if err := a.servable(l); err != nil {
				first = cmp.Or(first, err)
				continue
			}
			out = append(out, l.api)
		}
		if len(out) == 0 {
			return nil, false, first
		}
		slices.SortFunc(out, func(x, y httpapi.Lane) int { return strings.Compare(x.Key, y.Key) })
		return out, false, nil
	}
	return nil, false, refusal.New(refusal.UnknownLane, model, "no lane or model of that name is placed on node %s", a.cfg.NodeName)
}

// Lanes implements httpapi.Catalog: every lane placed on the node.
func (a *Agent) Lanes() []httpapi.Lane {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]httpapi.Lane, 0, len(a.lanes))
	for _, l := range a.lanes {
		out = append(out, l.api)
	}
	return out
}

// servable says why a lane cannot take calls now, if it cannot. Callers hold mu.
func (a *Agent) servable(l *lane) error {
	switch l.state {
	case lanePaused:
		return refusal.New(refusal.NodePaused, l.key, "node %s is paused and has unloaded its lanes", a.cfg.NodeName)
	case laneRetiring:
		return refusal.New(refusal.LaneRetired, l.key, "the lane is being unloaded from node %s", a.cfg.NodeName)
	}
	if !l.loaded {
		msg := "the lane's worker is starting"
		if l.failure != nil {
			msg = "the lane failed to load: " + l.failure.Message
		}
		return refusal.New(refusal.EngineCrashed, l.key, "%s", msg)
	}
	return nil
}

// modelSpec is the supervisor's view of a placement whose artifact is in dir.
func modelSpec(key string, spec v1.LanePlacementSpec, id *v1.CertifiedIdentity, dir string) supervisor.ModelSpec {
	rungs := make([]int, len(spec.Rungs))
	for i, r := range spec.Rungs {
		rungs[i] = int(r)
	}
	return supervisor.ModelSpec{Lane: key, Identity: id.Name, Model: id.Spec.Model.Name, Dimensions: int(id.Spec.Model.EmbeddingDimensions),
		Layers: int(id.Spec.Model.Layers), Rungs: rungs, MaxResidentShapes: int(spec.MaxResidentShapes),
		AdmissionBound: time.Duration(spec.AdmissionBoundSeconds) * time.Second, ArtifactDir: dir}
}

// servingLane is serving's view of a placement.
func servingLane(key string, spec v1.LanePlacementSpec, id *v1.CertifiedIdentity) serving.Lane {
	ms := modelSpec(key, spec, id, "")
	queued := -1 // the placement's bound of 0: none may wait
	if spec.MaxQueuedRequests == nil {
		queued = 0 // a placement written before the bound: serving's default
	} else if *spec.MaxQueuedRequests > 0 {
		queued = int(*spec.MaxQueuedRequests)
	}
	return serving.Lane{Name: key, Task: string(spec.Task), Rungs: ms.Rungs, Ceiling: int(spec.Ceiling), Dimensions: ms.Dimensions,
		MaxInflight: int(spec.MaxConcurrentRequests), MaxQueued: queued}
}

// selfCheck admits the lane's smallest rung and runs one input through it, checking the
// answer's shape: a lane is Ready only once it has answered correctly.
func (a *Agent) selfCheck(ctx context.Context, l *lane) error {
	a.mu.Lock() // the reconciler may be updating the lane's spec meanwhile
	key, task := l.key, string(l.spec.Task)
	a.mu.Unlock()
	seq := []uint32{1, 2, 3}
	if task == string(v1.TaskRerank) {
		seq = []uint32{1, 2, tokenizer.Separator, 3}
	}
	// The admission may compile for minutes; it is waited for, not bounded by a request's
	// deadline. A refusal (shape_compiling) is retried after its delay.
	for {
		res, err := a.serve.Run(ctx, key, task, [][]uint32{seq}, time.Time{})
		if err == nil {
			if task == string(v1.TaskEmbed) && (len(res.Vectors) != 1 || len(res.Vectors[0]) != l.api.Dimensions) {
				return fmt.Errorf("the self-check answered %d vectors", len(res.Vectors))
			}
			if task == string(v1.TaskRerank) && len(res.Scores) != 1 {
				return fmt.Errorf("the self-check answered %d scores", len(res.Scores))
			}
			return nil
		}
		var r *refusal.Error
		if !errors.As(err, &r) || r.Code != refusal.ShapeCompiling {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-a.cfg.Clock.After(r.RetryAfter):
		}
	}
}

// verifyArtifact verifies the artifact of the placement's identity before anything loads, and
// returns its directory; a failure is typed, names its check, and a corrupt artifact has been
// quarantined.
func (a *Agent) verifyArtifact(spec v1.LanePlacementSpec, id *v1.CertifiedIdentity) (*artifact.Verified, error) {
	m := id.Spec.Model
	dir, err := artifact.Path(a.cfg.ArtifactRoot, m.Name, m.Revision, id.Spec.ConversionPolicy.Name)
	if err != nil {
		return nil, &artifact.MissingError{Message: err.Error()}
	}
	return a.verifier.Verify(dir, artifact.Want{Model: m.Name, Revision: m.Revision, CheckpointDigest: string(m.CheckpointDigest),
		ConversionPolicy: artifact.ConversionPolicy{Name: id.Spec.ConversionPolicy.Name, Digest: string(id.Spec.ConversionPolicy.Digest)},
		Backend:          string(a.cfg.Worker.Backend), Platform: artifact.Platform{ChipFamily: a.cfg.ChipFamily, MacOSBuild: string(a.cfg.Platform.MacOSBuild)},
		ConverterVersion: a.cfg.ConverterVersion, Rungs: rungs(spec.Rungs)})
}

// artifactReason is the condition reason for an artifact refusal.
func artifactReason(err error) string {
	var (
		ie *artifact.IntegrityError
		mi *artifact.MissingError
		mm *artifact.MismatchError
		cu *artifact.ComputeUnitMismatchError
		pe *artifact.PrecisionError
		pa *artifact.ParityError
	)
	switch {
	case errors.As(err, &ie):
		return "ArtifactQuarantined"
	case errors.As(err, &mi):
		return "ArtifactMissing"
	case errors.As(err, &mm):
		return "ArtifactMismatch"
	case errors.As(err, &cu):
		return "ComputeUnitMismatch"
	case errors.As(err, &pe):
		return "PrecisionUnsupported"
	case errors.As(err, &pa):
		return "ParityFailed"
	}
	return "ArtifactUnverified"
}
