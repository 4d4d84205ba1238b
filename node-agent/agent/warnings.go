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
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// workerProgress are the prefixes of the lines a worker writes about its own progress: one per
// shape admission, compile-cache check and placement probe. Every other stderr line (the
// system framework's, the Go runtime's, an injected fault's, a device timeout's) is a warning:
// none is filtered, and each reaches the placement's status and a metric, not only the log.
var workerProgress = []string{"ane-direct shape admission:", "ane-direct compile cache check:", "ane-direct placement probe:"}

// Bounds on what the status keeps of a lane's warnings (the log has them all, whole).
const (
	recentWarnings     = 5
	warningStatusRunes = 500
)

// isWorkerWarning reports whether a worker's stderr line is a warning.
func isWorkerWarning(line string) bool {
	line = strings.TrimSpace(line)
	return line != "" && !slices.ContainsFunc(workerProgress, func(p string) bool { return strings.HasPrefix(line, p) })
}

// warningLog is one lane's worker warnings.
type warningLog struct {
	count  int64
	recent []string
	last   time.Time
}

// workerLine is the worker host's OnStderr: it counts and keeps a lane's warning lines.
func (a *Agent) workerLine(lane string, _ int64, line string) {
	if !isWorkerWarning(line) {
		return
	}
	a.workerWarnings.WithLabelValues(lane).Inc()
	if utf8.RuneCountInString(line) > warningStatusRunes {
		line = string([]rune(line)[:warningStatusRunes]) + " …"
	}
	a.warnMu.Lock()
	defer a.warnMu.Unlock()
	w := a.warnings[lane]
	if w == nil {
		w = &warningLog{}
		a.warnings[lane] = w
	}
	w.count++
	w.recent = append(w.recent, line)
	if len(w.recent) > recentWarnings {
		w.recent = w.recent[len(w.recent)-recentWarnings:]
	}
	w.last = a.cfg.Clock.Now()
}

// warningStatus is the lane's warnings as its placement reports them (nil: none).
func (a *Agent) warningStatus(lane string) *v1.WorkerWarnings {
	a.warnMu.Lock()
	defer a.warnMu.Unlock()
	w := a.warnings[lane]
	if w == nil {
		return nil
	}
	last := metav1.NewTime(w.last.Truncate(time.Second))
	return &v1.WorkerWarnings{Count: w.count, Recent: slices.Clone(w.recent), LastTime: &last}
}
