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

package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
)

// The reasons a call runs on the lane it runs on. Within the lane each input runs on the
// smallest bucket that holds it; the reason in an answer is "<lane reason>/smallest_fitting_bucket".
const (
	// ReasonLaneNamed: the request's model names the lane.
	ReasonLaneNamed = "model_names_lane"
	// ReasonOnlyLane: the model is served by one lane on this node.
	ReasonOnlyLane = "only_lane_of_model"
	// ReasonOnlyFittingLane: of the model's lanes, one takes the longest input.
	ReasonOnlyFittingLane = "only_lane_that_fits"
	// ReasonResidentBucket: of the lanes with the smallest bucket for the longest input, this
	// one holds that bucket resident.
	ReasonResidentBucket = "fitting_bucket_resident"
	// ReasonSmallestBucket: this lane has the smallest bucket for the longest input.
	ReasonSmallestBucket = "smallest_fitting_bucket"
)

const bucketPolicy = "/smallest_fitting_bucket"

// candidate is a lane with the call's token sequences as that lane's own tokenizer encodes
// them: lanes of one model may tokenize differently, so each is judged on its own tokens.
type candidate struct {
	lane      Lane
	sequences [][]uint32
	// tooLong, if set, is the input this lane's ceiling rules out.
	tooLong *tooLong
}

// plan decides, before anything runs, which of the lanes a call runs on, with which tokens, and
// why. byName: the model named a lane. Otherwise the lanes of the model that serve the task must
// share one vector space (vectors of different spaces must never be compared, so a caller who
// asked for the model cannot be answered from either without saying which): else the call is
// refused as ambiguous, naming the lanes. Each lane tokenizes the input with its own tokenizer;
// a text one of them cannot encode refuses the call rather than steer it to another lane.
func plan(model, task string, lanes []Lane, byName bool, tokenize func(Lane) ([][]uint32, error)) (candidate, string, error) {
	if !byName {
		lanes = slices.DeleteFunc(slices.Clone(lanes), func(l Lane) bool { return l.Task != task })
		if len(lanes) == 0 {
			return candidate{}, "", refusal.New(refusal.InvalidRequest, model, "no lane of model %s on this node serves %s", model, task)
		}
		if spaces := vectorSpaces(lanes); len(spaces) > 1 {
			return candidate{}, "", &apiError{status: http.StatusBadRequest, code: CodeAmbiguousModel, param: "model", message: fmt.Sprintf(
				"model %s is served here in %d vector spaces (%s), whose vectors must never be compared: name the lane as <namespace>/<lane>",
				model, len(spaces), strings.Join(spaces, "; "))}
		}
	}
	cands := make([]candidate, len(lanes))
	for i, l := range lanes {
		seqs, err := tokenize(l)
		var tl *tooLong
		if errors.As(err, &tl) {
			cands[i] = candidate{lane: l, tooLong: tl}
			continue
		}
		if err != nil {
			return candidate{}, "", err
		}
		cands[i] = candidate{lane: l, sequences: seqs}
	}
	return route(model, task, cands, byName)
}

// CodeAmbiguousModel refuses a call naming a model served in several vector spaces.
const CodeAmbiguousModel = "ambiguous_model"

// vectorSpaces lists the lanes by vector space: "space: ns/lane, ns/lane".
func vectorSpaces(lanes []Lane) []string {
	by := map[string][]string{}
	for _, l := range lanes {
		by[l.VectorSpace] = append(by[l.VectorSpace], l.Namespace+"/"+l.Name)
	}
	out := make([]string, 0, len(by))
	for space, names := range by {
		slices.Sort(names)
		out = append(out, fmt.Sprintf("%q: %s", space, strings.Join(names, ", ")))
	}
	slices.Sort(out)
	return out
}

// route picks, among candidates of one task and vector space, the lane the call runs on. A call
// is never split across lanes, and nothing that fails later moves it.
func route(model, task string, cands []candidate, byName bool) (candidate, string, error) {
	if byName {
		if cands[0].tooLong != nil {
			return candidate{}, "", cands[0].tooLong.refusal()
		}
		return cands[0], ReasonLaneNamed + bucketPolicy, nil
	}
	type fit struct {
		candidate
		bucket   int
		resident bool
	}
	var fits []fit
	var limits []string
	for _, c := range cands {
		l, longest := c.lane, 0
		if c.tooLong != nil {
			limits = append(limits, fmt.Sprintf("%s/%s takes %d and by its tokenizer %s has more", l.Namespace, l.Name, l.Ceiling, c.tooLong.what))
			continue
		}
		for _, s := range c.sequences {
			longest = max(longest, len(s))
		}
		limits = append(limits, fmt.Sprintf("%s/%s takes %d and its tokenizer gives %d", l.Namespace, l.Name, l.Ceiling, longest))
		if longest > l.Ceiling {
			continue
		}
		i := slices.IndexFunc(l.Rungs, func(r int) bool { return r >= longest })
		if i < 0 {
			continue
		}
		f := fit{candidate: c, bucket: l.Rungs[i]}
		if l.Resident != nil {
			f.resident = slices.Contains(l.Resident(), f.bucket)
		}
		fits = append(fits, f)
	}
	switch {
	case len(fits) == 0:
		return candidate{}, "", refusal.New(refusal.UnsupportedShape, model, "the longest input has more tokens than any lane of model %s takes (%s); it is not truncated",
			model, strings.Join(limits, ", "))
	case len(fits) == 1 && len(cands) == 1:
		return fits[0].candidate, ReasonOnlyLane + bucketPolicy, nil
	case len(fits) == 1:
		return fits[0].candidate, ReasonOnlyFittingLane + bucketPolicy, nil
	}
	slices.SortFunc(fits, func(a, b fit) int {
		if a.bucket != b.bucket {
			return a.bucket - b.bucket
		}
		if a.resident != b.resident {
			if a.resident {
				return -1
			}
			return 1
		}
		return strings.Compare(a.lane.Namespace+"/"+a.lane.Name, b.lane.Namespace+"/"+b.lane.Name)
	})
	best := fits[0]
	if best.resident && fits[1].bucket == best.bucket && !fits[1].resident {
		return best.candidate, ReasonResidentBucket + bucketPolicy, nil
	}
	return best.candidate, ReasonSmallestBucket + bucketPolicy, nil
}
