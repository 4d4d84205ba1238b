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
)

// ErrTimeout: a call did not return within its bound. Its outcome is unknown: the caller treats
// the worker as faulted (the supervisor's confirmed-exit recovery).
var ErrTimeout = errors.New("the Neural Engine call did not return in time; its outcome is unknown")

// CallError is a call the framework refused, with the NSError it gave.
type CallError struct {
	// Call names the step: descriptor, model, compile, load, evaluate, unload.
	Call   string
	Domain string
	Code   int
	Detail string
	// ResourcesExhausted: the device could not hold the program (the load failed for
	// resources; the supervisor evicts and retries once).
	ResourcesExhausted bool
}

func (e *CallError) Error() string {
	msg := fmt.Sprintf("Neural Engine %s failed", e.Call)
	if e.Domain != "" {
		msg += fmt.Sprintf(" (%s %d)", e.Domain, e.Code)
	}
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	return msg
}

// loadResourceCodes are the load failures reported when the device's program memory is full.
var loadResourceCodes = map[int]bool{0x20004: true}
