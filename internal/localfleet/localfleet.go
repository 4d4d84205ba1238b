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

// Package localfleet runs a whole fleet on one machine, as processes: the envtest control plane
// (kube-apiserver and etcd), the CRDs, the RBAC and node-restriction policies of config/,
// synapse-controller under its own ServiceAccount, and simulated Macs (synapse-agent with sim
// workers), each joined as its own node identity. make dev and the e2e suite both run it; only
// the caller (kubectl, the tests) uses the administrator's kubeconfig.
package localfleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
)

// Mac is one simulated Mac.
type Mac struct {
	Name       string
	MacOSBuild string
	// Port is the agent's HTTP port (0: a free one). A fleet of OwnAddresses chooses the port
	// its Macs share; it refuses a Mac of another.
	Port int
	// Budget is its layer executables (0: the default, 100).
	Budget int
	// Env is added to the agent's environment (its workers inherit it: injected faults).
	Env []string
}

// Options configures a fleet.
type Options struct {
	// Assets holds kube-apiserver, etcd and kubectl; Config is the project's config/ (the CRDs,
	// RBAC and policies installed from it).
	Assets, Config string
	// Bin holds synapse-controller, synapse-agent and synapse-ane-worker (see Build).
	Bin string
	// Dir holds the fleet's state: the kubeconfig, the API server's certificates, the Macs'
	// state. It is created if needed.
	Dir  string
	Macs []Mac
	// SimScale scales the simulated compile and load times.
	SimScale float64
	// NodeGracePeriod and NodeEvictionTimeout are the controller's (0: its defaults);
	// LeaseDuration and StatusInterval are the agents' (0: theirs).
	NodeGracePeriod, NodeEvictionTimeout, LeaseDuration, StatusInterval time.Duration
	// PlacementProgressInterval is the agents' (0: theirs).
	PlacementProgressInterval time.Duration
	// Out receives every process's output, each line prefixed with the process's name.
	Out io.Writer
	// AnonymousAPI lets every caller into the Macs' API (--auth=none): make dev's choice, so
	// that a curl on the loopback needs no token. The e2e suite leaves it off: callers present
	// tokens that the Macs review with the API server (Caller).
	AnonymousAPI bool
	// PlainHTTP serves the Macs' API without TLS (--tls=none), for make dev beside
	// AnonymousAPI. Otherwise each Mac gets its serving certificate from the controller (the
	// fleet's signer) and callers verify it against the fleet's CA bundle (HTTPClient).
	PlainHTTP bool
	// OwnAddresses gives each Mac addresses of its own, as a real fleet's Macs have, on one port
	// they all share: Mac k (the k-th of Macs, then of the Macs first started later; a Mac keeps
	// its number when it stops and starts again) listens on the loopback address 127.0.0.(10+k)
	// and advertises 198.51.100.(10+k), a documentation address (ownaddresses.go). A lane's
	// endpoints then share a port, so one EndpointSlice lists them all, and a blue/green switch
	// is one update of it: the e2e suite's choice. Otherwise every Mac listens on 127.0.0.1 on a
	// port of its own (each one's endpoints in a slice of their own) and advertises the
	// machine's address: make dev's choice, whose ports the README and docs/development.md document.
	OwnAddresses bool
}

// Fleet is a running fleet.
type Fleet struct {
	opts   Options
	env    *envtest.Environment
	Config *rest.Config
	Client client.Client
	// Kubeconfig is the path of the administrator's kubeconfig, for kubectl and the tests; the
	// controller and the Macs run under identities of their own.
	Kubeconfig string
	// WorkerDigest is the SHA-256 of the worker binary every Mac reports.
	WorkerDigest v1.Sha256Digest

	mu         sync.Mutex
	controller *process
	metrics    int // the controller's metrics port
	agents     map[string]*process
	ports      map[string]int
	clients    map[string]*http.Client // by Mac (HTTPClient)
	// ip is the address every Mac advertises, unless the fleet has OwnAddresses: then hosts
	// holds each Mac's host number, the last byte of its addresses (ownaddresses.go).
	// shared is the port they all listen on then.
	ip     string
	hosts  map[string]byte
	shared int
}

