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

package tokenizer

import (
	"slices"
	"testing"
)

func TestSimSplitsWordsAndPunctuationDeterministically(t *testing.T) {
	s := Sim{}
	got := s.ids("Hello, world!  hello")
	if len(got) != 5 {
		t.Fatalf("%v: want 5 tokens (hello , world ! hello)", got)
	}
	if got[0] != got[4] {
		t.Fatalf("case-folded equal words differ: %v", got)
	}
	if got[0] == got[2] || got[1] == got[3] {
		t.Fatalf("different tokens share an id: %v", got)
	}
	if !slices.Equal(got, s.ids("hello , WORLD !\thello")) {
		t.Fatal("equal text after case folding and spacing encodes differently")
	}
	if len(s.ids("   ")) != 0 {
		t.Fatal("blank text has tokens")
	}
}

func TestSimNeverProducesTheSeparator(t *testing.T) {
	s := Sim{Vocabulary: 2}
	for _, id := range s.ids("a b c d e f g h , . ; ü 日本") {
		if id == Separator || id >= 2 {
			t.Fatalf("id %d out of [1, 2)", id)
		}
	}
}
