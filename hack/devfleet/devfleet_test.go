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

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	fleetv1alpha1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/localfleet"
)

// TestDevFleetServesTheSamples runs what `make dev` runs, with a real control plane, controller
// and three simulated Macs, and checks what its printed instructions promise: the kubeconfig
// works, kubectl lists the lanes, placements and Macs, the sample lanes turn Ready on the two
// Macs whose macOS build the identities certify, the printed curl answers, and Ctrl-C
// (cancelling) tears it all down.
func TestDevFleetServesTheSamples(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set; run 'make test'")
	}
	dir := t.TempDir()
	if err := localfleet.Build(dir); err != nil {
		t.Fatal(err)
	}
	opts := options{
		assets:     assets,
		bin:        dir,
		config:     filepath.Join("..", "..", "config"),
		samples:    filepath.Join("..", "..", "config", "samples"),
		kubeconfig: filepath.Join(dir, "dev.kubeconfig"),
		firstPort:  0,
		simScale:   0.01,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var checked bool
	var log bytes.Buffer
	err := run(ctx, opts, &syncWriter{w: &log}, func(out io.Writer, f fleet) {
		defer cancel() // the Ctrl-C
		printUsage(out, f)
		checked = true

		g := gomega.NewWithT(t)
		g.Eventually(func(g gomega.Gomega) {
			var lanes fleetv1alpha1.CatalogLaneList
			g.Expect(f.Client.List(ctx, &lanes)).To(gomega.Succeed())
			g.Expect(lanes.Items).To(gomega.HaveLen(2))
			for _, l := range lanes.Items {
				g.Expect(l.Status.ReadyReplicas).To(gomega.Equal(l.Spec.Replicas), "lane %s", l.Name)
				g.Expect(l.Status.Nodes).NotTo(gomega.ContainElement("mac-c"))
			}
		}).WithTimeout(2 * time.Minute).WithPolling(200 * time.Millisecond).Should(gomega.Succeed())

		// Nothing runs as the administrator: each Mac as its own joined identity, the
		// controller as its ServiceAccount.
		for _, m := range f.macs {
			cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(f.PID(m.Name)), "cmdline"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(cmdline), "\x00--kubeconfig\x00"+f.MacKubeconfig(m.Name)+"\x00") {
				t.Errorf("%s does not run with its own kubeconfig %s: %q", m.Name, f.MacKubeconfig(m.Name), cmdline)
			}
			if who := whoami(t, f.MacKubeconfig(m.Name)); who != "system:serviceaccount:synapse-nodes:synapse-node-"+m.Name {
				t.Errorf("%s runs as %s", m.Name, who)
			}
		}
		if who := whoami(t, f.ControllerKubeconfig()); who != "system:serviceaccount:synapse-system:synapse-controller" {
			t.Errorf("the controller runs as %s", who)
		}

		out2, err := exec.Command(f.kubectl, "--kubeconfig", f.kubeconfig, "get", "cataloglanes,laneplacements,macnodes").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl get: %v\n%s", err, out2)
		}
		text := string(out2)
		for _, want := range []string{"gte-search", "qwen3-documents", "gte-search-mac-a", "gte-search-mac-b", "mac-c", "Ready"} {
			if !strings.Contains(text, want) {
				t.Errorf("kubectl get does not show %q:\n%s", want, text)
			}
		}

		resp, err := http.Post(f.URL("mac-a")+"/v1/embeddings", "application/json",
			strings.NewReader(`{"model": "default/gte-search", "input": ["hello world", "a second input"]}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Data []struct {
				Embedding []float32 `json:"embedding"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("the printed curl: %d, %v", resp.StatusCode, err)
		}
		if len(body.Data) != 2 || len(body.Data[0].Embedding) != 768 {
			t.Fatalf("the printed curl answered %d embeddings", len(body.Data))
		}
		// The dev fleet's Macs are simulated: their answers say so, never the Neural Engine.
		if d := resp.Header.Get("X-Synapse-Device"); d != "sim" {
			t.Fatalf("the printed curl's answer says device %q; a simulated Mac computed it", d)
		}
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if !checked {
		t.Fatal("the fleet never became ready")
	}
	if t.Failed() {
		t.Logf("the fleet's output:\n%s", log.String())
	}
	for _, want := range []string{"get cataloglanes,laneplacements,macnodes", "/v1/embeddings"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the instructions do not say %q:\n%s", want, log.String())
		}
	}
	if _, err := os.Stat(opts.kubeconfig); !os.IsNotExist(err) {
		t.Errorf("the kubeconfig of a stopped fleet is still there (err %v)", err)
	}
}

// whoami asks the API server who a kubeconfig authenticates as.
func whoami(t *testing.T, kubeconfig string) string {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	review, err := cs.AuthenticationV1().SelfSubjectReviews().Create(context.Background(), &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return review.Status.UserInfo.Username
}

// syncWriter lets the processes' output goroutines share one buffer.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
