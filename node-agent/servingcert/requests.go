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

package servingcert

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	certificatesv1client "k8s.io/client-go/kubernetes/typed/certificates/v1"
)

// recordingClient is the node's clientset as the certificate manager uses it, remembering the
// names of the last two requests it created (the manager does not say), so that a wait can say
// what became of them.
type recordingClient struct {
	kubernetes.Interface
	mu      sync.Mutex
	created [2]string // the last, and the one before
	asked   []string  // the DNS names the last request asked for
	// onCreate is told of each request made, with the DNS names it asked for.
	onCreate func(asked []string)
}

// askedFor is the DNS names the last request asked for.
func (c *recordingClient) askedFor() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.asked
}

func (c *recordingClient) CertificatesV1() certificatesv1client.CertificatesV1Interface {
	return recordingV1{CertificatesV1Interface: c.Interface.CertificatesV1(), c: c}
}

func (c *recordingClient) last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created[0]
}

func (c *recordingClient) previous() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.created[1]
}

type recordingV1 struct {
	certificatesv1client.CertificatesV1Interface
	c *recordingClient
}

func (v recordingV1) CertificateSigningRequests() certificatesv1client.CertificateSigningRequestInterface {
	return recordingCSRs{CertificateSigningRequestInterface: v.CertificatesV1Interface.CertificateSigningRequests(), c: v.c}
}

type recordingCSRs struct {
	certificatesv1client.CertificateSigningRequestInterface
	c *recordingClient
}

func (r recordingCSRs) Create(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, opts metav1.CreateOptions) (*certificatesv1.CertificateSigningRequest, error) {
	out, err := r.CertificateSigningRequestInterface.Create(ctx, csr, opts)
	if err == nil {
		var asked []string
		if block, _ := pem.Decode(csr.Spec.Request); block != nil {
			if req, perr := x509.ParseCertificateRequest(block.Bytes); perr == nil {
				asked = req.DNSNames
			}
		}
		r.c.mu.Lock()
		r.c.created = [2]string{out.Name, r.c.created[0]}
		r.c.asked = asked
		r.c.mu.Unlock()
		if r.c.onCreate != nil {
			r.c.onCreate(asked)
		}
	}
	return out, err
}

// state says what the wait for a certificate waits for: the node's addresses, or the judgement
// of the last request.
func (s *Auto) state(ctx context.Context) string {
	state, _ := s.stateOf(ctx)
	return state
}

// stateOf is state, and whether the last request still waits for its answer (describeRequest),
// and the one before it too if the manager asked again.
func (s *Auto) stateOf(ctx context.Context) (string, bool) {
	s.mu.Lock()
	open := s.open
	s.mu.Unlock()
	name := s.client.last()
	switch {
	case !open:
		return fmt.Sprintf("nothing requested yet: MacNode %s does not report its address yet, and the signer approves only addresses it reports", s.cfg.Node), false
	case name == "":
		return "no certificate signing request could be made yet (the agent's log says why)", false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	state, waiting := s.describeRequest(ctx, name)
	// The manager asks again after a denial: the one before says why it is asking, and a
	// request asked again after a denial or a failure is not waited on past the wait timeout
	// (its answer is already known). One abandoned while pending is still waiting.
	if before := s.client.previous(); waiting && before != "" {
		prev, prevWaiting := s.describeRequest(ctx, before)
		state += "; the one before: " + prev
		waiting = prevWaiting
	}
	return state, waiting
}

// describeRequest says where a request stands, and whether it is still waiting for its
// answer: not judged, or approved and not signed yet, or unreadable for now (a busy API server;
// a request that is gone waits for nothing).
func (s *Auto) describeRequest(ctx context.Context, name string) (string, bool) {
	csr, err := s.client.Interface.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Sprintf("certificate signing request %s is gone", name), false
	}
	if err != nil {
		return fmt.Sprintf("certificate signing request %s cannot be read: %v", name, err), true
	}
	return describe(csr)
}

// describe says where a request stands, and whether it waits for its answer: nothing has judged
// it yet, or it is approved and not signed yet (the signer signs on a later pass when a
// signature or its write failed).
func describe(csr *certificatesv1.CertificateSigningRequest) (string, bool) {
	for _, c := range csr.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case certificatesv1.CertificateDenied:
			return fmt.Sprintf("certificate signing request %s was denied (%s): %s", csr.Name, c.Reason, c.Message), false
		case certificatesv1.CertificateFailed:
			return fmt.Sprintf("certificate signing request %s failed (%s): %s", csr.Name, c.Reason, c.Message), false
		}
	}
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Status == corev1.ConditionTrue {
			return fmt.Sprintf("certificate signing request %s is approved but not signed yet", csr.Name), true
		}
	}
	return fmt.Sprintf("certificate signing request %s is pending: nothing has judged it; is synapse-controller (the approver of signer %s) running? "+
		"(kubectl get csr %s)", csr.Name, SignerName, csr.Name), true
}