// Start starts the control plane, the controller and the Macs, and waits until every one is
// healthy. On error everything started is stopped.
func Start(ctx context.Context, opts Options) (f *Fleet, err error) {
	if opts.Assets == "" {
		return nil, errors.New("no control-plane binaries: set KUBEBUILDER_ASSETS (make dev and make test do)")
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	certs := filepath.Join(opts.Dir, "apiserver")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: opts.Assets,
		CRDDirectoryPaths:     []string{filepath.Join(opts.Config, "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		// Certificates in a directory of ours survive an API server restart, and so do the
		// clients' credentials.
		// Its port is outside the ephemeral range, so that it is still free when the API
		// server restarts (RestartAPIServer).
		ControlPlane: envtest.ControlPlane{APIServer: &envtest.APIServer{CertDir: certs,
			SecureServing: envtest.SecureServing{ListenAddr: envtest.ListenAddr{Address: "127.0.0.1", Port: strconv.Itoa(stablePort(0, func(int) bool { return false }, "127.0.0.1"))}}}},
		ControlPlaneStopTimeout: 2 * time.Minute,
	}
	fmt.Fprintln(opts.Out, "starting etcd and kube-apiserver ...")
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	f = &Fleet{opts: opts, env: env, Config: cfg, agents: map[string]*process{}, ports: map[string]int{}, clients: map[string]*http.Client{},
		hosts: map[string]byte{}, Kubeconfig: filepath.Join(opts.Dir, "kubeconfig")}
	if !opts.OwnAddresses {
		f.ip = advertiseIP()
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Stop())
		}
	}()
	if err := os.WriteFile(f.Kubeconfig, env.KubeConfig, 0o600); err != nil {
		return f, fmt.Errorf("writing the kubeconfig: %w", err)
	}
	scheme := k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return f, err
	}
	if err := v1.AddToScheme(scheme); err != nil {
		return f, err
	}
	if f.Client, err = client.New(cfg, client.Options{Scheme: scheme}); err != nil {
		return f, err
	}
	if err := f.install(ctx); err != nil {
		return f, err
	}
	if opts.OwnAddresses {
		if err := f.shareAPort(); err != nil {
			return f, err
		}
	}
	digest, err := artifact.FileSHA256(filepath.Join(opts.Bin, "synapse-ane-worker"))
	if err != nil {
		return f, fmt.Errorf("the worker binary (run 'make build'): %w", err)
	}
	f.WorkerDigest = v1.Sha256Digest(digest)
	if err := f.startController(ctx); err != nil {
		return f, err
	}
	for _, m := range opts.Macs {
		if err := f.StartMac(ctx, m); err != nil {
			return f, err
		}
	}
	return f, nil
}

// Stop stops the Macs, the controller and the control plane, in that order.
func (f *Fleet) Stop() error {
	f.mu.Lock()
	names := make([]string, 0, len(f.agents))
	for n := range f.agents {
		names = append(names, n)
	}
	f.mu.Unlock()
	slices.Sort(names)
	var errs []error
	for _, n := range names {
		errs = append(errs, f.StopMac(n))
	}
	if f.controller != nil {
		errs = append(errs, f.controller.stop(15*time.Second))
	}
	errs = append(errs, f.env.Stop())
	return errors.Join(errs...)
}

func (f *Fleet) startController(ctx context.Context) error {
	kubeconfig, err := f.controllerKubeconfig(ctx)
	if err != nil {
		return err
	}
	probe, metrics := freePort(), freePort()
	f.metrics = metrics
	// A leader that cannot renew its Lease for the renew deadline exits, and here nothing
	// restarts it as a Deployment would: the deadline outlasts the API server's restarts (and
	// the RBAC caches it fills again before it authorizes anyone) on a loaded machine.
	args := []string{"--kubeconfig", kubeconfig, "--leader-elect", "--leader-election-namespace", ControllerNamespace,
		"--leader-elect-lease-duration", "3m", "--leader-elect-renew-deadline", "2m",
		"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(probe), "--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(metrics)}
	switch {
	case f.opts.OwnAddresses:
		// The documentation range the Macs' advertised addresses are drawn from.
		args = append(args, "--endpoint-cidrs", advertisedRange.String())
	case f.ip != "127.0.0.1":
		// The Macs advertise this machine's address: it is the one address they may publish.
		args = append(args, "--endpoint-cidrs", f.ip+"/32")
	}
	if f.opts.NodeGracePeriod > 0 {
		args = append(args, "--node-grace-period", f.opts.NodeGracePeriod.String())
	}
	if f.opts.NodeEvictionTimeout > 0 {
		args = append(args, "--node-eviction-timeout", f.opts.NodeEvictionTimeout.String())
	}
	f.controller, err = startProcess("controller", filepath.Join(f.opts.Bin, "synapse-controller"), args, nil, f.opts.Out)
	if err != nil {
		return err
	}
	return waitHealthy(ctx, "http://127.0.0.1:"+strconv.Itoa(probe)+"/readyz", f.controller,
		func(context.Context) (*http.Client, error) { return http.DefaultClient, nil })
}

