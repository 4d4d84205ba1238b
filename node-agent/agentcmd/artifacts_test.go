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

package agentcmd

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/ck-synapse/synapse-fleet/internal/tinymodel"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/convert"
)

func runCmd(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestArtifactsBuildVerifyAndList(t *testing.T) {
	t.Setenv(artifact.RepoEnv, "")
	root := t.TempDir()
	dir := filepath.Join(root, "gte")
	d := "sha256:" + strings.Repeat("ab", 32)
	common := []string{"--model", "gte", "--revision", "r1", "--checkpoint-digest", d, "--conversion-policy", "ane-fp16-v1",
		"--conversion-policy-digest", d, "--chip-family", "M4", "--macos-build", "25B78"}
	if out, err := runCmd(t, append([]string{"artifacts", "build", dir, "--rungs", "128,256", "--layers", "2", "--dimensions", "8"}, common...)...); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	out, err := runCmd(t, append([]string{"artifacts", "verify", dir, "--backend", "sim", "--rungs", "256"}, common...)...)
	if err != nil || !strings.Contains(out, "every file hashed") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	out, err = runCmd(t, append([]string{"artifacts", "verify", dir, "--backend", "sim"}, common...)...)
	if err != nil || !strings.Contains(out, "stamp") {
		t.Fatalf("a second verify: %v\n%s", err, out)
	}
	// Asked for a rung it lacks: refused by name, never another rung.
	_, err = runCmd(t, append([]string{"artifacts", "verify", dir, "--backend", "sim", "--rungs", "512"}, common...)...)
	if err == nil || !strings.Contains(err.Error(), "ArtifactMissingError") || !strings.Contains(err.Error(), "rung 512") {
		t.Fatalf("a missing rung: %v", err)
	}
	// For the ane backend it is the wrong artifact.
	_, err = runCmd(t, append([]string{"artifacts", "verify", dir, "--backend", "ane"}, common...)...)
	if err == nil || !strings.Contains(err.Error(), "ArtifactMismatchError") {
		t.Fatalf("another backend: %v", err)
	}
	// Pack it by hand and import it into another root: registered under model/revision/policy.
	other := t.TempDir()
	archive := filepath.Join(t.TempDir(), "gte.tar.gz")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := artifact.Pack(dir, f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	machine := []string{"--root", other, "--backend", "sim", "--chip-family", "M4", "--macos-build", "25B78"}
	out, err = runCmd(t, append([]string{"artifacts", "import", archive}, machine...)...)
	if err != nil || !strings.Contains(out, "registered and published") || !strings.Contains(out, "not probed: this machine's workers run the \"sim\" backend") {
		t.Fatalf("import: %v\n%s", err, out)
	}
	if out, err := runCmd(t, append([]string{"artifacts", "prune"}, machine...)...); err != nil || out != "" {
		t.Fatalf("prune with nothing to prune: %v\n%s", err, out)
	}
	if _, err := runCmd(t, append([]string{"artifacts", "fetch", "--model", "gte", "--revision", "r1", "--conversion-policy", "ane-fp16-v1"}, machine...)...); err == nil ||
		!strings.Contains(err.Error(), "no artifact repository") {
		t.Fatalf("fetch without a repository: %v", err)
	}
	out, err = runCmd(t, "artifacts", "list", root)
	if err != nil || !strings.Contains(out, "gte") || !strings.Contains(out, "published") || !strings.Contains(out, "128 256") {
		t.Fatalf("list: %v\n%s", err, out)
	}
}

func TestTheANEBackendIsNeverReplacedByTheStandIn(t *testing.T) {
	if runtime.GOOS == "darwin" && runtime.GOARCH == "arm64" {
		t.Skip("on Apple silicon the ane backend reads the machine; this checks other systems")
	}
	_, err := platformOf(options{backend: "ane"})
	if err == nil || !strings.Contains(err.Error(), "requires macOS on Apple silicon") || !strings.Contains(err.Error(), "--backend sim") {
		t.Fatalf("the ane backend on %s/%s: %v", runtime.GOOS, runtime.GOARCH, err)
	}
	if _, err := platformOf(options{backend: "sim"}); err == nil || !strings.Contains(err.Error(), "--macos-build") {
		t.Fatalf("sim without the build it reports: %v", err)
	}
	if _, err := platformOf(options{backend: "auto"}); err == nil {
		t.Fatal("an unknown backend was accepted")
	}
}

func TestArtifactsConvertACheckpointThatThenVerifiesForTheANE(t *testing.T) {
	ck := filepath.Join(t.TempDir(), "checkpoint")
	if err := tinymodel.Write(ck, tinymodel.ModernBERT(), 1, 1, tinymodel.Tokenizer); err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	out, err := runCmd(t, "artifacts", "convert", ck, "--root", root, "--model", "tiny", "--revision", "r1", "--rungs", "64,128",
		"--chip-family", "M4", "--macos-build", "25B78")
	if err != nil {
		t.Fatalf("convert: %v\n%s", err, out)
	}
	digests := regexp.MustCompile(`checkpoint (sha256:[0-9a-f]{64}), policy (sha256:[0-9a-f]{64})`).FindStringSubmatch(out)
	if digests == nil || !strings.Contains(out, "parity passed") {
		t.Fatalf("convert said %q", out)
	}
	dir := filepath.Join(root, "tiny", "r1", convert.DefaultPolicy.Name)
	out, err = runCmd(t, "artifacts", "verify", dir, "--backend", "ane", "--model", "tiny", "--revision", "r1", "--checkpoint-digest", digests[1],
		"--conversion-policy", convert.DefaultPolicy.Name, "--conversion-policy-digest", digests[2], "--converter-version", convert.ConverterVersion,
		"--chip-family", "M4", "--macos-build", "25B78", "--rungs", "128")
	if err != nil || !strings.Contains(out, "verified") {
		t.Fatalf("verify: %v\n%s", err, out)
	}
	// Converting again over a published artifact is refused, not overwritten.
	if _, err := runCmd(t, "artifacts", "convert", ck, "--root", root, "--model", "tiny", "--revision", "r1", "--rungs", "64",
		"--chip-family", "M4", "--macos-build", "25B78"); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Fatalf("a second conversion: %v", err)
	}
	if _, err := runCmd(t, "artifacts", "convert", ck, "--root", root, "--model", "tiny", "--revision", "r2", "--rungs", "100",
		"--chip-family", "M4", "--macos-build", "25B78"); err == nil || !strings.Contains(err.Error(), "multiple of 64") {
		t.Fatalf("a rung the device cannot take: %v", err)
	}
}

// The launchd plist a Mac owner installs passes only flags the agent has, and no TMPDIR.
func TestTheLaunchdPlistPassesOnlyFlagsTheAgentHas(t *testing.T) {
	data, err := os.ReadFile("../../config/agent/macos/dev.synapse-fleet.agent.plist")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), "<key>EnvironmentVariables</key>") {
		t.Fatal("the plist sets environment variables; the compiler needs the normal TMPDIR")
	}
	flags := regexp.MustCompile(`<string>--([a-z-]+)=`).FindAllStringSubmatch(string(data), -1)
	if len(flags) < 5 {
		t.Fatalf("found %d flags in the plist", len(flags))
	}
	cmd := NewCommand()
	for _, f := range flags {
		if cmd.Flags().Lookup(f[1]) == nil {
			t.Errorf("the plist passes --%s, which synapse-agent does not have", f[1])
		}
	}
}
