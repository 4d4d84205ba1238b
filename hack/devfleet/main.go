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

// Command devfleet is `make dev`: a local control plane (the kube-apiserver and etcd that
// hack/envtest.sh builds), the CRDs, the controller and the samples, running until Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	var opts options
	flag.StringVar(&opts.assets, "assets", os.Getenv("KUBEBUILDER_ASSETS"), "directory holding kube-apiserver, etcd and kubectl")
	flag.StringVar(&opts.controller, "controller", "bin/synapse-controller", "the synapse-controller binary")
	flag.StringVar(&opts.crds, "crds", "config/crd/bases", "directory of CRD manifests")
	flag.StringVar(&opts.samples, "samples", "config/samples", "directory of sample manifests to apply")
	// Not "kubeconfig": controller-runtime registers that flag for the config it loads.
	flag.StringVar(&opts.kubeconfig, "write-kubeconfig", "bin/dev.kubeconfig", "where to write the kubeconfig of the local control plane")
	flag.StringVar(&opts.probeAddr, "controller-probe-address", "127.0.0.1:18081", "the controller's /healthz and /readyz address")
	flag.StringVar(&opts.metricsAddr, "controller-metrics-address", "127.0.0.1:18080", "the controller's metrics address")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, os.Stdout, printUsage); err != nil {
		fmt.Fprintln(os.Stderr, "devfleet:", err)
		os.Exit(1)
	}
}