// StartMac starts a simulated Mac's agent and waits until its API answers. A Mac started
// again after StopMac keeps its addresses, its port and its state (its aned cache).
func (f *Fleet) StartMac(ctx context.Context, m Mac) error {
	f.mu.Lock()
	port, err := f.portOf(m)
	if err != nil {
		f.mu.Unlock()
		return err
	}
	f.ports[m.Name] = port
	listen, advertise := net.JoinHostPort(f.loopbackOf(m.Name), strconv.Itoa(port)), f.advertisedOf(m.Name)
	f.mu.Unlock()
	state := f.StateDir(m.Name)
	kubeconfig, err := f.join(ctx, m.Name)
	if err != nil {
		return err
	}
	args := []string{"--kubeconfig", kubeconfig, "--node-name", m.Name, "--backend", "sim", "--macos-build", m.MacOSBuild,
		"--chip", "Apple M4 (sim)", "--state-dir", state, "--worker-binary", filepath.Join(f.opts.Bin, "synapse-ane-worker"),
		"--listen", listen, "--advertise-address", advertise,
		"--sim-scale", strconv.FormatFloat(f.opts.SimScale, 'g', -1, 64)}
	if m.Budget > 0 {
		args = append(args, "--budget", strconv.Itoa(m.Budget))
	}
	if f.opts.AnonymousAPI {
		args = append(args, "--auth", "none")
	}
	if f.opts.PlainHTTP {
		args = append(args, "--tls", "none")
	}
	if f.opts.LeaseDuration > 0 {
		args = append(args, "--lease-duration", f.opts.LeaseDuration.String())
	}
	if f.opts.StatusInterval > 0 {
		args = append(args, "--status-interval", f.opts.StatusInterval.String())
	}
	if f.opts.PlacementProgressInterval > 0 {
		args = append(args, "--placement-progress-interval", f.opts.PlacementProgressInterval.String())
	}
	p, err := startProcess(m.Name, filepath.Join(f.opts.Bin, "synapse-agent"), args, m.Env, f.opts.Out)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.agents[m.Name] = p
	f.mu.Unlock()
	// The API answers once the Mac has its serving certificate, which the controller issues once
	// its MacNode reports its address.
	return waitHealthy(ctx, f.URL(m.Name)+"/readyz", p, func(ctx context.Context) (*http.Client, error) { return f.HTTPClient(ctx, m.Name) })
}

// StopMac stops a Mac's agent (SIGTERM: it retires its lanes and exits).
func (f *Fleet) StopMac(name string) error {
	f.mu.Lock()
	p := f.agents[name]
	delete(f.agents, name)
	f.mu.Unlock()
	if p == nil {
		return nil
	}
	return p.stop(30 * time.Second)
}

