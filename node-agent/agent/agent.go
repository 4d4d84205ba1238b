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

// Package agent is the node agent's cluster side and its wiring: it registers the node's
// MacNode and renews its Lease, watches the LanePlacements bound to the node and loads each
// lane (start its worker, self-check, prewarm, serve), reports their status, retires lanes
// before their placements go, and serves the HTTP API over the lanes it holds.
//
// The lanes keep serving whatever the API server does: the supervisor, the workers and the
// HTTP API do not depend on it, and status written while it is unreachable is caught up when
// it returns.
package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
	"github.com/ck-synapse/synapse-fleet/node-agent/logwarn"
	"github.com/ck-synapse/synapse-fleet/node-agent/serving"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// The agent asks the fleet's signer for its serving certificate through the CSR API (the
// node-restriction policies allow it only that signer; the controller approves only the node's
// own name and addresses).
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=create;get;list;watch

// LeaseNamespace holds the node Leases (the controller's macnode lifecycle watches them).
const LeaseNamespace = "synapse-node-lease"

// Config configures an agent.
type Config struct {
	// NodeName is the MacNode this agent runs.
	NodeName string
	// Labels are set on the MacNode when the agent creates it.
	Labels map[string]string
	// Platform and Worker describe the machine and the worker binary it runs.
	Platform v1.Platform
	Worker   v1.NodeWorker
	// Budget is the machine's layer executables (supervisor.DefaultBudget if zero).
	Budget int
	// Address is the address the node advertises (its MacNode's InternalIP, which the lanes'
	// EndpointSlices list); Listen are the addresses the HTTP API listens on, one listener each.
	// A later address with port 0 takes the first one's port, so one serving port covers them
	// all: a node may advertise its interface address while local callers use the loopback.
	Address string
	Listen  []string
	// AdminSocket is the Unix socket the admin API (pause, resume) is served on, only to the
	// agent's own user; "" serves it nowhere. It is never served on Listen.
	AdminSocket string
	// Host starts the workers (a workerhost.Host; the scale harness's hollow Macs give theirs a
	// Launch that runs each worker in process); LockPath is the machine's lane lock.
	Host     supervisor.Spawner
	LockPath string
	// ArtifactRoot holds the model artifacts (artifact.Path); nothing loads unless its artifact
	// there verifies. ChipFamily and ConverterVersion complete this machine's profile.
	ArtifactRoot, ChipFamily, ConverterVersion string
	// LeaseDuration is the Lease's stated duration; it is renewed every third of it.
	LeaseDuration time.Duration
	// StatusInterval is the least time between two status writes of one object.
	StatusInterval time.Duration
	// PlacementProgressInterval is the least time between two writes of a placement's status
	// that only report progress (0: DefaultPlacementProgressInterval).
	PlacementProgressInterval time.Duration
	// CertifyObservation, if set, turns certify observation on: every StatusInterval the agent
	// records the workers' inventories and the independent admission count there, as JSON,
	// for synapse-certify. Ordinary serving leaves it empty and records nothing.
	CertifyObservation string
	// DrainTimeout bounds how long a stopping agent waits, its server still answering, for
	// the lanes' endpoints to stop listing its placements as ready (10 s if zero).
	DrainTimeout time.Duration
	// Auth lets calls into the HTTP API (apiauth.Delegating; apiauth.Anonymous only when asked
	// for). Without it no call but the probes is let in. Its metrics, if it has any, are served
	// with the agent's.
	Auth httpapi.Auth
	// TLS is where the HTTP API's serving certificate comes from (servingcert): the API is
	// served over TLS only, and only once the first certificate is there. nil serves plain
	// HTTP, which only an explicit --tls=none asks for (a development fleet).
	TLS   ServingCertificate
	Clock clock.WithTicker
	Log   logr.Logger
}

