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

package scale

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/agent"
	"github.com/ck-synapse/synapse-fleet/test/scale/hollow"
)

// agentGroups are the groups a Mac's identity (a ServiceAccount of synapse-nodes) carries;
// config/agent binds the agents' RBAC to the last. The hollow Macs present certificates with a
// node identity's name and groups rather than 1000 TokenRequest tokens.
var agentGroups = []string{"system:serviceaccounts", "system:serviceaccounts:synapse-nodes"}

// fleetScenario sizes and times a run.
type fleetScenario struct {
	Nodes, Lanes int
	SimScale     float64
	// LeaseDuration and StatusInterval are the agents'; Grace and Eviction the controller's
	// node grace period and eviction timeout.
	LeaseDuration, StatusInterval, Grace, Eviction time.Duration
	// EvictionRate is the controller's --node-eviction-rate (lost nodes a second whose
	// placements are forced away); zero keeps the controller's default.
	EvictionRate float64
	// Steady is how long the steady state is measured.
	Steady time.Duration
	// Storms runs the three storms after the rollout.
	Storms bool
	// Dir holds the run's state and logs; Profile, if set, is where CPU profiles are saved;
	// Report, if set, where the report is written as JSON.
	Dir, Profile, Report string
	// ProfileFor is how long the CPU profiles cover of the rollout, from the apply (30 s if
	// zero): a fleet that places for minutes is profiled over its whole placement.
	ProfileFor time.Duration
	// Progress receives a line per step.
	Progress io.Writer
}

// fleet is a running control plane, controller and hollow fleet.
type fleet struct {
	sc fleetScenario
	cp *controlPlane
	// apiServerRestarted: the API server's process is a new one, whose usage counts from its
	// start; the report keeps the first one's.
	apiServerRestarted bool
	// usagesTaken: the processes' usage is in the report (usages), of the first controller.
	usagesTaken bool
	ctrl        *controllerProcess
	audit       *auditLog
	macs        map[string]*hollow.Mac
	dead        map[string]bool // the Macs killed
	// bootSeconds is how long the fleet took to start, a wave at a time.
	bootSeconds float64
	specs       []hollow.Spec
	identities  []*v1.CertifiedIdentity
	lanes       []*v1.CatalogLane
	view        cache.Cache // the harness's own informers: what the report reads
	stopView    context.CancelFunc
	hollowLog   *lockedWriter
}

// macOS builds of the fleet: two fifths each of the first two, a fifth of the third.
var builds = []v1.MacOSBuild{"25B78", "25B78", "25C56", "25C56", "25D44"}

// models are the catalog's small models; their layers decide their charge.
var models = []struct {
	name   string
	layers int32
}{{"all-minilm-l6", 6}, {"bge-small-en", 12}}

