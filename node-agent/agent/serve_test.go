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

package agent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
)

// staticCert is a ServingCertificate with one self-signed certificate for mac-1.
type staticCert struct{ cert *tls.Certificate }

func (s staticCert) Obtain(context.Context, func() bool) error { return nil }
func (s staticCert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cert, nil
}
func (s staticCert) ServeLanes([]types.NamespacedName)   {}
func (s staticCert) NamesLane(types.NamespacedName) bool { return true }
func (s staticCert) OnIssued(func())                     {}

func newStaticCert(t *testing.T) (staticCert, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "mac-1"}, DNSNames: []string{"mac-1"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return staticCert{cert: &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}}, pool
}

// TestTheAPIIsServedOverTLSAndHTTP1Only: with a certificate the API speaks TLS, with the
// source's certificate, and HTTP/1.1 alone, whose bounds (one call per connection under the
// connection limit) the server's limits are written for.
func TestTheAPIIsServedOverTLSAndHTTP1Only(t *testing.T) {
	cert, pool := newStaticCert(t)
	lns, _, err := listenAll([]string{"127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	limits := httpapi.DefaultServerLimits()
	srv := httpapi.NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			t.Error("a call arrived without TLS")
		}
	}), limits)
	s := newAPIServer(srv, lns, limits, cert, func(err error) { t.Error(err) })
	s.serve()
	defer func() {
		if err := s.shutdown(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	conn, err := tls.Dial("tcp", lns[0].Addr().String(), &tls.Config{RootCAs: pool, ServerName: "mac-1", NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.ConnectionState().NegotiatedProtocol; got != "http/1.1" {
		t.Fatalf("negotiated %q, want http/1.1", got)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "mac-1"}, ForceAttemptHTTP2: true}}
	resp, err := c.Get("https://" + lns[0].Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
	if resp.ProtoMajor != 1 || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s %d", resp.Proto, resp.StatusCode)
	}
}

// TestListenersNeverServedAreClosedOnShutdown: an agent that stops before its certificate came
// leaves no listener open.
func TestListenersNeverServedAreClosedOnShutdown(t *testing.T) {
	cert, _ := newStaticCert(t)
	lns, _, err := listenAll([]string{"127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr := lns[0].Addr().String()
	limits := httpapi.DefaultServerLimits()
	s := newAPIServer(httpapi.NewHTTPServer(http.NotFoundHandler(), limits), lns, limits, cert, func(err error) { t.Error(err) })
	if err := s.shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.serve() // too late: the server is shut down
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the listener was left open: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestAPlacementIsNotReadyUntilTheAPIServes: a lane loaded and checked on a node whose API waits
// for its first serving certificate is Loading, its Ready condition False saying why; once the
// API serves, it is Ready.
func TestAPlacementIsNotReadyUntilTheAPIServes(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	loadReady(t, a, p)
	a.awaitingCert.Store(true)
	got := p.DeepCopy()
	a.placementStatus(key, got)
	c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady)
	if got.Status.Phase != v1.PhaseLoading || c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1.PlacementReasonAwaitingServingCertificate {
		t.Fatalf("while the API awaits its certificate: phase %s, Ready %+v", got.Status.Phase, c)
	}
	a.awaitingCert.Store(false)
	got = p.DeepCopy()
	a.placementStatus(key, got)
	if c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady); got.Status.Phase != v1.PhaseReady || c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("once the API serves: phase %s, Ready %+v", got.Status.Phase, c)
	}
}

// namingCert is a ServingCertificate whose certificate names the Services of the lanes in
// named, and records the lanes it was asked to serve.
type namingCert struct {
	staticCert
	mu     sync.Mutex
	named  map[types.NamespacedName]bool
	served []types.NamespacedName
}

func (c *namingCert) ServeLanes(lanes []types.NamespacedName) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.served = slices.Clone(lanes)
}

func (c *namingCert) NamesLane(lane types.NamespacedName) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.named[lane]
}

// TestAPlacementIsNotReadyUntilTheCertificateNamesItsLanesService: a lane loaded and checked
// whose Service the node's certificate does not name yet is Loading, its Ready condition False
// saying which names it waits for (a call through the Service would not verify); the status
// pass asks the certificate for the lanes placed on the node; once it names the lane's
// Service, the placement is Ready.
func TestAPlacementIsNotReadyUntilTheCertificateNamesItsLanesService(t *testing.T) {
	p := testPlacement("gte")
	a, _, _ := newTestAgent(t, p)
	cert := &namingCert{named: map[types.NamespacedName]bool{}}
	a.cfg.TLS = cert
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	service := types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.Lane}
	loadReady(t, a, p)

	a.statusPass(context.Background(), newStatusBook())
	cert.mu.Lock()
	served := slices.Clone(cert.served)
	cert.mu.Unlock()
	if !slices.Equal(served, []types.NamespacedName{service}) {
		t.Fatalf("the certificate was asked to serve %v, want the lane placed on the node, %v", served, service)
	}
	got := p.DeepCopy()
	a.placementStatus(key, got)
	c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady)
	if got.Status.Phase != v1.PhaseLoading || c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1.PlacementReasonAwaitingServingCertificate ||
		!strings.Contains(c.Message, p.Spec.Lane+"."+p.Namespace+".svc") {
		t.Fatalf("while the certificate does not name the lane's Service: phase %s, Ready %+v", got.Status.Phase, c)
	}
	cert.mu.Lock()
	cert.named[service] = true
	cert.mu.Unlock()
	got = p.DeepCopy()
	a.placementStatus(key, got)
	if c := meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady); got.Status.Phase != v1.PhaseReady || c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("once the certificate names it: phase %s, Ready %+v", got.Status.Phase, c)
	}
	// A placement being retired is not asked for: the signer would deny the whole request.
	a.mu.Lock()
	a.lanes[key].state = laneRetiring
	a.mu.Unlock()
	a.statusPass(context.Background(), newStatusBook())
	cert.mu.Lock()
	served = slices.Clone(cert.served)
	cert.mu.Unlock()
	if len(served) != 0 {
		t.Fatalf("the certificate was asked to serve %v while the lane's placement retires", served)
	}
}
