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
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
)

// tokenFile writes an unsigned ServiceAccount JWT for sub.
func tokenFile(t *testing.T, sub string) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	now := time.Now()
	token := enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, sub, now.Unix(), now.Add(time.Hour).Unix()))) + ".sig"
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestTheAgentRefusesToRunAsAnotherNode(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:6443", BearerTokenFile: tokenFile(t, "system:serviceaccount:synapse-nodes:synapse-node-mac-b")}
	_, err := identityRenewer(cfg, "mac-a", logr.Discard())
	if err == nil || !strings.Contains(err.Error(), "not node mac-a's") {
		t.Fatalf("mac-a ran with mac-b's identity: %v", err)
	}
	r, err := identityRenewer(cfg, "mac-b", logr.Discard())
	if err != nil || r == nil || r.Path != cfg.BearerTokenFile {
		t.Fatalf("mac-b's own identity: renewer %v, %v", r, err)
	}
}

func TestCredentialsThatAreNoNodeIdentityAreNotRenewed(t *testing.T) {
	for name, cfg := range map[string]*rest.Config{
		"a client certificate": {Host: "https://127.0.0.1:6443"},
		"a user's token file":  {Host: "https://127.0.0.1:6443", BearerTokenFile: writeFile(t, "opaque-token")},
	} {
		r, err := identityRenewer(cfg, "mac-a", logr.Discard())
		if err != nil || r != nil {
			t.Errorf("%s: renewer %v, err %v; want none and no error", name, r, err)
		}
	}
}

func TestTheAgentFindsTheKubeconfigJoinWroteInItsStateDirectory(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	state := t.TempDir()
	if got := identityKubeconfig("", state); got != "" {
		t.Errorf("with no kubeconfig in the state directory: %q", got)
	}
	written := filepath.Join(state, "kubeconfig")
	if err := os.WriteFile(written, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := identityKubeconfig("", state); got != written {
		t.Errorf("got %q, want the state directory's %q", got, written)
	}
	if got := identityKubeconfig("/elsewhere", state); got != "/elsewhere" {
		t.Errorf("--kubeconfig was overridden: %q", got)
	}
}

func TestJoinWantsAnOutputDirectory(t *testing.T) {
	cmd := NewCommand()
	cmd.SetArgs([]string{"join", "mac-a"})
	cmd.SetOut(&strings.Builder{})
	cmd.SetErr(&strings.Builder{})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "--output") {
		t.Fatalf("join without --output: %v", err)
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