func (f *fleet) logf(format string, args ...any) {
	fmt.Fprintf(f.sc.Progress, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05.000")}, args...)...)
}

// startFleet starts the control plane, applies the shipped RBAC, starts the controller under
// its own ServiceAccount with leader election on, and starts the hollow Macs, each under its
// own certificate in the agents' group; it returns once every Mac reports Ready.
func startFleet(ctx context.Context, sc fleetScenario) (f *fleet, err error) {
	f = &fleet{sc: sc, macs: map[string]*hollow.Mac{}, dead: map[string]bool{}}
	defer func() {
		if err != nil {
			f.stop()
		}
	}()
	ctrl.SetLogger(logr.Discard()) // the hollow agents' managers log through their own loggers
	if f.cp, err = startControlPlane(sc.Dir); err != nil {
		return f, err
	}
	f.audit = &auditLog{path: f.cp.audit}
	for _, ns := range []string{controllerNamespace} {
		if err := f.cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
			return f, err
		}
	}
	// config/agent makes the namespaces config/rbac binds in; config/policies checks every write
	// of a Mac's agent, as config/default installs them.
	for _, dir := range []string{"config/agent", "config/rbac", "config/apf", "config/policies"} {
		if err := applyKustomization(ctx, f.cp.Client, filepath.Join(repoRoot(), dir)); err != nil {
			return f, err
		}
	}
	bin, err := buildController(sc.Dir)
	if err != nil {
		return f, err
	}
	kubeconfig := filepath.Join(sc.Dir, "controller.kubeconfig")
	if err := controllerKubeconfig(ctx, f.cp, kubeconfig); err != nil {
		return f, err
	}
	memory, err := deployedMemoryLimit(filepath.Join(repoRoot(), "config/manager/manager.yaml"))
	if err != nil {
		return f, err
	}
	f.ctrl = newControllerProcess(bin, kubeconfig, filepath.Join(sc.Dir, "controller.log"), sc.Grace, sc.Eviction, sc.EvictionRate, memory)
	if err := f.ctrl.start(); err != nil {
		return f, err
	}
	if err := f.startView(ctx); err != nil {
		return f, err
	}

	digest := v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 17))
	artifacts := filepath.Join(sc.Dir, "artifacts")
	for _, b := range []v1.MacOSBuild{"25B78", "25C56", "25D44"} {
		for _, m := range models {
			id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: strings.ToLower(m.name + "-" + string(b))}, Spec: v1.CertifiedIdentitySpec{
				Worker: v1.WorkerIdentity{SigningIdentifier: hollow.SigningID, BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
				Model: v1.ModelIdentity{Name: m.name, Revision: "r1", Layers: m.layers, HiddenSize: 384, EmbeddingDimensions: 384,
					CheckpointDigest: v1.Sha256Digest(fmt.Sprintf("sha256:%064x", m.layers))},
				ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 1))},
				MacOSBuild:       b, VectorSpaceID: m.name + "/r1"}}
			if err := f.cp.Client.Create(ctx, id); err != nil {
				return f, err
			}
			if err := hollow.InstallArtifact(artifacts, id); err != nil {
				return f, err
			}
			f.identities = append(f.identities, id)
		}
	}

	logFile, err := os.Create(filepath.Join(sc.Dir, "hollow.log"))
	if err != nil {
		return f, err
	}
	f.hollowLog = &lockedWriter{w: bufio.NewWriterSize(logFile, 1<<20), f: logFile}
	klog.SetOutput(f.hollowLog) // client-go's own complaints, a thousand clients' worth
	klog.LogToStderr(false)
	cfg := hollow.Config{
		RestConfig: func(name string) (*rest.Config, error) {
			u, err := f.cp.env.AddUser(envtest.User{Name: "system:serviceaccount:synapse-nodes:synapse-node-" + name, Groups: agentGroups}, f.cp.Config)
			if err != nil {
				return nil, err
			}
			rc := u.Config()
			rc.QPS, rc.Burst = -1, 0 // as the agent's own configuration: the API server's fairness limits it
			return rc, nil
		},
		Scheme: f.cp.Scheme, ArtifactRoot: artifacts, BinaryDigest: digest,
		SimScale: sc.SimScale, LeaseDuration: sc.LeaseDuration, StatusInterval: sc.StatusInterval,
		PKIRoot: filepath.Join(sc.Dir, "pki"),
		Log:     funcr.New(func(prefix, args string) { fmt.Fprintln(f.hollowLog, prefix, args) }, funcr.Options{}),
	}
	for i := range sc.Nodes {
		spec := hollow.Spec{Name: fmt.Sprintf("mac-%04d", i), MacOSBuild: builds[i%len(builds)],
			Labels: map[string]string{"zone": fmt.Sprintf("z%d", i%4)}, Address: advertisedAddress(i)}
		if i%10 < 2 {
			spec.Budget = 60 // an older, smaller Mac
		}
		f.specs = append(f.specs, spec)
	}
	// The fleet boots a wave at a time, so setting it up does not measure a thousand TLS
	// handshakes at once; the API server restart storm measures them reconnecting together.
	f.logf("starting %d hollow Macs, %d at a time", sc.Nodes, bootWave)
	start := time.Now()
	for i, spec := range f.specs {
		m, err := hollow.Start(cfg, spec)
		if err != nil {
			return f, err
		}
		f.macs[spec.Name] = m
		if started := i + 1; started%bootWave == 0 || started == len(f.specs) {
			err := f.waitFor(ctx, "the Macs started so far to be Ready", 10*time.Minute, func() (bool, string) {
				ready, _ := f.macsReadyCount(nil)
				return ready >= started, fmt.Sprintf("%d of %d Macs Ready", ready, started)
			})
			if err != nil {
				return f, err
			}
		}
	}
	f.bootSeconds = time.Since(start).Seconds()
	f.logf("%d hollow Macs Ready in %.1fs", sc.Nodes, f.bootSeconds)
	return f, nil
}

// bootWave is how many hollow Macs start at once as the fleet boots.
const bootWave = 50

// startView starts the harness's informers on the admin credentials.
func (f *fleet) startView(ctx context.Context) error {
	view, err := cache.New(f.cp.Config, cache.Options{Scheme: f.cp.Scheme, ByObject: map[client.Object]cache.ByObject{
		&coordinationv1.Lease{}: {Namespaces: map[string]cache.Config{agent.LeaseNamespace: {}}}}})
	if err != nil {
		return err
	}
	for _, o := range []client.Object{&v1.CatalogLane{}, &v1.LanePlacement{}, &v1.MacNode{}, &coordinationv1.Lease{}, &discoveryv1.EndpointSlice{}} {
		if _, err := view.GetInformer(ctx, o); err != nil {
			return err
		}
	}
	vctx, cancel := context.WithCancel(ctx)
	f.view, f.stopView = view, cancel
	go func() { _ = view.Start(vctx) }()
	if !view.WaitForCacheSync(ctx) {
		return fmt.Errorf("the harness's informers did not sync")
	}
	return nil
}