// KillMac kills a Mac's agent at once, as a crash or a power cut would; its workers see their
// stdin close and exit.
func (f *Fleet) KillMac(name string) {
	f.mu.Lock()
	p := f.agents[name]
	delete(f.agents, name)
	f.mu.Unlock()
	if p != nil {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// SimRungs are the rungs of every sim artifact the fleet installs: the ladders of the lanes are
// drawn from them.
var SimRungs = []int{128, 256, 512, 1024, 2048, 4096, 8192}

// InstallArtifact builds the sim artifact of an identity on every Mac that runs its macOS
// build, where that Mac's agent looks for it, as an operator installs artifacts on a Mac.
// Its outputs follow from the identity's name.
func (f *Fleet) InstallArtifact(id *v1.CertifiedIdentity) error {
	for _, m := range f.opts.Macs {
		if m.MacOSBuild != string(id.Spec.MacOSBuild) {
			continue
		}
		dir, err := artifact.Path(f.ArtifactRoot(m.Name), id.Spec.Model.Name, id.Spec.Model.Revision, id.Spec.ConversionPolicy.Name)
		if err != nil {
			return err
		}
		if _, err := os.Stat(dir); err == nil {
			continue // installed by another identity of the same model and conversion
		}
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return err
		}
		if _, err := artifact.BuildSim(dir, artifact.SimSpec{Model: id.Spec.Model.Name, Revision: id.Spec.Model.Revision,
			CheckpointDigest: string(id.Spec.Model.CheckpointDigest),
			ConversionPolicy: artifact.ConversionPolicy{Name: id.Spec.ConversionPolicy.Name, Digest: string(id.Spec.ConversionPolicy.Digest)},
			ConverterVersion: artifact.SimConverterVersion, Platform: artifact.Platform{ChipFamily: "M4", MacOSBuild: m.MacOSBuild},
			Rungs: SimRungs, Layers: int(id.Spec.Model.Layers), Dimensions: int(id.Spec.Model.EmbeddingDimensions), Seed: id.Name}); err != nil {
			return fmt.Errorf("building the artifact of %s on %s: %w", id.Name, m.Name, err)
		}
	}
	return nil
}

// ArtifactRoot is where a Mac's agent looks for artifacts.
func (f *Fleet) ArtifactRoot(mac string) string {
	return filepath.Join(f.StateDir(mac), "artifacts")
}

// PID is the process id of a Mac's running agent, 0 if it is not running.
func (f *Fleet) PID(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.agents[name]; p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// portOf is the port a Mac is to listen on (f.mu held): the fleet's shared one, or the Mac's
// own: its configured Port, else the one it had before a stop, else a free one.
func (f *Fleet) portOf(m Mac) (int, error) {
	if f.opts.OwnAddresses {
		if err := f.number(m.Name); err != nil {
			return 0, err
		}
		if m.Port != 0 && m.Port != f.shared {
			return 0, fmt.Errorf("Mac %s: port %d, but the fleet's Macs share port %d (OwnAddresses)", m.Name, m.Port, f.shared)
		}
		return f.shared, nil
	}
	if m.Port != 0 {
		return m.Port, nil
	}
	return stablePort(f.ports[m.Name], func(p int) bool {
		for name, q := range f.ports {
			if q == p && name != m.Name {
				return true
			}
		}
		return false
	}, "127.0.0.1"), nil
}

// URL is the base URL of a Mac's HTTP API on the loopback, the one address it listens on (its
// own under OwnAddresses, else 127.0.0.1): tests and benchmarks send traffic there only, while
// the Mac advertises another address (AdvertisedAddress), on which nothing listens to be
// called, from this machine or another. It is HTTPS (call it with HTTPClient) unless the fleet
// serves PlainHTTP.
func (f *Fleet) URL(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	scheme := "https://"
	if f.opts.PlainHTTP {
		scheme = "http://"
	}
	return scheme + net.JoinHostPort(f.loopbackOf(name), strconv.Itoa(f.ports[name]))
}

// RestartAPIServer kills the kube-apiserver, as a crash would, and starts it again on the same
// port with the same certificates; etcd keeps running, so nothing stored is lost. down runs
// while it is away. (A graceful stop would wait a minute for the clients' watches to drain.)
func (f *Fleet) RestartAPIServer(down func()) error {
	s := f.env.ControlPlane.GetAPIServer()
	pid, err := pidWithArg("--cert-dir=" + s.CertDir)
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	if err := s.Stop(); err != nil {
		return err
	}
	if down != nil {
		down()
	}
	return s.Start()
}

// pidWithArg finds the process one of whose arguments is arg (Linux: /proc).
func pidWithArg(arg string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process has the argument %s", arg)
}

// process is a child process whose exit one goroutine waits for.
type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited; err is set then
	err  error
}

func startProcess(name, path string, args, env []string, out io.Writer) (*process, error) {
	cmd := exec.Command(path, args...)
	w := prefixed(out, name)
	cmd.Stdout, cmd.Stderr = w, w
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so a Ctrl-C in the terminal reaches the fleet's runner alone,
	// which stops everything in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (run 'make build'): %w", path, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitHealthy polls url with the client httpClient returns until it answers 200, the process
// exits, or a minute passes.
func waitHealthy(ctx context.Context, url string, p *process, httpClient func(context.Context) (*http.Client, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.done:
			return false, fmt.Errorf("%s exited (%v); its log is above", p.name, p.err)
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		c, err := httpClient(ctx)
		if err != nil {
			return false, nil // no CA bundle published yet
		}
		resp, err := c.Do(req)
		if err != nil {
			return false, nil // not listening yet
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w", p.name, err)
	}
	return nil
}

// stop asks the process to terminate and kills it after grace.
func (p *process) stop(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s and was killed", p.name, grace)
	}
	var exit *exec.ExitError
	if errors.As(p.err, &exit) && !exit.Exited() {
		return nil // ended by our signal
	}
	return p.err
}
