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

// Package cli holds the commands of `kubectl synapse`, the fleet's kubectl plugin: what
// `kubectl get` cannot show in one look (a lane's replicas and why it is not Ready, each Mac's
// budget and heartbeat, the compiles queued per Mac with their predicted finish, the chain of
// conditions and events behind a lane's state). It reads only what `kubectl get` may read
// (get and list of the fleet's kinds, node Leases and events) and writes nothing.
package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// Options are what the commands need from outside: where to write and the clock ages and
// ETAs are counted on.
type Options struct {
	Out   io.Writer
	Clock clock.PassiveClock
}

// session is one command's connection: the client and the namespace it reads.
type session struct {
	kube          client.Reader
	namespace     string
	allNamespaces bool
	out           io.Writer
	clock         clock.PassiveClock
}

// NewCommand builds `kubectl synapse` with its subcommands. The kubeconfig is found as
// kubectl finds it (--kubeconfig, KUBECONFIG, ~/.kube/config), with --context and --namespace.
func NewCommand(o Options) *cobra.Command {
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	overrides := &clientcmd.ConfigOverrides{}
	var allNamespaces bool
	root := &cobra.Command{
		Use:           "kubectl-synapse",
		Short:         "Lanes, Macs and compiles of a Synapse Fleet, and why a lane is in its state",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(o.Out)
	root.PersistentFlags().StringVar(&loading.ExplicitPath, "kubeconfig", "", "path to the kubeconfig file")
	root.PersistentFlags().StringVar(&overrides.CurrentContext, "context", "", "the kubeconfig context to use")
	root.PersistentFlags().StringVarP(&overrides.Context.Namespace, "namespace", "n", "", "the namespace of the lanes (default: the context's)")
	root.PersistentFlags().BoolVarP(&allNamespaces, "all-namespaces", "A", false, "lanes of every namespace")

	connect := func(ctx context.Context) (*session, error) {
		cfg := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, overrides)
		rest, err := cfg.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("reading the kubeconfig: %w", err)
		}
		ns, _, err := cfg.Namespace()
		if err != nil {
			return nil, fmt.Errorf("reading the namespace: %w", err)
		}
		scheme := runtime.NewScheme()
		if err := clientgoscheme.AddToScheme(scheme); err != nil {
			return nil, err
		}
		if err := v1.AddToScheme(scheme); err != nil {
			return nil, err
		}
		kube, err := client.New(rest, client.Options{Scheme: scheme})
		if err != nil {
			return nil, fmt.Errorf("connecting to the API server: %w", err)
		}
		return &session{kube: kube, namespace: ns, allNamespaces: allNamespaces, out: o.Out, clock: o.Clock}, nil
	}
	run := func(f func(context.Context, *session, []string) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			s, err := connect(cmd.Context())
			if err != nil {
				return err
			}
			return f(cmd.Context(), s, args)
		}
	}
	root.AddCommand(
		&cobra.Command{Use: "lanes", Short: "Lanes: replicas Ready, vector space, rollout, and why a lane is not Ready",
			Args: cobra.NoArgs, RunE: run(lanes)},
		&cobra.Command{Use: "macs", Short: "Macs: Ready, executables charged, lanes, last heartbeat, compile queue",
			Args: cobra.NoArgs, RunE: run(macs)},
		&cobra.Command{Use: "compiles", Short: "Compiles per Mac: running, queued, predicted drain, and each placement's layers and ETA",
			Args: cobra.NoArgs, RunE: run(compiles)},
		&cobra.Command{Use: "why LANE", Short: "The conditions, placements, Macs and events that explain a lane's state",
			Args: cobra.ExactArgs(1), RunE: run(why)},
	)
	return root
}
