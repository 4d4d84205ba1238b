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
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
)

// newJoinCommand is `synapse-agent join NODE`: an administrator gives a Mac its identity.
func newJoinCommand() *cobra.Command {
	var (
		kubeconfig, server, caFile, out string
		lifetime                        time.Duration
	)
	cmd := &cobra.Command{
		Use:   "join NODE",
		Short: "Give a Mac its own identity: a ServiceAccount, its token and its kubeconfig (run by an administrator)",
		Long: `join creates the Mac's ServiceAccount synapse-node-NODE in namespace synapse-nodes, with the
Role that lets it renew its own token, requests a token (24h by default; the agent renews it
before it expires) and writes the Mac's kubeconfig and token into --output. Copy both into the
Mac's state directory (the agent's --state-dir), where the agent finds them.

What the Mac may do is its own MacNode's status, its placements' status, its Lease and its own
token, nothing else (the chart's node-restriction policies). Joining a Mac again issues a fresh
token. To revoke a Mac, delete its ServiceAccount:

  kubectl -n synapse-nodes delete serviceaccount synapse-node-NODE`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return errors.New("--output is required: the directory to write the Mac's kubeconfig and token into")
			}
			cfg, err := adminConfig(kubeconfig)
			if err != nil {
				return err
			}
			opts := nodeidentity.JoinOptions{Node: args[0], Server: cfg.Host, CAData: cfg.CAData, Lifetime: lifetime, Dir: out}
			if cfg.CAData == nil && cfg.CAFile != "" {
				if opts.CAData, err = os.ReadFile(cfg.CAFile); err != nil {
					return fmt.Errorf("the API server's CA: %w", err)
				}
			}
			if server != "" {
				opts.Server = server
			}
			if caFile != "" {
				if opts.CAData, err = os.ReadFile(caFile); err != nil {
					return fmt.Errorf("--certificate-authority: %w", err)
				}
			}
			kube, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			joined, err := nodeidentity.Join(cmd.Context(), kube, opts)
			if err != nil {
				return err
			}
			verb := "joined"
			if !joined.CreatedIdentity {
				verb = "joined again (a fresh token for the existing identity)"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s as ServiceAccount %s/%s; its token expires at %s and the agent renews it.\n"+
				"Copy %s and %s into the Mac's state directory.\n",
				args[0], verb, nodeidentity.Namespace, joined.ServiceAccount, joined.Expiry.UTC().Format(time.RFC3339), joined.Kubeconfig, joined.TokenFile)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&kubeconfig, "kubeconfig", "", "an administrator's kubeconfig (default: $KUBECONFIG or ~/.kube/config)")
	f.StringVar(&server, "server", "", "the API server's URL as the Mac reaches it (default: the administrator's)")
	f.StringVar(&caFile, "certificate-authority", "", "the CA bundle that verifies the API server (default: the administrator's)")
	f.StringVar(&out, "output", "", "the directory to write the Mac's kubeconfig and token into (required)")
	f.DurationVar(&lifetime, "token-lifetime", nodeidentity.DefaultLifetime, "how long each token lives (10m to 48h); the agent renews it at 80%")
	return cmd
}

// adminConfig loads an administrator's kubeconfig: the path, or the usual loading rules.
func adminConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = path
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
}

// identityKubeconfig is the kubeconfig the agent runs with: --kubeconfig or $KUBECONFIG when
// given, else the one `join` wrote into the state directory.
func identityKubeconfig(flagValue, stateDir string) string {
	if flagValue != "" || os.Getenv("KUBECONFIG") != "" {
		return flagValue
	}
	if p := filepath.Join(stateDir, nodeidentity.KubeconfigFile); fileExists(p) {
		return p
	}
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// identityRenewer checks that the agent's credentials are the node identity of node and returns
// the Renewer that keeps its token fresh. Credentials that are no ServiceAccount token (an
// administrator's, in a test cluster) are allowed with a warning and are not renewed.
func identityRenewer(cfg *rest.Config, node string, log logr.Logger) (*nodeidentity.Renewer, error) {
	if cfg.BearerTokenFile == "" {
		log.Info("the agent's credentials are not a node identity's token file; run it with the kubeconfig `synapse-agent join` writes, " +
			"so that node restriction applies to it")
		return nil, nil
	}
	r := &nodeidentity.Renewer{Clock: clock.RealClock{}, Path: cfg.BearerTokenFile, Log: log.WithName("identity")}
	_, claims, err := r.Current()
	if errors.Is(err, nodeidentity.ErrNotServiceAccountToken) {
		log.Info("the agent's token is not a ServiceAccount token; it is not renewed", "tokenFile", cfg.BearerTokenFile)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if claims.Node() != node {
		return nil, fmt.Errorf("the kubeconfig's identity is ServiceAccount %s/%s, not node %s's (%s/%s): join this Mac as %s",
			claims.Namespace, claims.ServiceAccount, node, nodeidentity.Namespace, nodeidentity.ServiceAccountName(node), node)
	}
	r.Tokens = nodeidentity.TokensFor(cfg)
	return r, nil
}

// runRenewer runs r (if any) until ctx ends.
func runRenewer(ctx context.Context, r *nodeidentity.Renewer) <-chan error {
	done := make(chan error, 1)
	if r == nil {
		close(done)
		return done
	}
	go func() { done <- r.Run(ctx) }()
	return done
}
