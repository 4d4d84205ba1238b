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

package ane

import (
	"errors"
	"fmt"
	"time"
)

// ErrTimeout: a call did not return within its bound. Its outcome is unknown: the caller treats
// the worker as faulted (the supervisor's confirmed-exit recovery).
var ErrTimeout = errors.New("the Neural Engine call did not return in time; its outcome is unknown")

// CallError is a call the framework refused, with the NSError it gave. The compiler's
// reason is rarely in the description (jafreck/ironmill docs/design/ane/ane-constraints.md:
// "The ANE compiler (_ANECCompile) rejects programs without providing a reason code"), so the
// whole NSError is kept: domain, code, userInfo and the underlying error, and the system log
// holds the rest (LogCommand).
type CallError struct {
	// Call names the step: descriptor, model, compile, load, evaluate, unload.
	Call   string
	Domain string
	Code   int
	Detail string
	// UserInfo is the NSError's userInfo as property-list values (anything else as its
	// description).
	UserInfo map[string]any
	// Underlying is the NSError's underlying error (NSUnderlyingErrorKey), when it has one.
	Underlying *CallError
	// ResourcesExhausted: the device could not hold the program (the load failed for
	// resources; the supervisor evicts and retries once).
	ResourcesExhausted bool
}

func (e *CallError) Error() string {
	msg := fmt.Sprintf("Neural Engine %s failed", e.Call)
	if e.Call == "" {
		msg = "caused by"
	}
	if e.Domain != "" {
		msg += fmt.Sprintf(" (%s %d)", e.Domain, e.Code)
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Underlying != nil {
		msg += "; " + e.Underlying.Error()
	}
	return msg
}

// loadResourceCodes are the load failures reported when the device's program memory is full.
var loadResourceCodes = map[int]bool{0x20004: true}

// LogProcesses are the processes that compile and load for the framework: aned and
// ANECompilerService (tinygrad/tinygrad extra/accel/ane/README.old: "2 helper processes:
// /usr/libexec/aned ANECompilerService").
var LogProcesses = []string{"aned", "ANECompilerService"}

// LogCommand is the command a Mac owner runs to read what those processes logged from a
// minute before since, the reasons an NSError leaves out.
func LogCommand(since time.Time) string {
	pred := ""
	for i, p := range LogProcesses {
		if i > 0 {
			pred += " OR "
		}
		pred += fmt.Sprintf("process == %q", p)
	}
	return fmt.Sprintf("log show --info --debug --start '%s' --predicate '%s'", since.Add(-time.Minute).Format("2006-01-02 15:04:05"), pred)
}
