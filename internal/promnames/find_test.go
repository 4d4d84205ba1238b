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

package promnames

import (
	"fmt"
	"strings"
	"testing"
)

// TestFindReadsEveryWayAMetricIsDefined reads testdata/good: a Vec with its labels, a
// histogram named from its namespace, subsystem and name, and a collector's Descs built by a
// helper whose calls give the name and the labels.
func TestFindReadsEveryWayAMetricIsDefined(t *testing.T) {
	ms, err := Find(".", "./testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range ms {
		got = append(got, fmt.Sprintf("%s %s %v", m.Name, m.Type, m.Labels))
	}
	want := []string{
		"sample_calls_total counter [lane code]",
		"sample_queue_wait_seconds histogram []",
		"sample_resident_shapes untyped [lane]",
		"sample_used untyped []",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, m := range ms {
		if m.Type == Histogram && len(m.Series()["sample_queue_wait_seconds_bucket"]) != 1 {
			t.Errorf("a histogram's series: %v", m.Series())
		}
	}
}

// TestFindRefusesANameItCannotRead: a metric named at run time is an error, not a metric the
// checks quietly never see.
func TestFindRefusesANameItCannotRead(t *testing.T) {
	_, err := Find(".", "./testdata/unreadable")
	if err == nil || !strings.Contains(err.Error(), "Name is not a constant") {
		t.Fatalf("got %v, want an error naming the unreadable name", err)
	}
}