// ServingCertificate is the HTTP API's TLS serving certificate (servingcert.Auto, servingcert.Files).
type ServingCertificate interface {
	// Obtain starts obtaining the certificate (and keeping it fresh until ctx ends) and returns,
	// within a bounded wait, once the first one is there. reported says whether the node's
	// MacNode reports the agent's address yet: a signer approves only addresses it reports.
	Obtain(ctx context.Context, reported func() bool) error
	// GetCertificate is a TLS server's: every new connection gets the current certificate.
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ServeLanes says which lanes are placed on the node: the certificate names their
	// Services, so that a call through a lane's Service verifies.
	ServeLanes(lanes []types.NamespacedName)
	// NamesLane says whether the current certificate names the lane's Service: a placement of
	// the lane is Ready only once it does.
	NamesLane(lane types.NamespacedName) bool
	// OnIssued has f called after each certificate is issued.
	OnIssued(f func())
}

// Agent is one node's agent.
type Agent struct {
	cfg        Config
	sup        *supervisor.Supervisor
	verifier   artifact.Verifier
	serve      *serving.Server
	api        *httpapi.Server
	registry   *prometheus.Registry
	kube       client.Client
	servingErr chan error
	// awaitingCert: the API's listeners are open but serve nothing until the first serving
	// certificate comes; no placement of the node is Ready meanwhile.
	awaitingCert atomic.Bool
	// lease is the node's Lease as the heartbeat last wrote it (see renew).
	lease *coordinationv1.Lease

	mu     sync.Mutex
	lanes  map[types.NamespacedName]*lane // by placement
	paused bool                           // paused by the admin API
	// stopping: the agent is shutting down; its placements say Terminating.
	stopping bool
	node     *v1.MacNode // as last read
	port     int32       // the HTTP API's port
	kick     chan struct{}
	// resync asks the reconciler to look at every placement (pause and resume).
	resync chan event.GenericEvent
	// probeKick wakes the placement prober; probeRatio exports its measurements.
	probeKick  chan struct{}
	probeRatio *prometheus.GaugeVec

	// warnings are the lanes' worker warnings, by lane key, under their own lock (the workers'
	// stderr readers take it, and must never wait on mu); workerWarnings counts them.
	warnMu         sync.Mutex
	warnings       map[string]*warningLog
	workerWarnings *prometheus.CounterVec
}

// New returns an agent; Run starts it.
func New(cfg Config) *Agent {
	if cfg.LeaseDuration == 0 {
		cfg.LeaseDuration = 30 * time.Second
	}
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = time.Second
	}
	if cfg.PlacementProgressInterval == 0 {
		cfg.PlacementProgressInterval = DefaultPlacementProgressInterval
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.Budget == 0 {
		cfg.Budget = supervisor.DefaultBudget
	}
	a := &Agent{cfg: cfg, verifier: artifact.Verifier{Clock: cfg.Clock}, lanes: map[types.NamespacedName]*lane{}, kick: make(chan struct{}, 1), resync: make(chan event.GenericEvent, 1), probeKick: make(chan struct{}, 1), registry: prometheus.NewRegistry()}
	a.sup = supervisor.New(supervisor.Config{Clock: cfg.Clock, Spawner: cfg.Host, Log: cfg.Log.WithName("supervisor"), Budget: cfg.Budget, LockPath: cfg.LockPath,
		Warn: logwarn.Func(cfg.Log.WithName("supervisor")), CertifyObservation: cfg.CertifyObservation != "", OnChange: a.wake})
	a.serve = serving.New(serving.Supervised(a.sup), cfg.Clock)
	a.api = httpapi.New(httpapi.Config{Node: cfg.NodeName, Catalog: a, Runner: a.serve, Clock: cfg.Clock, Registry: a.registry,
		Auth: cfg.Auth, Log: cfg.Log.WithName("api")})
	for _, m := range []any{cfg.Auth, cfg.TLS} {
		if c, ok := m.(prometheus.Collector); ok {
			a.registry.MustRegister(c)
		}
	}
	a.probeRatio = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "synapse_agent_placement_probe_ratio",
		Help: "Device over CPU-reference time of the runtime placement probe, by lane, rung and source (measured, or simulated by the sim backend: configured, not measured); above 0.8 the lane fails."},
		[]string{"lane", "rung", "source"})
	a.warnings = map[string]*warningLog{}
	a.workerWarnings = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "synapse_agent_worker_warnings_total",
		Help: "Warning lines the lane's workers wrote on stderr (every line but their own progress lines)."}, []string{"lane"})
	a.registry.MustRegister(newCollector(a), a.probeRatio, a.workerWarnings)
	// A host that passes on its workers' stderr lines (workerhost.Host does) feeds the warnings.
	if h, ok := cfg.Host.(interface {
		OnStderr(func(lane string, gen int64, line string))
	}); ok {
		h.OnStderr(a.workerLine)
	}
	return a
}

