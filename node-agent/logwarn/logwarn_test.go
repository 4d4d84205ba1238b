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

package logwarn

import (
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func TestAWarningIsLoggedAtTheZapWarnLevel(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	log := zapr.NewLogger(zap.New(core)).WithName("supervisor").WithValues("node", "mac-1")
	Warn(log, "direct-ANE prewarm admission refused by the worker; prewarm ends", "lane", "default/gte")
	entries := logs.All()
	if len(entries) != 1 || entries[0].Level != zapcore.WarnLevel {
		t.Fatalf("logged %+v, want one entry at warn level", entries)
	}
	fields := entries[0].ContextMap()
	if fields["lane"] != "default/gte" || fields["node"] != "mac-1" || entries[0].LoggerName != "supervisor" {
		t.Fatalf("entry %+v lost the logger's name or values", entries[0])
	}
}

func TestOtherSinksGetTheSeverityAsAValue(t *testing.T) {
	var got string
	log := funcr.New(func(prefix, args string) { got = args }, funcr.Options{})
	Warn(log, "careful", "lane", "a")
	if want := `"level"=0 "msg"="careful" "severity"="warning" "lane"="a"`; got != want {
		t.Fatalf("logged %s, want %s", got, want)
	}
}
