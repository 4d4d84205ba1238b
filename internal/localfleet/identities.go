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

package localfleet

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/ck-synapse/synapse-fleet/internal/manifests"
	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
)

const (
	// ControllerNamespace and ControllerServiceAccount are the controller's identity, as
	// config/rbac binds it.
	ControllerNamespace      = "synapse-system"
	ControllerServiceAccount = "synapse-controller"
	// controllerTokenLifetime: in a cluster the kubelet refreshes a pod's token; here nothing
	// does, so the controller's lasts as long as a dev fleet plausibly runs.
	controllerTokenLifetime = 7 * 24 * time.Hour
)

// install applies what config/default installs in a cluster, but the controller's Deployment
// (the controller runs here as a process, under the same ServiceAccount and RBAC): the
// namespaces, the controller's and the agents' RBAC, and the node-restriction policies.
func (f *Fleet) install(ctx context.Context) error {
	objs, err := manifests.Read(filepath.Join(f.opts.Config, "default"))
	if err != nil {
		return fmt.Errorf("reading config/default: %w", err)
	}
	return manifests.Apply(ctx, f.Client, manifests.Without(objs, "Deployment", "CustomResourceDefinition"))
}

// controllerKubeconfig requests a token for the controller's ServiceAccount and writes a
// kubeconfig that uses it, so the controller runs under the RBAC the project ships.
func (f *Fleet) controllerKubeconfig(ctx context.Context) (string, error) {
	kube, err := kubernetes.NewForConfig(f.Config)
	if err != nil {
		return "", err
	}
	tr, err := kube.CoreV1().ServiceAccounts(ControllerNamespace).CreateToken(ctx, ControllerServiceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(controllerTokenLifetime / time.Second))}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for the controller's ServiceAccount: %w", err)
	}
	dir := filepath.Dir(f.ControllerKubeconfig())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(tr.Status.Token), 0o600); err != nil {
		return "", err
	}
	path := f.ControllerKubeconfig()
	return path, clientcmd.WriteToFile(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"local": {Server: f.Config.Host, CertificateAuthorityData: f.Config.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{"controller": {TokenFile: "token"}},
		Contexts:       map[string]*clientcmdapi.Context{"controller": {Cluster: "local", AuthInfo: "controller"}},
		CurrentContext: "controller",
	}, path)
}

// join gives a Mac its identity, as an administrator does with `synapse-agent join`, once: a
// Mac started again keeps its token, which its agent renews.
func (f *Fleet) join(ctx context.Context, mac string) (string, error) {
	dir := f.StateDir(mac)
	path := filepath.Join(dir, nodeidentity.KubeconfigFile)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	kube, err := kubernetes.NewForConfig(f.Config)
	if err != nil {
		return "", err
	}
	if _, err := nodeidentity.Join(ctx, kube, nodeidentity.JoinOptions{Node: mac, Server: f.Config.Host, CAData: f.Config.CAData, Dir: dir}); err != nil {
		return "", fmt.Errorf("joining %s: %w", mac, err)
	}
	return path, nil
}

// StateDir is a Mac's state directory: its identity (kubeconfig and token), its aned cache
// and its artifacts.
func (f *Fleet) StateDir(mac string) string { return filepath.Join(f.opts.Dir, "macs", mac) }

// AdminSocket is the Unix socket a Mac's agent serves its admin API on (its default, in its
// state directory).
func (f *Fleet) AdminSocket(mac string) string { return filepath.Join(f.StateDir(mac), "admin.sock") }

// MacKubeconfig is the kubeconfig of a Mac's own identity, the one its agent runs with.
func (f *Fleet) MacKubeconfig(mac string) string {
	return filepath.Join(f.StateDir(mac), nodeidentity.KubeconfigFile)
}

// ControllerKubeconfig is the kubeconfig of the controller's ServiceAccount, the one it runs
// with.
func (f *Fleet) ControllerKubeconfig() string {
	return filepath.Join(f.opts.Dir, "controller", "kubeconfig")
}

// ControllerMetricsURL is the controller's metrics endpoint: HTTPS (a self-signed certificate),
// for callers that present a token RBAC allows to get /metrics.
func (f *Fleet) ControllerMetricsURL() string {
	return "https://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(f.metrics)) + "/metrics"
}