// Handler is the HTTP API.
func (a *Agent) Handler() http.Handler { return a.api }

// Run runs the agent until ctx ends: the supervisor, the HTTP API, the node's registration
// and Lease, the placement reconciler and the status writer. On the way out it retires every
// lane, so no worker outlives the agent.
func (a *Agent) Run(ctx context.Context, restConfig *rest.Config, scheme *runtime.Scheme) error {
	lns, port, err := listenAll(a.cfg.Listen)
	if err != nil {
		return err
	}
	var adminLn net.Listener
	if a.cfg.AdminSocket != "" {
		if adminLn, err = listenAdmin(a.cfg.AdminSocket); err != nil {
			return errors.Join(err, closeAll(lns))
		}
	}

	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only this node's placements and its own MacNode, as NodeRestriction would allow.
			&v1.LanePlacement{}: {Label: labels.SelectorFromSet(labels.Set{v1.LabelNode: a.cfg.NodeName})},
			&v1.MacNode{}:       {Field: fields.OneTermEqualSelector("metadata.name", a.cfg.NodeName)},
		}},
		// Read from the API server, never cached: the Lease, and the identities, which the agent
		// reads once per lane rather than watch (placementIdentity).
		Client: client.Options{Cache: &client.CacheOptions{DisableFor: []client.Object{&coordinationv1.Lease{}, &v1.CertifiedIdentity{}}}},
	})
	if err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	a.kube = mgr.GetClient()
	if err := a.register(ctx, mgr.GetAPIReader(), port); err != nil {
		return err
	}
	if err := (&reconciler{a: a}).setup(mgr); err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8) // one per goroutine below and one for the listeners, with room to spare
	goRun := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errs <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	supCtx, stopSup := context.WithCancel(context.Background())
	supDone := make(chan struct{})
	go func() {
		defer close(supDone)
		// Stopped for any reason but the agent's own shutdown, the supervisor answers every
		// request engine_crashed from then on; that is said here too, not only in answers.
		if err := a.sup.Run(supCtx); supCtx.Err() == nil {
			a.cfg.Log.Error(err, "the residency supervisor stopped: every request is answered engine_crashed until the agent restarts")
		}
	}()

	limits := httpapi.DefaultServerLimits()
	srv := httpapi.NewHTTPServer(a.api, limits)
	apiSrv := newAPIServer(srv, lns, limits, a.cfg.TLS, func(err error) {
		select {
		case errs <- err:
		default: // another listener's failure is already stopping the agent
		}
		cancel()
	})
	if a.cfg.TLS == nil {
		apiSrv.serve()
	} else {
		a.awaitingCert.Store(true)
		// The listeners are open (the MacNode reports their port) but answer nothing until the
		// certificate is there: a caller's connection waits in the backlog rather than failing
		// its handshake.
		// A certificate that names a lane's Service may make its placement Ready.
		a.cfg.TLS.OnIssued(a.wake)
		goRun("serving certificate", func(ctx context.Context) error {
			if err := a.cfg.TLS.Obtain(ctx, a.reportsAddress); err != nil {
				return err
			}
			apiSrv.serve()
			a.awaitingCert.Store(false)
			return nil
		})
	}
	// The admin API, on its own server: never on the API's listeners.
	adminSrv := &http.Server{Handler: httpapi.NewAdmin(a, a.cfg.Log.WithName("admin")), ReadHeaderTimeout: 10 * time.Second}
	if adminLn != nil {
		go func() {
			if err := adminSrv.Serve(adminLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				a.cfg.Log.Error(err, "the admin socket stopped serving", "path", a.cfg.AdminSocket)
			}
		}()
	}
	// The manager (its cache and client) outlives ctx until the placements are drained.
	mgrCtx, stopMgr := context.WithCancel(context.Background())
	defer stopMgr()
	mgrDone := make(chan struct{})
	go func() {
		defer close(mgrDone)
		if err := mgr.Start(mgrCtx); err != nil && mgrCtx.Err() == nil {
			errs <- fmt.Errorf("manager: %w", err)
			cancel()
		}
	}()
	goRun("lease", a.heartbeat)
	goRun("status", a.writeStatus)
	goRun("probe", a.probeLoop)
	goRun("certify", a.recordObservations)
	a.cfg.Log.Info("agent running", "node", a.cfg.NodeName, "listen", addrsOf(lns), "address", a.cfg.Address)

	<-ctx.Done()
	wg.Wait()
	shutdown, done := context.WithTimeout(context.Background(), 30*time.Second)
	defer done()
	// Say the placements are terminating and wait, still answering, until the lanes' endpoints
	// no longer send calls here; only then close the server.
	a.drain(shutdown, mgr.GetAPIReader())
	stopMgr()
	<-mgrDone
	_ = apiSrv.shutdown(shutdown)
	_ = adminSrv.Shutdown(shutdown)
	a.retireAll(shutdown)
	a.sayStopped(shutdown)
	stopSup()
	<-supDone
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// listenAll opens one listener per address, in order; an address after the first whose port is
// 0 takes the first listener's port. It returns the listeners and that port; on error none is
// left open.
func listenAll(addrs []string) ([]net.Listener, int, error) {
	if len(addrs) == 0 {
		return nil, 0, errors.New("no listen address")
	}
	var lns []net.Listener
	port := 0
	for _, addr := range addrs {
		host, p, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, 0, errors.Join(fmt.Errorf("listen address %q: %w", addr, err), closeAll(lns))
		}
		if port != 0 && (p == "0" || p == "") {
			addr = net.JoinHostPort(host, strconv.Itoa(port))
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, 0, errors.Join(fmt.Errorf("listening on %s: %w", addr, err), closeAll(lns))
		}
		if port == 0 {
			port = ln.Addr().(*net.TCPAddr).Port
		}
		lns = append(lns, ln)
	}
	return lns, port, nil
}

