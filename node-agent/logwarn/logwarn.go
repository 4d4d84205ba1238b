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

// Package logwarn logs warnings at the warning level of the logger's sink, where it has one.
// logr itself has only info and error: controller-runtime's zap sink keeps the underlying
// zap logger, whose Warn level operators filter and alert on; other sinks get an info line
// marked with severity=warning.
package logwarn

import (
	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
)

// Func returns a function that logs a warning through log.
func Func(log logr.Logger) func(msg string, keysAndValues ...any) {
	return func(msg string, keysAndValues ...any) { Warn(log, msg, keysAndValues...) }
}

// Warn logs msg with keysAndValues at the warning level.
func Warn(log logr.Logger, msg string, keysAndValues ...any) {
	if u, ok := log.GetSink().(zapr.Underlier); ok {
		u.GetUnderlying().Sugar().Warnw(msg, keysAndValues...)
		return
	}
	log.Info(msg, append([]any{"severity", "warning"}, keysAndValues...)...)
}
