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
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// Build compiles synapse-controller, synapse-agent and synapse-ane-worker into dir.
func Build(dir string) error {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	for _, b := range []struct{ out, pkg string }{
		{"synapse-controller", "."},
		{"synapse-agent", "./node-agent/cmd/synapse-agent"},
		{"synapse-ane-worker", "./node-agent/cmd/synapse-ane-worker"},
	} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, b.out), b.pkg)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("building %s: %v\n%s", b.out, err, out)
		}
	}
	return nil
}

// freePort asks the kernel for a TCP port free on the loopback (0 if it has none).
func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// stablePort is a loopback port for a listener that must come back on the same port after a
// restart (a Mac's API, the API server): previous, if it is still free, as an agent's
// configured --listen would be; otherwise a free port below the kernel's ephemeral range. An
// ephemeral port would do until its listener stops: then any process's outgoing connection may
// take it as its local port (the test packages beside this one open thousands), and the
// restarted listener could not bind it. taken says which ports are already given to listeners
// that may not be bound at the moment (a stopped Mac's), so no other is given them. The port
// is free on each of hosts, the loopback addresses its listeners are to bind.
func stablePort(previous int, taken func(int) bool, hosts ...string) int {
	if previous != 0 && portFree(previous, hosts) {
		return previous
	}
	const lowest = 10000 // above the ports services commonly take
	if ephemeral := ephemeralLow(); ephemeral > lowest+1000 {
		for range 100 {
			if p := lowest + rand.IntN(ephemeral-lowest); !taken(p) && portFree(p, hosts) {
				return p
			}
		}
	}
	// No free port below the range (a machine whose range starts low): an ephemeral one, which
	// serves until a restart finds it taken.
	return freePort()
}

// portFree says whether a port can be listened on now on each of hosts (a listener on all
// addresses takes it on each).
func portFree(port int, hosts []string) bool {
	for _, h := range hosts {
		l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range, from which outgoing
// connections take their local ports (Linux's ip_local_port_range; its default elsewhere).
func ephemeralLow() int {
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				return n
			}
		}
	}
	return 32768
}

// prefixed writes each line to out with "[name] " before it; one mutex keeps the processes'
// lines whole.
func prefixed(out io.Writer, name string) io.Writer {
	if out == nil {
		return io.Discard
	}
	return &prefixWriter{out: out, prefix: []byte("[" + name + "] ")}
}

var outMu sync.Mutex

type prefixWriter struct {
	out     io.Writer
	prefix  []byte
	partial []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	outMu.Lock()
	defer outMu.Unlock()
	data := append(w.partial, p...)
	end := bytes.LastIndexByte(data, '\n')
	if end < 0 {
		w.partial = data
		return len(p), nil
	}
	for _, line := range bytes.SplitAfter(data[:end+1], []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		if _, err := w.out.Write(append(append([]byte{}, w.prefix...), line...)); err != nil {
			return 0, err
		}
	}
	w.partial = append([]byte{}, data[end+1:]...)
	return len(p), nil
}

// advertiseIP is the address the Macs advertise when the fleet has no OwnAddresses: the
// machine's first non-loopback IPv4 address, which an EndpointSlice can hold, or the loopback
// if it has none (the endpoints controller then lists no endpoint for them). Nothing listens on
// it and nothing sends traffic to it: the Macs listen on, and callers use, the loopback
// (Fleet.URL).
func advertiseIP() string {
	addrs, err := net.InterfaceAddrs()
	if err == nil {
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() && !ip.IP.IsLinkLocalUnicast() {
				return ip.IP.String()
			}
		}
	}
	return "127.0.0.1"
}
