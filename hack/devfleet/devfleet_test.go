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
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	fleetv1alpha1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestDevFleetServesTheSamples runs what `make dev` runs, with a real control plane and
// controller process, and checks what its printed instructions promise: the kubeconfig works,
// kubectl lists the sample lanes with their columns, and Ctrl-C (cancelling) tears it down.
func TestDevFleetServesTheSamples(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Fatal("KUBEBUILDER_ASSETS is not set; run 'make test'")
	}
	dir := t.TempDir()
	controller := filepath.Join(dir, "synapse-controller")
	build := exec.Command("go", "build", "-o", controller, "github.com/ck-synapse/synapse-fleet")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the controller: %v\n%s", err, out)
	}

	opts := options{
		assets:      assets,
		controller:  controller,
		crds:        filepath.Join("..", "..", "config", "crd", "bases"),
		samples:     filepath.Join("..", "..", "config", "samples"),
		kubeconfig:  filepath.Join(dir, "dev.kubeconfig"),
		probeAddr:   freeAddr(t),
		metricsAddr: freeAddr(t),
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var checked bool
	var log bytes.Buffer
	err := run(ctx, opts, &log, func(out io.Writer, f fleet) {
		defer cancel() // the Ctrl-C
		printUsage(out, f)
		checked = true

		var lanes fleetv1alpha1.CatalogLaneList
		if err := f.client.List(ctx, &lanes); err != nil {
			t.Errorf("listing lanes: %v", err)
		}
		if len(lanes.Items) != 2 {
			t.Errorf("got %d lanes, want the 2 samples", len(lanes.Items))
		}

		out2, err := exec.Command(f.kubectl, "--kubeconfig", f.kubeconfig, "get", "cataloglanes").CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl get cataloglanes: %v\n%s", err, out2)
		}
		text := string(out2)
		for _, want := range []string{"MODEL", "TASK", "DEVICE", "DESIRED", "READY", "gte-search", "gte-modernbert-base", "qwen3-documents", "ane"} {
			if !strings.Contains(text, want) {
				t.Errorf("kubectl get cataloglanes does not show %q:\n%s", want, text)
			}
		}
	})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if !checked {
		t.Fatal("the fleet never became ready")
	}
	if !strings.Contains(log.String(), "get cataloglanes") {
		t.Errorf("the instructions do not say how to list lanes:\n%s", log.String())
	}
	if _, err := os.Stat(opts.kubeconfig); !os.IsNotExist(err) {
		t.Errorf("the kubeconfig of a stopped fleet is still there (err %v)", err)
	}
}
