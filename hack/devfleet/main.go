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
// hack/envtest.sh builds), the CRDs, the controller, three simulated Macs and the samples,
// running until Ctrl-C.
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
	flag.StringVar(&opts.bin, "bin", "bin", "directory holding synapse-controller, synapse-agent and synapse-ane-worker (make build)")
	flag.StringVar(&opts.config, "config", "config", "the project's config/ directory: the CRDs, RBAC and node-restriction policies installed from it")
	flag.StringVar(&opts.samples, "samples", "config/samples", "directory of sample manifests to apply")
	// Not "kubeconfig": controller-runtime registers that flag for the config it loads.
	flag.StringVar(&opts.kubeconfig, "write-kubeconfig", "bin/dev.kubeconfig", "where to write the kubeconfig of the local control plane")
	flag.IntVar(&opts.firstPort, "first-port", 18091, "the simulated Macs' HTTP ports are this one and the next two")
	flag.Float64Var(&opts.simScale, "sim-scale", 0.05, "multiplies the simulated compile and load times (1: a real Mac's)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts, os.Stdout, printUsage); err != nil {
		fmt.Fprintln(os.Stderr, "devfleet:", err)
		os.Exit(1)
	}
}
