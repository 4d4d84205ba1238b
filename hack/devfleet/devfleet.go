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
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/ck-synapse/synapse-fleet/internal/localfleet"
)

type options struct {
	assets, bin, config, samples, kubeconfig string
	firstPort                                int
	simScale                                 float64
}

// fleet is what run leaves running until its context ends.
type fleet struct {
	*localfleet.Fleet
	kubeconfig string
	kubectl    string
	macs       []localfleet.Mac
}

// macs are the simulated Macs: two on the samples' macOS build and one on another, so that
// identity matching is visible (no lane is placed on mac-c). A first port of 0 takes free ones.
func macs(firstPort int) []localfleet.Mac {
	ms := []localfleet.Mac{{Name: "mac-a", MacOSBuild: "25B78"}, {Name: "mac-b", MacOSBuild: "25B78"}, {Name: "mac-c", MacOSBuild: "25C56"}}
	if firstPort > 0 {
		for i := range ms {
			ms[i].Port = firstPort + i
		}
	}
	return ms
}

// run starts the fleet, calls ready once everything is up, and tears it all down when ctx ends.
func run(ctx context.Context, opts options, out io.Writer, ready func(io.Writer, fleet)) (err error) {
	if opts.assets == "" {
		return errors.New("no control-plane binaries: pass --assets or set KUBEBUILDER_ASSETS (make dev does)")
	}
	dir, err := os.MkdirTemp("", "synapse-dev-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ms := macs(opts.firstPort)
	f, err := localfleet.Start(ctx, localfleet.Options{Assets: opts.assets, Config: opts.config, Bin: opts.bin, Dir: dir, Macs: ms,
		SimScale: opts.simScale, Out: out, AnonymousAPI: true, PlainHTTP: true})
	if err != nil {
		return err
	}
	defer func() {
		fmt.Fprintln(out, "stopping the Macs, the controller and the control plane ...")
		err = errors.Join(err, f.Stop())
	}()

	if err := os.MkdirAll(filepath.Dir(opts.kubeconfig), 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(f.Kubeconfig)
	if err != nil {
		return err
	}
	if err := os.WriteFile(opts.kubeconfig, data, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	defer os.Remove(opts.kubeconfig)

	if err := f.ApplySamples(ctx, opts.samples); err != nil {
		return fmt.Errorf("applying the samples: %w", err)
	}
	ready(out, fleet{Fleet: f, kubeconfig: opts.kubeconfig, kubectl: filepath.Join(opts.assets, "kubectl"), macs: ms})
	<-ctx.Done()
	return nil
}

func printUsage(out io.Writer, f fleet) {
	k := fmt.Sprintf("%s --kubeconfig %s", f.kubectl, f.kubeconfig)
	fmt.Fprintf(out, `
Synapse Fleet is running locally: etcd, kube-apiserver, the CRDs, synapse-controller, three
simulated Macs (synapse-agent with sim workers) and the samples of config/samples. mac-a and
mac-b run macOS 25B78, which the sample identities certify; mac-c runs 25C56, so no lane is
placed on it.

  export KUBECONFIG=%s
  %s get cataloglanes,laneplacements,macnodes
  %s get laneplacements -o wide -w       # watch the lanes compile and turn Ready
  %s describe cataloglane gte-search

Embeddings (OpenAI-compatible) and rerank, on mac-a:

  curl -s %s/v1/embeddings -H 'Content-Type: application/json' \
    -d '{"model": "default/gte-search", "input": ["hello world", "a second input"]}'
  curl -s %s/v1/rerank -H 'Content-Type: application/json' \
    -d '{"model": "gte-search", "query": "neural engine", "documents": ["apple silicon", "the weather"]}'

(gte-search embeds; the sample lanes have no reranker, so that second call answers 400
invalid_request: apply a lane with task: rerank to try it.)

These Macs let every caller in (--auth=none) over plain HTTP (--tls=none), for this development
fleet only. A Mac of a real fleet serves HTTPS with a certificate from the fleet's signer,
answers 401 without a bearer token of audience fleet.synapse.dev that the API server accepts,
and 403 unless RBAC lets its subject create cataloglanes/embeddings (or rerank) of the lane:
see docs/calling-a-lane.md.

Press Ctrl-C to stop everything; the control plane's data is removed.
`, f.kubeconfig, k, k, k, f.URL(f.macs[0].Name), f.URL(f.macs[0].Name))
}
