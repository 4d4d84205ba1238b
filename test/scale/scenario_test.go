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
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

// namespaces the lanes are spread over, as teams would have them.
const namespaces = 10

// laneSpecs makes the run's lanes: identities in proportion to the Macs of each build, both
// models, a tenth with two replicas, a quarter restricted to a zone that has Macs of their
// build.
func (f *fleet) laneSpecs() []*v1.CatalogLane {
	zonesOf := map[v1.MacOSBuild][]string{}
	for _, s := range f.specs {
		if z := s.Labels["zone"]; !slices.Contains(zonesOf[s.MacOSBuild], z) {
			zonesOf[s.MacOSBuild] = append(zonesOf[s.MacOSBuild], z)
		}
	}
	var out []*v1.CatalogLane
	for i := range f.sc.Lanes {
		build := builds[i%len(builds)]
		m := models[(i/len(builds))%len(models)]
		id := fmt.Sprintf("%s-%s", m.name, build)
		l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lane-%05d", i), Namespace: fmt.Sprintf("team-%d", i%namespaces)},
			Spec: v1.CatalogLaneSpec{Model: m.name, Task: v1.TaskEmbed, Device: v1.DeviceANE,
				IdentityRef: v1.LocalObjectReference{Name: strings.ToLower(id)}, Rungs: []v1.Rung{128, 256, 512}, Replicas: 1,
				AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		if i%10 == 9 {
			l.Spec.Replicas = 2
		}
		if zs := zonesOf[build]; i%4 == 0 && len(zs) > 0 && l.Spec.Replicas == 1 {
			l.Spec.NodeSelector = map[string]string{"zone": zs[(i/4)%len(zs)]}
		}
		out = append(out, l)
	}
	return out
}

// applyLanes creates the lanes at once, from 32 clients in parallel, as a large apply would.
func (f *fleet) applyLanes(ctx context.Context) error {
	for i := range namespaces {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("team-%d", i)}}
		if err := f.cp.Client.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	f.lanes = f.laneSpecs()
	work := make(chan *v1.CatalogLane)
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for l := range work {
				if err := f.cp.Client.Create(ctx, l.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
					failed.CompareAndSwap(nil, &err)
				}
			}
		}()
	}
	for _, l := range f.lanes {
		work <- l
	}
	close(work)
	wg.Wait()
	if err := failed.Load(); err != nil {
		return *err
	}
	return nil
}

// state is what the harness's informers show of the fleet's placements.
type state struct {
	placements []v1.LanePlacement // live ones
	lanes      map[string]*v1.CatalogLane
	nodes      map[string]*v1.MacNode
	// endpoints counts, per lane ("namespace/name"), the ready endpoints its EndpointSlices list.
	endpoints map[string]int
}

