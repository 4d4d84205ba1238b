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
	"fmt"
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

// route decides, before anything runs, which of the candidate lanes a call runs on, and why.
// byName: the model named a lane. A call is never split across lanes, and nothing that fails
// later moves it.
func route(model, task string, cands []Lane, byName bool, sequences [][]uint32) (Lane, string, error) {
	if byName {
		return cands[0], ReasonLaneNamed + bucketPolicy, nil
	}
	cands = slices.DeleteFunc(slices.Clone(cands), func(l Lane) bool { return l.Task != task })
	if len(cands) == 0 {
		return Lane{}, "", refusal.New(refusal.InvalidRequest, model, "no lane of model %s on this node serves %s", model, task)
	}
	longest := 0
	for _, s := range sequences {
		longest = max(longest, len(s))
	}
	type fit struct {
		lane     Lane
		bucket   int
		resident bool
	}
	var fits []fit
	for _, l := range cands {
		if longest > l.Ceiling {
			continue
		}
		i := slices.IndexFunc(l.Rungs, func(r int) bool { return r >= longest })
		if i < 0 {
			continue
		}
		f := fit{lane: l, bucket: l.Rungs[i]}
		if l.Resident != nil {
			f.resident = slices.Contains(l.Resident(), f.bucket)
		}
		fits = append(fits, f)
	}
	switch {
	case len(fits) == 0:
		limits := make([]string, len(cands))
		for i, l := range cands {
			limits[i] = fmt.Sprintf("%s/%s takes %d", l.Namespace, l.Name, l.Ceiling)
		}
		return Lane{}, "", refusal.New(refusal.UnsupportedShape, model, "the longest input has %d tokens, more than any lane of model %s takes (%s); it is not truncated",
			longest, model, strings.Join(limits, ", "))
	case len(fits) == 1 && len(cands) == 1:
		return fits[0].lane, ReasonOnlyLane + bucketPolicy, nil
	case len(fits) == 1:
		return fits[0].lane, ReasonOnlyFittingLane + bucketPolicy, nil
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
		return best.lane, ReasonResidentBucket + bucketPolicy, nil
	}
	return best.lane, ReasonSmallestBucket + bucketPolicy, nil
}
