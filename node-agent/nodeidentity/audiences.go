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
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

const (
	// AudiencesConfigMap, in Namespace, holds the API server's audiences under AudiencesKey,
	// comma-separated (as kube-apiserver's --api-audiences): the parameter of the
	// node-restriction policy synapse-agent-token-audiences, which lets a Mac request a token for those
	// audiences only. No policy can read the API server's flags, and a TokenRequest that names
	// no audience reaches admission with them already filled in, so Join records the ones its
	// own TokenRequest was given.
	AudiencesConfigMap = "synapse-node-token-audiences"
	AudiencesKey       = "audiences"
)

// recordAudiences writes audiences into AudiencesConfigMap, creating it or replacing what it
// held (the API server's audiences are what they are now; a Mac asks for no others).
func recordAudiences(ctx context.Context, kube kubernetes.Interface, audiences []string) error {
	if len(audiences) == 0 {
		return errors.New("the API server issued a token with no audience; the node-restriction policy needs its audiences")
	}
	for _, a := range audiences {
		if strings.Contains(a, ",") {
			return fmt.Errorf("the API server's audience %q contains a comma, which %s/%s cannot hold", a, Namespace, AudiencesConfigMap)
		}
	}
	want := strings.Join(audiences, ",")
	cms := kube.CoreV1().ConfigMaps(Namespace)
	cm, err := cms.Get(ctx, AudiencesConfigMap, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: AudiencesConfigMap, Namespace: Namespace},
			Data: map[string]string{AudiencesKey: want}}, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			err = nil // another Join, of the same API server, was first
		}
	case err == nil && cm.Data[AudiencesKey] != want:
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[AudiencesKey] = want
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("recording the API server's audiences in ConfigMap %s/%s: %w", Namespace, AudiencesConfigMap, err)
	}
	return nil
}
