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
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve runs the API under limits on a loopback listener.
func serve(t *testing.T, l ServerLimits) string {
	t.Helper()
	_, s, _ := newTestServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewHTTPServer(s, l)
	go func() { _ = srv.Serve(LimitListener(ln, l)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// A client that sends its headers a byte at a time and never finishes (slow-loris) is cut off
// at the header timeout rather than holding its connection for ever.
func TestASlowLorisClientIsCutOff(t *testing.T) {
	l := DefaultServerLimits()
	l.ReadHeaderTimeout, l.ReadTimeout = 200*time.Millisecond, time.Second
	addr := serve(t, l)
	for name, partial := range map[string]string{
		"headers": "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: appl",
		"body":    "POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\": ",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, partial); err != nil {
				t.Fatal(err)
			}
			// The server closes the connection (after answering 408, or not at all); this
			// bound only keeps a broken server from hanging the test.
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err = io.ReadAll(c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the server kept a slow client's connection open")
			}
		})
	}
}

// Headers over the limit are refused with 431 before the handler sees them.
func TestOversizeHeadersAreRefused(t *testing.T) {
	l := DefaultServerLimits()
	l.MaxHeaderBytes = 4 << 10
	addr := serve(t, l)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/embeddings", strings.NewReader(`{"model": "embed", "input": "a"}`))
	req.Header.Set("Authorization", "Bearer "+strings.Repeat("x", 16<<10))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("%d, want 431", resp.StatusCode)
	}
}

// A listener holds at most MaxConns connections: a further client waits until one closes, then
// is served.
func TestConnectionsAreBoundedPerListener(t *testing.T) {
	l := DefaultServerLimits()
	l.MaxConns = 2
	addr := serve(t, l)
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		// A request on each proves the server accepted the connection; kept alive, it stays held.
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v %v", resp, err)
		}
		held = append(held, c)
	}
	served := make(chan error, 1)
	go func() {
		c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := c.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		served <- err
	}()
	select {
	case err := <-served:
		t.Fatalf("a third connection was served while two were held (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	held[0].Close()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	held[1].Close()
}
