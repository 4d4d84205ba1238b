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
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"

	certificatesv1 "k8s.io/api/certificates/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
)

// TrustBundle is the fleet's CA bundle as any client reads it: the ClusterTrustBundle the
// controller publishes for the agents' signer.
func (f *Fleet) TrustBundle(ctx context.Context) (*x509.CertPool, error) {
	ctb := &certificatesv1.ClusterTrustBundle{}
	if err := f.Client.Get(ctx, client.ObjectKey{Name: agentcert.TrustBundle}, ctb); err != nil {
		return nil, fmt.Errorf("the fleet's CA bundle (ClusterTrustBundle %s): %w", agentcert.TrustBundle, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(ctb.Spec.TrustBundle)) {
		return nil, errors.New("the fleet's CA bundle holds no certificate")
	}
	return pool, nil
}

// TLSConfig is a client's TLS configuration for a Mac's API: it trusts the fleet's CA bundle
// and expects the Mac's name in its certificate, the name its certificate is issued for,
// whatever address it is called on (the tests call the loopback).
func (f *Fleet) TLSConfig(ctx context.Context, name string) (*tls.Config, error) {
	pool, err := f.TrustBundle(ctx)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, ServerName: name, MinVersion: tls.VersionTLS12}, nil
}

// HTTPClient is an HTTP client for a Mac's API (TLSConfig's, unless the fleet serves plain
// HTTP); it is made once per Mac and kept.
func (f *Fleet) HTTPClient(ctx context.Context, name string) (*http.Client, error) {
	if f.opts.PlainHTTP {
		return &http.Client{}, nil
	}
	f.mu.Lock()
	c := f.clients[name]
	f.mu.Unlock()
	if c != nil {
		return c, nil
	}
	cfg, err := f.TLSConfig(ctx, name)
	if err != nil {
		return nil, err
	}
	c = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	f.mu.Lock()
	f.clients[name] = c
	f.mu.Unlock()
	return c, nil
}
