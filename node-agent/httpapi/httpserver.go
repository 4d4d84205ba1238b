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

package httpapi

import (
	"net"
	"net/http"
	"time"

	"golang.org/x/net/netutil"
)

// ServerLimits bound what one client can hold of the HTTP server: time to send its headers and
// body, time for the answer, an idle connection's life, the headers' size and the connections
// open at once on each listener.
type ServerLimits struct {
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	MaxHeaderBytes                                            int
	// MaxConns bounds the connections a listener holds open; past it, new connections wait in
	// the kernel's accept queue until one closes.
	MaxConns int
}

// MaxRequestDeadline is the longest a lane's requests may run (CatalogLane's
// requestDeadlineSeconds is at most 600): the server's write timeout leaves room for it.
const MaxRequestDeadline = 600 * time.Second

// DefaultServerLimits are the agent's: a slow client (a slow-loris sending its headers or body a
// byte at a time) is cut off after 10 s of headers or 60 s of request, an answer may take the
// longest lane deadline and a little more, idle connections close after 2 minutes, headers are
// at most 64 KiB (a bearer token is a few KiB) and a listener holds at most 1024 connections.
func DefaultServerLimits() ServerLimits {
	return ServerLimits{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second,
		WriteTimeout: MaxRequestDeadline + 30*time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, MaxConns: 1024}
}

// NewHTTPServer returns an http.Server for h under the limits; serve it on listeners wrapped by
// LimitListener.
func NewHTTPServer(h http.Handler, l ServerLimits) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.ReadTimeout,
		WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout, MaxHeaderBytes: l.MaxHeaderBytes}
}

// LimitListener bounds the connections ln holds open at once to l.MaxConns (none if zero).
func LimitListener(ln net.Listener, l ServerLimits) net.Listener {
	if l.MaxConns <= 0 {
		return ln
	}
	return netutil.LimitListener(ln, l.MaxConns)
}