func (f *fleet) state() (*state, error) {
	ctx := context.Background()
	var ps v1.LanePlacementList
	if err := f.view.List(ctx, &ps, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var ls v1.CatalogLaneList
	if err := f.view.List(ctx, &ls, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var ns v1.MacNodeList
	if err := f.view.List(ctx, &ns, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	var eps discoveryv1.EndpointSliceList
	if err := f.view.List(ctx, &eps, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	st := &state{lanes: map[string]*v1.CatalogLane{}, nodes: map[string]*v1.MacNode{}, endpoints: map[string]int{}}
	for _, sl := range eps.Items {
		lane := sl.Labels[discoveryv1.LabelServiceName]
		if sl.Labels[discoveryv1.LabelManagedBy] != endpoints.ManagedBy || lane == "" {
			continue
		}
		for _, e := range sl.Endpoints {
			if e.Conditions.Ready != nil && *e.Conditions.Ready {
				st.endpoints[sl.Namespace+"/"+lane]++
			}
		}
	}
	for _, p := range ps.Items {
		if p.DeletionTimestamp.IsZero() {
			st.placements = append(st.placements, p)
		}
	}
	for i := range ls.Items {
		st.lanes[ls.Items[i].Namespace+"/"+ls.Items[i].Name] = &ls.Items[i]
	}
	for i := range ns.Items {
		st.nodes[ns.Items[i].Name] = &ns.Items[i]
	}
	return st, nil
}

// placed reports whether every lane has its replicas placed on Macs not in dead.
func (st *state) placed(lanes []*v1.CatalogLane, dead map[string]bool) (bool, string) {
	per := map[string]int{}
	for _, p := range st.placements {
		if !dead[p.Spec.Node] {
			per[p.Namespace+"/"+p.Spec.Lane]++
		}
	}
	short := 0
	for _, l := range lanes {
		if per[l.Namespace+"/"+l.Name] < int(l.Spec.Replicas) {
			short++
		}
	}
	return short == 0, fmt.Sprintf("%d of %d lanes short of replicas", short, len(lanes))
}

// ready reports whether every lane says all its replicas are Ready.
func (st *state) ready(lanes []*v1.CatalogLane) (bool, string) {
	notReady := 0
	for _, l := range lanes {
		got := st.lanes[l.Namespace+"/"+l.Name]
		if got == nil || got.Status.ReadyReplicas != l.Spec.Replicas || !meta.IsStatusConditionTrue(got.Status.Conditions, v1.ConditionReady) {
			notReady++
		}
	}
	return notReady == 0, fmt.Sprintf("%d of %d lanes not Ready", notReady, len(lanes))
}

// serviced reports whether every lane is callable through its Service: the Service and its
// EndpointSlices are the controller's (ServiceReady), and the slices list a ready endpoint for
// each of the lane's Ready replicas. ServiceReady alone says the slices are written, not that
// they list the replicas that became Ready since.
func (st *state) serviced(lanes []*v1.CatalogLane) (bool, string) {
	missing, unlisted := 0, 0
	for _, l := range lanes {
		key := l.Namespace + "/" + l.Name
		got := st.lanes[key]
		switch {
		case got == nil || !meta.IsStatusConditionTrue(got.Status.Conditions, v1.LaneConditionServiceReady):
			missing++
		case st.endpoints[key] < int(got.Status.ReadyReplicas):
			// Callable through its Service only once its EndpointSlices list each Ready replica.
			unlisted++
		}
	}
	return missing+unlisted == 0, fmt.Sprintf("%d of %d lanes without their Service, %d whose EndpointSlices list fewer ready endpoints than their Ready replicas",
		missing, len(lanes), unlisted)
}

// spread is where the lanes went.
type spread struct {
	Placements int `json:"placements"`
	// LanesPerNodeMin and Max over the Macs alive.
	LanesPerNodeMin int `json:"lanesPerNodeMin"`
	LanesPerNodeMax int `json:"lanesPerNodeMax"`
	// ChargedShareMin and Max are, over the Macs alive, the share of each one's budget its
	// placements charge.
	ChargedShareMin float64 `json:"chargedShareMin"`
	ChargedShareMax float64 `json:"chargedShareMax"`
}

// check checks where the lanes went, before any figure is reported: each lane's replicas on
// distinct Macs that run its identity exactly, are Ready, and match its selector; no Mac charged
// past its budget; and, per macOS build, the charged shares of the budgets within two lanes'
// worth of each other (lanes restricted to a zone, and two replicas that must differ, keep it
// from one).
func (f *fleet) check(st *state, dead map[string]bool) (spread, error) {
	ids := map[string]*v1.CertifiedIdentity{}
	for _, id := range f.identities {
		ids[id.Name] = id
	}
	var errs []error
	charged := map[string]int32{}
	count := map[string]int{}
	onNode := map[string]bool{}
	per := map[string]int{}
	for _, p := range st.placements {
		n, id := st.nodes[p.Spec.Node], ids[p.Spec.Identity]
		lane := st.lanes[p.Namespace+"/"+p.Spec.Lane]
		switch {
		case n == nil || id == nil || lane == nil:
			errs = append(errs, fmt.Errorf("placement %s/%s names an unknown node, identity or lane", p.Namespace, p.Name))
			continue
		case dead[n.Name]:
			errs = append(errs, fmt.Errorf("placement %s/%s is on %s, which is dead", p.Namespace, p.Name, n.Name))
		case !id.Matches(n):
			errs = append(errs, fmt.Errorf("placement %s/%s is on %s, which does not run identity %s", p.Namespace, p.Name, n.Name, id.Name))
		case !labels.SelectorFromSet(lane.Spec.NodeSelector).Matches(labels.Set(n.Labels)):
			errs = append(errs, fmt.Errorf("placement %s/%s is on %s, which its lane's selector does not take", p.Namespace, p.Name, n.Name))
		}
		key := p.Namespace + "/" + p.Spec.Lane + "@" + n.Name
		if onNode[key] {
			errs = append(errs, fmt.Errorf("lane %s/%s has two placements on %s", p.Namespace, p.Spec.Lane, n.Name))
		}
		onNode[key] = true
		per[p.Namespace+"/"+p.Spec.Lane]++
		charged[n.Name] += id.Spec.Model.Layers
		count[n.Name]++
	}
	for _, l := range f.lanes {
		if got := per[l.Namespace+"/"+l.Name]; got != int(l.Spec.Replicas) {
			errs = append(errs, fmt.Errorf("lane %s/%s has %d placements, want %d", l.Namespace, l.Name, got, l.Spec.Replicas))
		}
	}
	sp := spread{Placements: len(st.placements), LanesPerNodeMin: len(st.placements), ChargedShareMin: 1}
	lo, hi := map[v1.MacOSBuild]float64{}, map[v1.MacOSBuild]float64{}
	loNode, hiNode := map[v1.MacOSBuild]string{}, map[v1.MacOSBuild]string{}
	for _, s := range f.specs {
		if dead[s.Name] {
			continue
		}
		n := st.nodes[s.Name]
		capacity := n.Status.Capacity.LayerExecutables
		if charged[s.Name] > capacity {
			errs = append(errs, fmt.Errorf("%s is charged %d layer executables of its %d", s.Name, charged[s.Name], capacity))
		}
		share := float64(charged[s.Name]) / float64(capacity)
		if l, ok := lo[s.MacOSBuild]; !ok || share < l {
			lo[s.MacOSBuild], loNode[s.MacOSBuild] = share, s.Name
		}
		if share > hi[s.MacOSBuild] {
			hi[s.MacOSBuild], hiNode[s.MacOSBuild] = share, s.Name
		}
		sp.LanesPerNodeMin, sp.LanesPerNodeMax = min(sp.LanesPerNodeMin, count[s.Name]), max(sp.LanesPerNodeMax, count[s.Name])
		sp.ChargedShareMin, sp.ChargedShareMax = min(sp.ChargedShareMin, share), max(sp.ChargedShareMax, share)
	}
	// Two lanes of the larger model on the smaller budget.
	const slack = 2 * 12.0 / 60
	for b := range lo {
		if hi[b]-lo[b] > slack+1e-9 {
			errs = append(errs, fmt.Errorf("on macOS %s the charged shares range from %.2f (%s, %d lanes) to %.2f (%s, %d lanes): not spread",
				b, lo[b], loNode[b], count[loNode[b]], hi[b], hiNode[b], count[hiNode[b]]))
		}
	}
	if len(errs) > 5 {
		errs = append(errs[:5], fmt.Errorf("and %d more", len(errs)-5))
	}
	return sp, errors.Join(errs...)
}

// report is what a run measured.
type report struct {
	Nodes      int    `json:"nodes"`
	Lanes      int    `json:"lanes"`
	Spread     spread `json:"spread"`
	Rollout    phase  `json:"rollout"`
	Steady     phase  `json:"steadyState"`
	Controller usage  `json:"controller"`
	APIServer  usage  `json:"apiServer"`
	Etcd       usage  `json:"etcd"`
	// Hollow is the process running the hollow Macs (and the harness); AgentRestarts counts the
	// times their agents exited (failing to reach the API server) and were started again.
	Hollow        usage   `json:"hollowFleet"`
	AgentRestarts int     `json:"agentRestarts"`
	BootSeconds   float64 `json:"bootSeconds"`
	Storms        []storm `json:"storms,omitempty"`
	Config        struct {
		SimScale       float64 `json:"simScale"`
		LeaseSeconds   float64 `json:"leaseDurationSeconds"`
		StatusSeconds  float64 `json:"statusIntervalSeconds"`
		GraceSeconds   float64 `json:"nodeGracePeriodSeconds"`
		EvictSeconds   float64 `json:"nodeEvictionTimeoutSeconds"`
		EvictionRate   float64 `json:"nodeEvictionRate"`
		ControllerSeen string  `json:"controllerUser"`
	} `json:"config"`
}

type phase struct {
	// Seconds from the first lane applied: all applied, all placed, all Ready, and all with
	// their Service and EndpointSlices written (ServiceReady: callable through the Service).
	// The rollout's window ends with the last: its writes are all of the rollout's.
	AppliedSeconds  float64 `json:"appliedSeconds,omitempty"`
	PlacedSeconds   float64 `json:"placedSeconds,omitempty"`
	ReadySeconds    float64 `json:"readySeconds,omitempty"`
	ServicedSeconds float64 `json:"servicedSeconds,omitempty"`
	WindowSeconds   float64 `json:"windowSeconds"`
	// APIRequestsPerSecond by "VERB resource", from every client.
	APIRequestsPerSecond map[string]float64 `json:"apiRequestsPerSecond"`
	APIWrites            float64            `json:"apiWrites"`
	// ControllerWrites by "VERB resource" (a patch with its field manager: "VERB resource
	// (manager)"), from the audit log; LeaderElectionWrites apart.
	ControllerWrites             requestCounts `json:"controllerWrites"`
	LeaderElectionWrites         int           `json:"leaderElectionWrites"`
	ControllerWritesPerPlacement float64       `json:"controllerWritesPerPlacement,omitempty"`
	APIWritesPerPlacement        float64       `json:"apiWritesPerPlacement,omitempty"`
	ReconcilesPerLane            float64       `json:"placementReconcilesPerLane,omitempty"`
}

type usage struct {
	CPUSeconds   float64 `json:"cpuSeconds"`
	PeakRSSBytes int64   `json:"peakRSSBytes"`
	// Restarts: the controller's, after it exited (having lost its leader Lease).
	Restarts int `json:"restarts,omitempty"`
}

type storm struct {
	Name string `json:"name"`
	// ReplacedSeconds: until every lane had its replicas on live Macs; ReconvergeSeconds: until
	// everything was as before (every lane Ready, the controller's queues empty). The writes
	// are counted until writeTail after that, so a write deferred past it is counted too.
	ReplacedSeconds   float64       `json:"replacedSeconds,omitempty"`
	ReconvergeSeconds float64       `json:"reconvergeSeconds"`
	APIWrites         float64       `json:"apiWrites"`
	ExtraAPIWrites    float64       `json:"extraAPIWrites"`
	ControllerWrites  requestCounts `json:"controllerWrites"`
	// LeaderElectionWrites are the controller's Lease renewals and leader events.
	LeaderElectionWrites int           `json:"leaderElectionWrites"`
	APIRequests          requestCounts `json:"apiRequests,omitempty"`
}

// rollout applies the lanes at once and measures until every lane is Ready.
func (f *fleet) rollout(ctx context.Context, rep *report) error {
	before, err := f.cp.apiRequests(ctx)
	if err != nil {
		return err
	}
	cm, err := f.ctrl.metrics(ctx)
	if err != nil {
		return err
	}
	reconcilesBefore := reconciles(cm, "lane.placement")
	var profiling sync.WaitGroup
	if f.sc.Profile != "" {
		length := cmp.Or(f.sc.ProfileFor, 30*time.Second)
		profiling.Add(3)
		go func() {
			defer profiling.Done()
			_ = f.ctrl.profile(ctx, int(length.Seconds()), filepath.Join(f.sc.Profile, "controller-rollout.pprof"))
		}()
		go func() {
			defer profiling.Done()
			_ = f.cp.profile(ctx, int(length.Seconds()), filepath.Join(f.sc.Profile, "apiserver-rollout.pprof"))
		}()
		go func() {
			defer profiling.Done()
			if out, err := os.Create(filepath.Join(f.sc.Profile, "hollow-rollout.pprof")); err == nil {
				_ = pprof.StartCPUProfile(out)
				// The profile's length, or less if the run is cut short.
				select {
				case <-time.After(length):
				case <-ctx.Done():
				}
				pprof.StopCPUProfile()
				out.Close()
			}
		}()
	}
	f.logf("applying %d lanes", f.sc.Lanes)
	start := time.Now()
	if err := f.applyLanes(ctx); err != nil {
		return err
	}
	rep.Rollout.AppliedSeconds = time.Since(start).Seconds()
	f.logf("applied in %.1fs (%s)", rep.Rollout.AppliedSeconds, f.controllerPeak())
	err = f.waitFor(ctx, "every lane placed", 30*time.Minute, func() (bool, string) {
		st, err := f.state()
		if err != nil {
			return false, err.Error()
		}
		return st.placed(f.lanes, nil)
	})
	if err != nil {
		return err
	}
	rep.Rollout.PlacedSeconds = time.Since(start).Seconds()
	f.logf("placed in %.1fs (%s)", rep.Rollout.PlacedSeconds, f.controllerPeak())
	f.heapProfile(ctx, "controller-placed.heap.pprof")
	err = f.waitFor(ctx, "every lane Ready", 30*time.Minute, func() (bool, string) {
		st, err := f.state()
		if err != nil {
			return false, err.Error()
		}
		return st.ready(f.lanes)
	})
	if err != nil {
		return err
	}
	rep.Rollout.ReadySeconds = time.Since(start).Seconds()
	f.logf("Ready in %.1fs (%s)", rep.Rollout.ReadySeconds, f.controllerPeak())
	f.heapProfile(ctx, "controller-ready.heap.pprof")
	err = f.waitFor(ctx, "every lane callable through its Service", 30*time.Minute, func() (bool, string) {
		st, err := f.state()
		if err != nil {
			return false, err.Error()
		}
		return st.serviced(f.lanes)
	})
	if err != nil {
		return err
	}
	end := time.Now()
	rep.Rollout.ServicedSeconds = end.Sub(start).Seconds()
	f.logf("every lane callable through its Service in %.1fs (%s)", rep.Rollout.ServicedSeconds, f.controllerPeak())
	profiling.Wait()

	after, err := f.cp.apiRequests(ctx)
	if err != nil {
		return err
	}
	if cm, err = f.ctrl.metrics(ctx); err != nil {
		return err
	}
	st, err := f.state()
	if err != nil {
		return err
	}
	placements := float64(len(st.placements))
	d := after.minus(before)
	rep.Rollout.WindowSeconds = end.Sub(start).Seconds()
	rep.Rollout.APIRequestsPerSecond = perSecond(d, end.Sub(start))
	rep.Rollout.APIWrites = d.total(writeVerbs...)
	rep.Rollout.APIWritesPerPlacement = rep.Rollout.APIWrites / placements
	if err := f.audit.read(); err != nil {
		return err
	}
	rep.Rollout.ControllerWrites = f.audit.between(start, end)
	rep.Rollout.LeaderElectionWrites = f.audit.leaderElection(start, end)
	rep.Rollout.ControllerWritesPerPlacement = (rep.Rollout.ControllerWrites.total(writeVerbs...)) / placements
	rep.Rollout.ReconcilesPerLane = (reconciles(cm, "lane.placement") - reconcilesBefore) / float64(len(f.lanes))
	return nil
}

// controllerPeak says the controller's peak resident set so far, so that the report's peak can
// be placed in the run, and its resident set now, anonymous (its Go heap and stacks) apart from
// file-backed (its binary's pages, which its Go memory limit does not count).
func (f *fleet) controllerPeak() string {
	_, peak, err := f.ctrl.usage()
	if err != nil {
		return "controller peak RSS unknown: " + err.Error()
	}
	now := ""
	if f.ctrl.cmd != nil && f.ctrl.cmd.Process != nil {
		if status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", f.ctrl.cmd.Process.Pid)); err == nil {
			for _, line := range strings.Split(string(status), "\n") {
				if name, value, ok := strings.Cut(line, ":"); ok && (name == "RssAnon" || name == "RssFile") {
					now += fmt.Sprintf(", %s %s", name, strings.TrimSpace(value))
				}
			}
		}
	}
	return fmt.Sprintf("controller peak RSS so far %.0f MiB%s", float64(peak)/(1<<20), now)
}

// heapProfile saves the controller's heap profile beside the report, when profiles are asked
// for: with every lane placed, with every lane Ready, where its caches hold the whole fleet, and
// once a tenth of the fleet's lanes were re-placed, where its peak has been.
func (f *fleet) heapProfile(ctx context.Context, name string) {
	if f.sc.Profile == "" {
		return
	}
	if err := f.ctrl.heapProfile(ctx, filepath.Join(f.sc.Profile, name)); err != nil {
		f.logf("the controller's heap profile %s: %v", name, err)
	}
}

func perSecond(c requestCounts, d time.Duration) map[string]float64 {
	out := map[string]float64{}
	for k, v := range c {
		if r := v / d.Seconds(); r >= 0.05 {
			out[k] = float64(int(r*100+0.5)) / 100
		}
	}
	return out
}

// steady measures the API requests of the fleet at rest for the scenario's Steady.
func (f *fleet) steady(ctx context.Context, rep *report) error {
	before, err := f.cp.apiRequests(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(f.sc.Steady):
	}
	after, err := f.cp.apiRequests(ctx)
	if err != nil {
		return err
	}
	end := time.Now()
	d := after.minus(before)
	rep.Steady.WindowSeconds = end.Sub(start).Seconds()
	rep.Steady.APIRequestsPerSecond = perSecond(d, end.Sub(start))
	rep.Steady.APIWrites = d.total(writeVerbs...)
	if err := f.audit.read(); err != nil {
		return err
	}
	rep.Steady.ControllerWrites = f.audit.between(start, end)
	rep.Steady.LeaderElectionWrites = f.audit.leaderElection(start, end)
	return nil
}

// usages fills in the processes' CPU and peak memory.
func (f *fleet) usages(rep *report) {
	f.usagesTaken = true
	rep.Controller.CPUSeconds, rep.Controller.PeakRSSBytes, _ = f.ctrl.usage()
	rep.Controller.Restarts = f.ctrl.Restarts
	if pid, err := f.cp.apiServerPID(); err == nil && !f.apiServerRestarted {
		rep.APIServer.CPUSeconds, rep.APIServer.PeakRSSBytes, _ = procUsage(pid)
	}
	if pid, err := f.cp.etcdPID(); err == nil {
		rep.Etcd.CPUSeconds, rep.Etcd.PeakRSSBytes, _ = procUsage(pid)
	}
	rep.Hollow.CPUSeconds, rep.Hollow.PeakRSSBytes, _ = procUsage(os.Getpid())
	rep.AgentRestarts = f.agentRestarts()
}
