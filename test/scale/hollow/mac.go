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

// Package hollow runs hollow Macs, as kubemark runs hollow nodes: each is the real node agent's
// cluster side (node-agent/agent: registration, Lease renewal at its interval, the placement
// reconciler, the status writer and its coalescing, its HTTP API) against a real API server,
// with only the worker processes and the Neural Engine replaced in process by the sim's timing
// model (see Workers). A thousand fit in one process on a small machine.
package hollow

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/agent"
	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/servingcert"
	"github.com/ck-synapse/synapse-fleet/node-agent/simane"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

// SigningID is the worker signing identifier every hollow Mac reports.
const SigningID = "synapse-ane-worker"

// Spec is one hollow Mac.
type Spec struct {
	Name       string
	MacOSBuild v1.MacOSBuild
	Labels     map[string]string
	// Budget is its layer executables (0: the agent's default, 100).
	Budget int
	// Faults is injected into every worker generation it starts (worker.ParseFaults).
	Faults string
	// Address is the address it advertises (its MacNode's InternalIP), its own as a real
	// Mac's is; it listens on the loopback whatever it advertises, and nothing is sent to it.
	Address string
}

// Config is what every hollow Mac of a fleet shares.
type Config struct {
	// RestConfig returns the credentials the named Mac's agent uses (its own identity).
	RestConfig func(name string) (*rest.Config, error)
	Scheme     *runtime.Scheme
	// ArtifactRoot holds the sim artifacts (see InstallArtifact), one tree per macOS build shared
	// by the Macs of that build, as a disk image would be.
	ArtifactRoot string
	// BinaryDigest is the worker binary digest the Macs report and identities certify.
	BinaryDigest v1.Sha256Digest
	// SimScale scales the simulated compile and load times.
	SimScale float64
	// LeaseDuration and StatusInterval are the agents' (0: their defaults).
	LeaseDuration, StatusInterval time.Duration
	// PKIRoot keeps each Mac's serving certificate and key across its agent's restarts, as the
	// agent's --tls-cert-dir does, one directory per Mac.
	PKIRoot string
	Log     logr.Logger
}

// RestartDelay is how long launchd waits before it starts an agent that exited again (its
// default ThrottleInterval).
const RestartDelay = 10 * time.Second

// Mac is one running hollow Mac.
type Mac struct {
	Spec    Spec
	Machine *simane.Machine
	plug    *plug
	cancel  context.CancelFunc
	done    chan struct{}

	mu       sync.Mutex
	restarts int
	lastErr  error
}

// Start starts a hollow Mac's agent. It returns at once; the agent registers its MacNode,
// renews its Lease and serves its placements until Kill or Stop. An agent that exits with an
// error (it cannot reach the API server as it starts, say) is started again after
// RestartDelay, as launchd's KeepAlive does; its Neural Engine and aned cache stay.
func Start(cfg Config, spec Spec) (*Mac, error) {
	rc, err := cfg.RestConfig(spec.Name)
	if err != nil {
		return nil, err
	}
	m := &Mac{Spec: spec, plug: newPlug(), done: make(chan struct{}),
		Machine: simane.New(simane.Config{Clock: clock.RealClock{}, Scale: cfg.SimScale})}
	rc = rest.CopyConfig(rc)
	rc.Dial = m.plug.dial
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	// As a real Mac's: the API's callers are reviewed by the API server as this node.
	auth := apiauth.New(apiauth.Config{TokenReviews: cs.AuthenticationV1(), SubjectAccessReviews: cs.AuthorizationV1(), Clock: clock.RealClock{}})
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.done)
		for {
			ws := m.workers(cfg)
			a, err := m.newAgent(cfg, auth, cs, ws)
			if err == nil {
				err = a.Run(ctx, rc, cfg.Scheme)
			}
			// The agent's process has exited, and its workers with it, whether or not it
			// retired its lanes in its shutdown's time.
			ws.ExitAll()
			if ctx.Err() != nil {
				return
			}
			m.mu.Lock()
			m.restarts, m.lastErr = m.restarts+1, err
			m.mu.Unlock()
			cfg.Log.Error(err, "the agent exited; starting it again", "node", spec.Name)
			select {
			case <-ctx.Done():
				return
			case <-time.After(RestartDelay):
			}
		}
	}()
	return m, nil
}

// Restarts is how many times the agent exited and was started again, and why it last exited.
func (m *Mac) Restarts() (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.restarts, m.lastErr
}

