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
	"crypto/tls"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
)

// Files is a certificate an administrator provides (--tls=files), read once when the agent
// starts: replacing it takes a restart, and renewing it is the administrator's business.
type Files struct {
	cert *tls.Certificate
}

// LoadFiles reads the certificate (PEM, the leaf first) and its key.
func LoadFiles(certFile, keyFile string) (*Files, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("the serving certificate files: %w", err)
	}
	return &Files{cert: &pair}, nil
}

// Obtain has nothing to obtain: the certificate was read by LoadFiles.
func (f *Files) Obtain(context.Context, func() bool) error { return nil }

// ServeLanes does nothing: the administrator's certificate names what it names (for calls
// through the lanes' Services, their names: see the README).
func (f *Files) ServeLanes([]types.NamespacedName) {}

// NamesLane is true: whether the administrator's certificate names the lane's Service is the
// administrator's business, and a placement is not held back for it.
func (f *Files) NamesLane(types.NamespacedName) bool { return true }

// OnIssued does nothing: the files are read once.
func (f *Files) OnIssued(func()) {}

// GetCertificate is the TLS server's.
func (f *Files) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) { return f.cert, nil }
