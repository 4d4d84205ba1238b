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

package nodeidentity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// LabelNode marks the objects Join creates with the node they are for.
const LabelNode = "fleet.synapse.dev/node"

// JoinOptions says which Mac to join and how it reaches the API server.
type JoinOptions struct {
	// Node is the Mac's node name (its MacNode's).
	Node string
	// Server is the API server's URL as the Mac reaches it; CAData the CA bundle that verifies
	// it (PEM). Both are required.
	Server string
	CAData []byte
	// Lifetime is the token's (DefaultLifetime if zero; MinLifetime to MaxLifetime).
	Lifetime time.Duration
	// Dir receives the kubeconfig and the token: the Mac's state directory, or a directory to
	// copy them from.
	Dir string
}

// Joined is what Join wrote.
type Joined struct {
	ServiceAccount  string
	Kubeconfig      string
	TokenFile       string
	Expiry          time.Time
	CreatedIdentity bool // false when the Mac's ServiceAccount existed (a re-join)
}

// Join gives a Mac its identity: the ServiceAccount synapse-node-<node> in Namespace, a Role
// and RoleBinding that let it (and only it) request its own tokens, owned by the
// ServiceAccount so that deleting it removes them, a token, and a kubeconfig that reads the
// token from the file beside it. It records the API server's audiences (AudiencesConfigMap),
// the only ones the node-restriction policy lets a Mac request a token for. Joining a Mac again reuses its ServiceAccount and issues a
// fresh token. kube must be an administrator's client.
func Join(ctx context.Context, kube kubernetes.Interface, opts JoinOptions) (*Joined, error) {
	if err := ValidateNode(opts.Node); err != nil {
		return nil, err
	}
	if opts.Lifetime == 0 {
		opts.Lifetime = DefaultLifetime
	}
	if opts.Lifetime < MinLifetime || opts.Lifetime > MaxLifetime {
		return nil, fmt.Errorf("token lifetime %s: must be between %s and %s", opts.Lifetime, MinLifetime, MaxLifetime)
	}
	if opts.Server == "" || len(opts.CAData) == 0 {
		return nil, errors.New("the API server's URL and CA bundle are required for the Mac's kubeconfig")
	}
	if opts.Dir == "" {
		return nil, errors.New("an output directory is required")
	}
	name := ServiceAccountName(opts.Node)
	labels := map[string]string{LabelNode: opts.Node}
	if _, err := kube.CoreV1().Namespaces().Get(ctx, Namespace, metav1.GetOptions{}); err != nil {
		return nil, fmt.Errorf("namespace %s (install the chart or config/default first): %w", Namespace, err)
	}

	sa, err := kube.CoreV1().ServiceAccounts(Namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels},
		// The Mac's token comes from TokenRequest; no long-lived Secret token is ever mounted.
		AutomountServiceAccountToken: ptr.To(false),
	}, metav1.CreateOptions{})
	created := err == nil
	if apierrors.IsAlreadyExists(err) {
		sa, err = kube.CoreV1().ServiceAccounts(Namespace).Get(ctx, name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("ServiceAccount %s/%s: %w", Namespace, name, err)
	}
	owned := metav1.ObjectMeta{Name: name, Namespace: Namespace, Labels: labels, OwnerReferences: []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "ServiceAccount", Name: sa.Name, UID: sa.UID}}}
	role := &rbacv1.Role{ObjectMeta: owned, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, Verbs: []string{"create"}, ResourceNames: []string{name}}}}
	if err := createOrReplaceRole(ctx, kube, role); err != nil {
		return nil, err
	}
	binding := &rbacv1.RoleBinding{ObjectMeta: owned,
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: Namespace}}}
	if err := createOrReplaceBinding(ctx, kube, binding); err != nil {
		return nil, err
	}

	tr, err := kube.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(opts.Lifetime / time.Second))}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("requesting a token for %s/%s: %w", Namespace, name, err)
	}
	if err := recordAudiences(ctx, kube, tr.Spec.Audiences); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return nil, err
	}
	out := &Joined{ServiceAccount: name, Kubeconfig: filepath.Join(opts.Dir, KubeconfigFile), TokenFile: filepath.Join(opts.Dir, TokenFile),
		Expiry: tr.Status.ExpirationTimestamp.Time, CreatedIdentity: created}
	if err := writeFileAtomic(out.TokenFile, []byte(tr.Status.Token)); err != nil {
		return nil, err
	}
	kubeconfig, err := clientcmd.Write(Kubeconfig(opts.Node, opts.Server, opts.CAData))
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(out.Kubeconfig, kubeconfig); err != nil {
		return nil, err
	}
	return out, nil
}

// Kubeconfig is a Mac's kubeconfig: the API server, its CA, and the token read from the file
// TokenFile beside the kubeconfig (client-go re-reads it, so renewals need no restart).
func Kubeconfig(node, server string, caData []byte) clientcmdapi.Config {
	user := ServiceAccountName(node)
	return clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"synapse-fleet": {Server: server, CertificateAuthorityData: caData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {TokenFile: TokenFile}},
		Contexts:       map[string]*clientcmdapi.Context{user: {Cluster: "synapse-fleet", AuthInfo: user}},
		CurrentContext: user,
	}
}

func createOrReplaceRole(ctx context.Context, kube kubernetes.Interface, role *rbacv1.Role) error {
	roles := kube.RbacV1().Roles(role.Namespace)
	_, err := roles.Create(ctx, role, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old *rbacv1.Role
		if old, err = roles.Get(ctx, role.Name, metav1.GetOptions{}); err == nil {
			role.ResourceVersion = old.ResourceVersion
			_, err = roles.Update(ctx, role, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("Role %s/%s: %w", role.Namespace, role.Name, err)
	}
	return nil
}

func createOrReplaceBinding(ctx context.Context, kube kubernetes.Interface, b *rbacv1.RoleBinding) error {
	bindings := kube.RbacV1().RoleBindings(b.Namespace)
	_, err := bindings.Create(ctx, b, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// A RoleBinding's roleRef cannot change: replace the binding whole.
		if err = bindings.Delete(ctx, b.Name, metav1.DeleteOptions{}); err == nil || apierrors.IsNotFound(err) {
			_, err = bindings.Create(ctx, b, metav1.CreateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("RoleBinding %s/%s: %w", b.Namespace, b.Name, err)
	}
	return nil
}
