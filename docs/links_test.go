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

package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	mdLink  = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	// code is a fenced block or an inline code span, whose text is not a link.
	code = regexp.MustCompile("(?s)```.*?```|`[^`\n]*`")
)

// anchor is the fragment GitHub gives a heading: lower case, punctuation but hyphens and
// spaces dropped, spaces made hyphens.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(string(data), -1) {
		out[anchor(m[1])] = true
	}
	return out
}

// TestEveryRelativeLinkResolves follows every relative link of the README and of the pages in
// docs/ to its file and, where it names one, its heading: moving a section must move its links.
func TestEveryRelativeLinkResolves(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append(pages, filepath.Join("..", "README.md"))
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(code.ReplaceAllString(string(data), ""), -1) {
			link := m[1]
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(link, "#")
			target := page
			if file != "" {
				target = filepath.Join(filepath.Dir(page), filepath.FromSlash(file))
			}
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, link)
				continue
			}
			if frag != "" && strings.HasSuffix(target, ".md") && !anchors(t, target)[frag] {
				t.Errorf("%s links to %s, whose heading is not there", page, link)
			}
		}
	}
}

// TestTheReadmeIsAFirstScreen keeps the README what a newcomer reads first: short, with the two
// commands every other document starts from.
func TestTheReadmeIsAFirstScreen(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	for _, cmd := range []string{"make dev", "make test"} {
		if !strings.Contains(readme, cmd) {
			t.Errorf("the README does not say %q", cmd)
		}
	}
	if n := strings.Count(readme, "\n"); n > 120 {
		t.Errorf("the README has %d lines; keep it under 120 and move detail into docs/", n)
	}
}