func closeAll(lns []net.Listener) error {
	var errs []error
	for _, ln := range lns {
		errs = append(errs, ln.Close())
	}
	return errors.Join(errs...)
}

func addrsOf(lns []net.Listener) []string {
	out := make([]string, len(lns))
	for i, ln := range lns {
		out[i] = ln.Addr().String()
	}
	return out
}

// retireAll unloads every lane: their workers exit before the agent does.
func (a *Agent) retireAll(ctx context.Context) {
	for _, key := range a.sup.Lanes() {
		a.unloadLane(ctx, key)
	}
}

// unloadLane takes a lane out of serving and retires it, within ctx: new calls are refused at
// once; the supervisor answers the calls that wait for an admission lane_retired and drains the
// exchanges in flight; then the calls still finishing are waited for. Nothing waits past ctx,
// and no call waits for an admission that may take minutes.
func (a *Agent) unloadLane(ctx context.Context, key string) {
	a.serve.StopLane(key)
	if err := a.sup.Retire(ctx, key); err != nil {
		a.cfg.Log.Error(err, "retiring a lane", "lane", key)
	}
	if err := a.serve.RemoveLane(ctx, key); err != nil {
		a.cfg.Log.Error(err, "taking a lane out of serving", "lane", key)
	}
}

// sayStopped marks every placement not Ready on the way out, so clients stop being sent here
// before the node's Lease runs out. It is best effort: an unreachable API server is not waited
// for.
func (a *Agent) sayStopped(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for _, key := range a.placementKeys() {
		a.mu.Lock()
		l := a.lanes[key]
		if l != nil && l.state != laneRetiring {
			l.state = laneStopped
		}
		a.mu.Unlock()
		if _, err := a.writePlacementStatus(ctx, key, true); err != nil {
			a.cfg.Log.Info("could not mark a placement stopped", "placement", key.String(), "error", err.Error())
		}
	}
}

// wake asks the status writer and the prober for a pass soon.
func (a *Agent) wake() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
	select {
	case a.probeKick <- struct{}{}:
	default:
	}
}
