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
	"net"
	"strconv"
	"testing"
)

// TestListenAllSharesTheFirstPort: an agent listens on the loopback and on the address it
// advertises with one serving port, the one its MacNode reports.
func TestListenAllSharesTheFirstPort(t *testing.T) {
	lns, port, err := listenAll([]string{"127.0.0.1:0", "127.0.0.2:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := closeAll(lns); err != nil {
			t.Error(err)
		}
	}()
	if len(lns) != 2 || port == 0 {
		t.Fatalf("%d listeners on port %d", len(lns), port)
	}
	for _, ln := range lns {
		if got := ln.Addr().(*net.TCPAddr).Port; got != port {
			t.Errorf("%s listens on port %d, not the serving port %d", ln.Addr(), got, port)
		}
	}
}

func TestListenAllClosesWhatItOpenedWhenOneAddressFails(t *testing.T) {
	// A port free on 127.0.0.1 whose twin on 127.0.0.2 is taken.
	first, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := first.Addr().(*net.TCPAddr).Port
	taken, err := net.Listen("tcp", net.JoinHostPort("127.0.0.2", strconv.Itoa(port)))
	if err != nil {
		t.Skipf("127.0.0.2:%d is not free: %v", port, err)
	}
	defer taken.Close()
	addr := first.Addr().String()
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := listenAll([]string{addr, "127.0.0.2:0"}); err == nil {
		t.Fatal("listening on a taken port succeeded")
	}
	// The first listener was closed: its address is free again.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the first listener was left open: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := listenAll(nil); err == nil {
		t.Fatal("no address was accepted")
	}
	if _, _, err := listenAll([]string{"no-port"}); err == nil {
		t.Fatal("an address without a port was accepted")
	}
}
