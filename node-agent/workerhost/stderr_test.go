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

package workerhost

import (
	"io"
	"strings"
	"testing"
)

// A worker that writes a stderr line of any length is never left blocked on its pipe: the line
// is cut for the log, the rest of it read and dropped, and the lines after it still arrive.
func TestAStderrLineOfAnyLengthNeverStallsTheWorker(t *testing.T) {
	r, w := io.Pipe()
	written := make(chan error, 1)
	go func() {
		// An unbuffered pipe: each write returns only once the reader has taken it, so the
		// writer finishing proves every byte was read.
		_, err := io.WriteString(w, "first\n"+strings.Repeat("x", 4<<20)+"\nafter the long one\nno newline at the end")
		written <- err
		w.Close()
	}()
	var lines []string
	readLines(r, 1024, func(l string) { lines = append(lines, l) })
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	if len(lines) != 4 {
		t.Fatalf("%d lines, want 4: %q", len(lines), lines)
	}
	if lines[0] != "first" || lines[2] != "after the long one" || lines[3] != "no newline at the end" {
		t.Errorf("lines %q, %q, %q", lines[0], lines[2], lines[3])
	}
	want := strings.Repeat("x", 1024) + "... (" + "4193280" + " more bytes of this line dropped)"
	if lines[1] != want {
		t.Errorf("the long line is logged as %.40q... (%d bytes), want its first 1024 bytes and the count dropped", lines[1], len(lines[1]))
	}
}
