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

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
)

// LaneCallerRole and MetricsReaderRole are config/rbac's ClusterRoles for calling lanes and
// scraping metrics.
const (
	LaneCallerRole    = "synapse-lane-caller"
	MetricsReaderRole = "synapse-metrics-reader"
)

// Caller creates (if need be) a ServiceAccount, binds it to LaneCallerRole in namespace when
// lanes is set (the namespace's lanes, by a RoleBinding) and to MetricsReaderRole when metrics
// is, and returns a token for it of the fleet's audience, valid an hour: what a client of the
// lanes presents to the Macs.
func (f *Fleet) Caller(ctx context.Context, namespace, name string, lanes, metrics bool) (string, error) {
	kube, err := kubernetes.NewForConfig(f.Config)
	if err != nil {
		return "", err
	}
	if _, err := kube.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}},
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("the ServiceAccount %s/%s: %w", namespace, name, err)
	}
	subjects := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: namespace}}
	if lanes {
		_, err := kube.RbacV1().RoleBindings(namespace).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name + "-lane-caller"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: LaneCallerRole}, Subjects: subjects}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("binding %s/%s to %s: %w", namespace, name, LaneCallerRole, err)
		}
	}
	if metrics {
		_, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: namespace + "-" + name + "-metrics"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: MetricsReaderRole}, Subjects: subjects}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("binding %s/%s to %s: %w", namespace, name, MetricsReaderRole, err)
		}
	}
	return f.Token(ctx, namespace, name, apiauth.DefaultAudience)
}

// Token is a token for a ServiceAccount, issued for audience and valid an hour.
func (f *Fleet) Token(ctx context.Context, namespace, name, audience string) (string, error) {
	kube, err := kubernetes.NewForConfig(f.Config)
	if err != nil {
		return "", err
	}
	var auds []string
	if audience != "" {
		auds = []string{audience}
	}
	tr, err := kube.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: auds, ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("a token for %s/%s: %w", namespace, name, err)
	}
	return tr.Status.Token, nil
}