// newAgent is one run of the Mac's agent process: as synapse-agent's default --tls=auto, it
// serves its API with a certificate from the cluster's signer, asked for as the node's own
// identity, for its name, its address and the Services of the lanes placed on it (a placement
// is Ready only once the certificate names its lane).
func (m *Mac) newAgent(cfg Config, auth *apiauth.Delegating, cs kubernetes.Interface, ws *Workers) (*agent.Agent, error) {
	spec := m.Spec
	log := cfg.Log.WithValues("node", spec.Name)
	dir := ""
	if cfg.PKIRoot != "" {
		dir = filepath.Join(cfg.PKIRoot, spec.Name)
	}
	cert, err := servingcert.New(servingcert.Config{Node: spec.Name, Addresses: []string{spec.Address}, Client: cs, Dir: dir,
		Clock: clock.RealClock{}, Log: log.WithName("tls")})
	if err != nil {
		return nil, err
	}
	return agent.New(agent.Config{
		NodeName: spec.Name, Labels: spec.Labels,
		Auth: auth, TLS: cert,
		Platform: v1.Platform{Chip: "Apple M4 (hollow)", MacOSBuild: spec.MacOSBuild, HardwareModel: "hollow"},
		Worker:   v1.NodeWorker{SigningIdentifier: SigningID, BinaryDigest: cfg.BinaryDigest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Budget:   spec.Budget, Address: spec.Address, Listen: []string{"127.0.0.1:0"},
		// The agent's own worker host, at its default call bounds, with its workers in process.
		Host: workerhost.New(workerhost.Config{Backend: string(v1.BackendSim), BinaryDigest: string(cfg.BinaryDigest), Log: log,
			Clock: clock.RealClock{}, Launch: ws.Launch}),
		// No lane lock: nothing outside this process could reach the simulated device, and an
		// agent started again in the same process could not take a lock its predecessor held.
		ArtifactRoot: filepath.Join(cfg.ArtifactRoot, string(spec.MacOSBuild)), ChipFamily: chipFamily, ConverterVersion: artifact.SimConverterVersion,
		LeaseDuration: cfg.LeaseDuration, StatusInterval: cfg.StatusInterval,
		Clock: clock.RealClock{}, Log: log,
	}), nil
}

// workers are the workers of one run of the Mac's agent process, on the Mac's Neural Engine.
func (m *Mac) workers(cfg Config) *Workers {
	return &Workers{Machine: m.Machine, SigningID: SigningID, BinaryDigest: string(cfg.BinaryDigest), Clock: clock.RealClock{},
		Faults: m.Spec.Faults}
}

// Stop stops the agent as SIGTERM does: it retires its lanes and marks its placements.
func (m *Mac) Stop(timeout time.Duration) error {
	m.cancel()
	return m.wait(timeout)
}

// Kill ends the Mac as a power cut would: its connections to the API server drop at once and
// nothing it does afterwards reaches it; then its agent is stopped (its last words fail).
func (m *Mac) Kill(timeout time.Duration) error {
	m.plug.cut()
	m.cancel()
	return m.wait(timeout)
}

// wait waits for the agent to return.
func (m *Mac) wait(timeout time.Duration) error {
	select {
	case <-m.done:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("hollow Mac %s did not stop within %s", m.Spec.Name, timeout)
	}
}

var errCut = errors.New("the hollow Mac was cut off")

// plug is a Mac's network cable: every connection its agent makes to the API server goes
// through it, and cutting it closes them and refuses new ones.
type plug struct {
	mu    sync.Mutex
	cut_  bool
	conns map[net.Conn]struct{}
	d     net.Dialer
}

func newPlug() *plug { return &plug{conns: map[net.Conn]struct{}{}} }

func (p *plug) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	p.mu.Lock()
	if p.cut_ {
		p.mu.Unlock()
		return nil, errCut
	}
	p.mu.Unlock()
	c, err := p.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut_ {
		c.Close()
		return nil, errCut
	}
	tc := &trackedConn{Conn: c, p: p}
	p.conns[tc] = struct{}{}
	return tc, nil
}

// trackedConn leaves its plug's set when it closes.
type trackedConn struct {
	net.Conn
	p *plug
}

func (c *trackedConn) Close() error {
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
	return c.Conn.Close()
}

func (p *plug) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut_ = true
	for c := range p.conns {
		_ = c.(*trackedConn).Conn.Close()
	}
	clear(p.conns)
}