func (f *fleet) stop() {
	// The Macs stop side by side, a few dozen at a time: one after another, a thousand Macs
	// that each take their 10 s bound (an API server that is gone) held a failed run for hours.
	var wg sync.WaitGroup
	slots := make(chan struct{}, 64)
	for _, m := range f.macs {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			_ = m.Kill(10 * time.Second)
		})
	}
	wg.Wait()
	if f.stopView != nil {
		f.stopView()
	}
	if f.ctrl != nil {
		_ = f.ctrl.stop()
	}
	if f.cp != nil {
		_ = f.cp.Stop()
	}
	if f.hollowLog != nil {
		f.hollowLog.close()
	}
}

// macsReady reports whether every Mac not in dead reports Ready.
func (f *fleet) macsReady(dead map[string]bool) (bool, string) {
	ready, err := f.macsReadyCount(dead)
	if err != nil {
		return false, err.Error()
	}
	want := len(f.specs) - len(dead)
	return ready == want, fmt.Sprintf("%d of %d Macs Ready", ready, want)
}

// macsReadyCount counts the Macs not in dead that report Ready with their budget.
func (f *fleet) macsReadyCount(dead map[string]bool) (int, error) {
	var nodes v1.MacNodeList
	if err := f.view.List(context.Background(), &nodes, client.UnsafeDisableDeepCopy); err != nil {
		return 0, err
	}
	ready := 0
	for i := range nodes.Items {
		n := &nodes.Items[i]
		if !dead[n.Name] && meta.IsStatusConditionTrue(n.Status.Conditions, v1.ConditionReady) && n.Status.Capacity.LayerExecutables > 0 {
			ready++
		}
	}
	return ready, nil
}

// agentRestarts counts the times the live Macs' agents exited and were started again.
func (f *fleet) agentRestarts() int {
	n := 0
	for _, m := range f.macs {
		k, _ := m.Restarts()
		n += k
	}
	return n
}

// leasesRenewedSince reports whether every Mac not in dead has renewed its Lease since t.
func (f *fleet) leasesRenewedSince(t time.Time, dead map[string]bool) (bool, string) {
	var leases coordinationv1.LeaseList
	if err := f.view.List(context.Background(), &leases, client.InNamespace(agent.LeaseNamespace), client.UnsafeDisableDeepCopy); err != nil {
		return false, err.Error()
	}
	renewed := 0
	for _, l := range leases.Items {
		if !dead[l.Name] && l.Spec.RenewTime != nil && l.Spec.RenewTime.After(t) {
			renewed++
		}
	}
	want := len(f.specs) - len(dead)
	return renewed == want, fmt.Sprintf("%d of %d Macs have renewed their Lease", renewed, want)
}

// waitFor polls cond every 250 ms until it holds, saying how far it is every 10 s.
func (f *fleet) waitFor(ctx context.Context, what string, timeout time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	lastSaid := time.Now()
	for {
		ok, how := cond()
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for %s: not within %s: %s", what, timeout, how)
		}
		if time.Since(lastSaid) > 10*time.Second {
			_, macs := f.macsReady(f.dead)
			f.logf("waiting for %s: %s (%s)", what, how, macs)
			lastSaid = time.Now()
		}
		if err := f.ctrl.exited(); err != nil {
			// As its Deployment would, start it again (it exits when it loses its leader Lease).
			f.logf("%v; starting it again", err)
			f.ctrl.Restarts++
			if err := f.ctrl.start(); err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// applyKustomization creates every object of the files a kustomization lists.
func applyKustomization(ctx context.Context, kube client.Client, dir string) error {
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		return err
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := sigsyaml.Unmarshal(data, &k); err != nil {
		return err
	}
	for _, r := range k.Resources {
		data, err := os.ReadFile(filepath.Join(dir, r))
		if err != nil {
			return err
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			u := &unstructured.Unstructured{}
			if err := dec.Decode(&u.Object); err == io.EOF {
				break
			} else if err != nil {
				return fmt.Errorf("%s/%s: %w", dir, r, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			if err := kube.Create(ctx, u); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("%s/%s: %w", dir, r, err)
			}
		}
	}
	return nil
}

// lockedWriter is a buffered log the hollow agents share.
type lockedWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
	f  *os.File
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *lockedWriter) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	_ = l.w.Flush()
	_ = l.f.Close()
}

// advertisedRange is where the hollow Macs' addresses come from: 198.18.0.0/15, set aside for
// benchmarking network devices (RFC 2544, section C.2.2), so no address of it is anyone's and
// nothing is ever sent to one. The controller publishes it (--endpoint-cidrs) and its signer
// certifies it, as it does a real fleet's network.
var advertisedRange = netip.MustParsePrefix("198.18.0.0/15")

// advertisedAddress is the i-th Mac's address in advertisedRange: 198.18.0.1 to 198.18.0.254,
// then 198.18.1.1, and so on (a .0 or .255 is skipped for clarity, not need).
func advertisedAddress(i int) string {
	a, n := advertisedRange.Addr().As4(), i/254
	a[1], a[2], a[3] = a[1]+byte(n/256), byte(n%256), byte(i%254+1)
	return netip.AddrFrom4(a).String()
}
