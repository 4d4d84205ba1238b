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
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"

	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
)

// apiServer serves the HTTP API on the agent's listeners, over TLS when the agent has a serving
// certificate. The listeners are opened first (the MacNode reports their port) and served
// later (once the certificate is there); whatever happens in between, shutdown closes them.
type apiServer struct {
	srv    *http.Server
	lns    []net.Listener
	limits httpapi.ServerLimits
	tls    bool
	// fail reports a listener that stopped serving.
	fail func(error)

	mu               sync.Mutex
	serving, stopped bool
}

func newAPIServer(srv *http.Server, lns []net.Listener, limits httpapi.ServerLimits, cert ServingCertificate, fail func(error)) *apiServer {
	s := &apiServer{srv: srv, lns: lns, limits: limits, tls: cert != nil, fail: fail}
	if cert != nil {
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: cert.GetCertificate}
		// HTTP/1.1 only: the server's bounds (a connection per call in flight under the
		// connection limit, the header limit, the read and idle timeouts against slow clients)
		// are HTTP/1.1's; HTTP/2 would multiplex calls past the connection limit.
		var p http.Protocols
		p.SetHTTP1(true)
		srv.Protocols = &p
	}
	return s
}

// serve starts serving every listener, unless the server is shut down already.
func (s *apiServer) serve() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped || s.serving {
		return
	}
	s.serving = true
	for _, ln := range s.lns {
		limited := httpapi.LimitListener(ln, s.limits)
		go func() {
			var err error
			if s.tls {
				// The certificate comes from srv.TLSConfig.GetCertificate, for every connection.
				err = s.srv.ServeTLS(limited, "", "")
			} else {
				err = s.srv.Serve(limited)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.fail(fmt.Errorf("http on %s: %w", ln.Addr(), err))
			}
		}()
	}
}

// shutdown stops the server within ctx; listeners never served are closed.
func (s *apiServer) shutdown(ctx context.Context) error {
	s.mu.Lock()
	serving := s.serving
	s.stopped = true
	s.mu.Unlock()
	if !serving {
		return closeAll(s.lns)
	}
	return s.srv.Shutdown(ctx)
}

// reportsAddress says whether the node's MacNode, as the agent last read it, reports the
// address the agent advertises: the fleet's signer approves a certificate only for addresses
// the MacNode reports, so the agent asks for one only once it does.
func (a *Agent) reportsAddress() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.node == nil {
		return false
	}
	for _, addr := range a.node.Status.Addresses {
		if addr.Address == a.cfg.Address {
			return true
		}
	}
	return false
}
