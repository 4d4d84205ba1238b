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
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
	"github.com/ck-synapse/synapse-fleet/node-agent/supervisor"
)

// writeStatus writes the placements' and the node's status when they change: passes run on
// every state change and every StatusInterval, and one object is written at most once per
// StatusInterval, so a burst of changes is coalesced into one write. A write that fails (the
// API server is away, or refuses it) is retried after StatusInterval, then after a wait that
// doubles (statusBook), however often the state changes meanwhile: status catches up when the
// API server returns, and a write it refuses costs a request a minute at most, not one a pass.
func (a *Agent) writeStatus(ctx context.Context) error {
	ticker := a.cfg.Clock.NewTicker(a.cfg.StatusInterval)
	defer ticker.Stop()
	book := newStatusBook()
	for {
		a.statusPass(ctx, book)
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
		case <-a.kick:
		}
	}
}

// statusBook is what the status writer keeps between passes, per object (the node, or a
// placement's key).
type statusBook struct {
	// wrote is when the object's status was last written.
	wrote map[string]time.Time
	// failed is, while the object's writes fail, when the last one failed and how long the
	// next waits.
	failed map[string]failedWrite
}

type failedWrite struct {
	at    time.Time
	retry time.Duration
}

// StatusRetryCap bounds the wait between attempts of a status write that keeps failing: the
// wait starts at StatusInterval and doubles (with a tenth of jitter) after each failure, so a
// status the API server refuses (a fault to fix, not a load to repeat) costs a thousand Macs a
// few requests a minute, not a thousand a second.
const StatusRetryCap = time.Minute

func newStatusBook() *statusBook {
	return &statusBook{wrote: map[string]time.Time{}, failed: map[string]failedWrite{}}
}

// due says whether the object may be written at now: StatusInterval after its last write, and
// its retry wait after its last failed attempt.
func (b *statusBook) due(key string, now time.Time, interval time.Duration) bool {
	if t, ok := b.wrote[key]; ok && now.Sub(t) < interval {
		return false
	}
	if f, ok := b.failed[key]; ok && now.Sub(f.at) < f.retry {
		return false
	}
	return true
}

// forget drops what the book holds of placements that are gone.
func (b *statusBook) forget(keep map[string]bool) {
	for k := range b.wrote {
		if k != "node" && !keep[k] {
			delete(b.wrote, k)
		}
	}
	for k := range b.failed {
		if k != "node" && !keep[k] {
			delete(b.failed, k)
		}
	}
}

// record notes a write's outcome. The first failure of a run of them is logged as an error
// (a status the API server refuses is a fault an operator must see, not a retry to hide), the
// others at V(1), and the first write after them at once.
func (a *Agent) record(book *statusBook, key string, now time.Time, wrote bool, err error, kv ...any) {
	var notStarted *cache.ErrCacheNotStarted
	if errors.As(err, &notStarted) {
		return // the agent is starting: nothing was sent, and the next pass tries again
	}
	if err != nil {
		f, failing := book.failed[key]
		if failing {
			a.cfg.Log.V(1).Info("writing a status failed again; will retry", append(kv, "error", err.Error())...)
			f.retry = min(wait.Jitter(2*f.retry, 0.1), StatusRetryCap)
		} else {
			a.cfg.Log.Error(err, "writing a status failed; will retry", kv...)
			f.retry = a.cfg.StatusInterval
		}
		f.at = now
		book.failed[key] = f
		return
	}
	if _, failing := book.failed[key]; failing {
		delete(book.failed, key)
		if wrote {
			a.cfg.Log.Info("a status is written again", kv...)
		}
	}
	if wrote {
		book.wrote[key] = now
	}
}

// statusPass writes every object whose status changed and which is due (see statusBook.due);
// it returns how many it wrote.
func (a *Agent) statusPass(ctx context.Context, book *statusBook) int {
	now := a.cfg.Clock.Now()
	n := 0
	if book.due("node", now, a.cfg.StatusInterval) {
		t, ok := book.wrote["node"]
		progressDue := !ok || now.Sub(t) >= NodeProgressInterval
		wrote, err := a.writeNodeStatus(ctx, progressDue)
		a.record(book, "node", now, wrote, err, "node", a.cfg.NodeName)
		if wrote && err == nil {
			n++
		}
	}
	if a.cfg.TLS != nil {
		a.cfg.TLS.ServeLanes(a.placedLanes())
	}
	keys := a.placementKeys()
	keep := make(map[string]bool, len(keys))
	for _, key := range keys {
		keep[key.String()] = true
	}
	book.forget(keep)
	for _, key := range keys {
		if !book.due(key.String(), now, a.cfg.StatusInterval) {
			continue
		}
		wrote, err := a.writePlacementStatus(ctx, key, book.due(key.String(), now, a.cfg.PlacementProgressInterval))
		a.record(book, key.String(), now, wrote, err, "placement", key.String())
		if wrote && err == nil {
			n++
		}
	}
	return n
}

// placedLanes are the lanes placed on the node (namespace and lane name), but those whose
// placement is being retired: the signer names no lane whose placement is going, and a
// request naming one would be denied whole.
func (a *Agent) placedLanes() []types.NamespacedName {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(a.lanes))
	for k, l := range a.lanes {
		if l.state != laneRetiring {
			out = append(out, types.NamespacedName{Namespace: k.Namespace, Name: l.spec.Lane})
		}
	}
	return out
}

func (a *Agent) placementKeys() []types.NamespacedName {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]types.NamespacedName, 0, len(a.lanes))
	for k := range a.lanes {
		out = append(out, k)
	}
	return out
}

// refreshNode reads the node (spec: paused, unschedulable) from the cache.
func (a *Agent) refreshNode(ctx context.Context) error {
	node := &v1.MacNode{}
	if err := a.kube.Get(ctx, client.ObjectKey{Name: a.cfg.NodeName}, node); err != nil {
		return client.IgnoreNotFound(err)
	}
	a.mu.Lock()
	a.node = node
	a.mu.Unlock()
	return nil
}

// writePlacementStatus applies one placement's status if it differs from what the agent knows:
// its own fields and condition types only, so the controllers' conditions (NodeReady,
// Drained), which the cached copy may not show yet, are neither erased nor reverted.
//
// What it knows is the cached placement, or, while the cache shows the placement from before
// the agent's last write of it, that write: under a rollout's load the watch runs seconds
// behind, and a status compared with the stale copy was applied again unchanged, once every
// StatusInterval until the cache caught up.
//
// A difference in progress alone (placementProgressOnly) is written only when progressDue.
func (a *Agent) writePlacementStatus(ctx context.Context, key types.NamespacedName, progressDue bool) (bool, error) {
	p := &v1.LanePlacement{}
	if err := a.kube.Get(ctx, key, p); err != nil {
		return false, client.IgnoreNotFound(err)
	}
	now := a.cfg.Clock.Now()
	a.mu.Lock()
	if l := a.lanes[key]; l != nil && l.said != nil && l.said.uid == p.UID && now.Sub(l.said.at) < SaidFor &&
		statusapply.CacheBehind(p.ResourceVersion, l.said.rv) {
		statusapply.OverlayAgentPlacementStatus(&p.Status, &l.said.status)
	}
	a.mu.Unlock()
	stored := p.DeepCopy()
	if !a.placementStatus(key, p) || equality.Semantic.DeepEqual(stored.Status, p.Status) ||
		!progressDue && placementProgressOnly(stored.Status, p.Status) {
		return false, nil
	}
	written, err := statusapply.ApplyAgentPlacementStatus(ctx, a.kube, key, p.Status)
	if err == nil {
		a.mu.Lock()
		// A drain's write and the status writer's may cross: the later write is kept. The
		// placement is the one the API server wrote, which a cache behind a delete and a
		// create of the same name may not show yet.
		if l := a.lanes[key]; l != nil && (l.said == nil || l.said.uid != written.UID || !statusapply.CacheBehind(written.ResourceVersion, l.said.rv)) {
			l.said = &saidStatus{uid: written.UID, rv: written.ResourceVersion, at: now, status: *p.Status.DeepCopy()}
		}
		a.mu.Unlock()
	}
	return true, client.IgnoreNotFound(err)
}

// SaidFor bounds how long the agent trusts its own last write of a placement's status over a
// cache that shows the placement from before it. A watch catches up within seconds even under
// a rollout's load; resource versions that went back (etcd restored from an older snapshot)
// would otherwise keep the cache "behind" and the restored status uncorrected. Past it, the
// cache is compared as it is, at the cost of one write it may not have needed.
const SaidFor = 30 * time.Second

// placementStatus fills p's status from the lane's state; false if the agent has no entry.
func (a *Agent) placementStatus(key types.NamespacedName, p *v1.LanePlacement) bool {
	a.mu.Lock()
	l := a.lanes[key]
	if l == nil {
		a.mu.Unlock()
		return false
	}
	state, loaded, supKey, failure, stopping := l.state, l.loaded, l.key, l.failure, a.stopping
	verifyReason, verifyMessage, verified := l.verifyReason, l.verifyMessage, l.verified
	probes := probeStatus(l.probes, a.simulated())
	a.mu.Unlock()

	now := metav1.NewTime(a.cfg.Clock.Now().Truncate(time.Second))
	st := &p.Status
	st.ObservedGeneration = p.Generation
	var snap supervisor.LaneSnapshot
	if loaded {
		snap, loaded = a.sup.Snapshot(supKey)
	}
	st.ResidentShapes, st.CachedShapes, st.Compile, st.Prewarm = toRungs(snap.Resident), toRungs(snap.Cached), nil, nil
	st.Probes = probes
	st.Backend = a.cfg.Worker.Backend
	st.WorkerWarnings = a.warningStatus(laneKey(p.Spec, p.Namespace))
	if loaded {
		st.WorkerGeneration = snap.Generation
		if c := snap.Admitting; c != nil {
			st.Compile = &v1.CompileProgress{Rung: v1.Rung(c.Rung), LayersDone: int32(c.LayersDone), LayersTotal: int32(c.LayersTotal),
				PredictedReadyTime: ptrTime(c.PredictedDone)}
		}
		if pw, ok := a.sup.Prewarmed(supKey); ok {
			st.Prewarm = &v1.PrewarmSummary{State: pw.State, Loaded: toRungs(pw.Loaded), LoadedFromCache: int32(pw.LoadedFromCache),
				Compiled: int32(pw.Compiled), AlreadyResident: int32(pw.AlreadyResident), SkippedForBudget: int32(pw.SkippedForBudget),
				Failed: int32(pw.Failed), TotalMilliseconds: pw.Total.Milliseconds()}
		}
	}
	switch {
	case failure != nil:
		st.LastFault = failure.DeepCopy()
	case snap.LastFault != nil:
		st.LastFault = &v1.Fault{Code: snap.LastFault.Code, Message: snap.LastFault.Message, Time: metav1.NewTime(snap.LastFault.At.Truncate(time.Second))}
	}

	st.Phase = phase(state, snap, loaded)
	// A lane loaded and checked is not Ready while the node's API serves nothing (its first
	// serving certificate has not come): the lane's endpoints would list a port whose
	// connections wait in the backlog.
	// Nor while the certificate does not name the lane's Service yet: a call through the
	// Service would fail to verify.
	awaitingCert := st.Phase == v1.PhaseReady && a.awaitingCert.Load()
	service := types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.Lane}
	unnamed := st.Phase == v1.PhaseReady && !awaitingCert && a.cfg.TLS != nil && !a.cfg.TLS.NamesLane(service)
	if awaitingCert || unnamed {
		st.Phase = v1.PhaseLoading
	}
	set := func(typ string, ok bool, reason, message string) {
		status := metav1.ConditionFalse
		if ok {
			status = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message,
			ObservedGeneration: p.Generation, LastTransitionTime: now})
	}
	switch {
	case verifyReason != "":
		set(v1.PlacementConditionArtifactVerified, false, verifyReason, verifyMessage)
	case verified != nil:
		how := "every file hashed"
		if verified.FromStamp {
			how = "unchanged since its last full verification"
		}
		set(v1.PlacementConditionArtifactVerified, true, "Verified", fmt.Sprintf("node %s runs the identity exactly; artifact %s verified: %s",
			a.cfg.NodeName, verified.Dir, how))
	}
	switch {
	case loaded && snap.Running:
		set(v1.PlacementConditionWorkerRunning, true, "Running", fmt.Sprintf("worker generation %d is serving", snap.Generation))
	case loaded && snap.Recovering:
		set(v1.PlacementConditionWorkerRunning, false, "Recovering", fmt.Sprintf("worker generation %d faulted; its replacement is starting", snap.Generation))
	case state == lanePaused:
		set(v1.PlacementConditionWorkerRunning, false, "Paused", "the node is paused; the lane is unloaded")
	case state == laneRetiring:
		set(v1.PlacementConditionWorkerRunning, false, "Retiring", "the lane is being unloaded")
	case state == laneStopped:
		set(v1.PlacementConditionWorkerRunning, false, "AgentStopped", "the node's agent stopped; it re-adopts the placement when it runs again")
	default:
		set(v1.PlacementConditionWorkerRunning, false, "NotRunning", "no worker runs for this lane")
	}
	switch state {
	case laneReady, lanePaused, laneRetiring, laneStopped:
		if meta.FindStatusCondition(st.Conditions, v1.PlacementConditionSelfChecked) == nil || state == laneReady {
			set(v1.PlacementConditionSelfChecked, state == laneReady, "Passed", "the smallest rung answered a known input correctly")
		}
	case laneFailed:
		if failure != nil && failure.Code == "self_check_failed" {
			set(v1.PlacementConditionSelfChecked, false, "Failed", failure.Message)
		}
	default:
		set(v1.PlacementConditionSelfChecked, false, "Pending", "the self-check runs once the smallest rung is resident")
	}
	if stopping {
		set(v1.PlacementConditionTerminating, true, v1.PlacementReasonAgentStopping,
			fmt.Sprintf("the agent of node %s is stopping: calls already here are answered, new ones go to the lane's other nodes", a.cfg.NodeName))
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1.PlacementConditionTerminating)
	}
	ready := st.Phase == v1.PhaseReady
	reason, message := string(st.Phase), phaseMessage(st.Phase, st)
	switch {
	case awaitingCert:
		reason, message = v1.PlacementReasonAwaitingServingCertificate,
			"the lane is loaded and checked; the node's API serves it once the node's serving certificate comes from the fleet's signer"
	case unnamed:
		reason, message = v1.PlacementReasonAwaitingServingCertificate,
			fmt.Sprintf("the lane is loaded and checked; it is Ready once the node's serving certificate names its Service (%s), which the node has asked the fleet's signer for (a name the signer leaves out is named in its request's Approved condition)",
				v1.LaneServiceDNSName(service.Namespace, service.Name))
	}
	set(v1.ConditionReady, ready, reason, message)
	return true
}

func phase(state laneState, snap supervisor.LaneSnapshot, loaded bool) v1.PlacementPhase {
	switch state {
	case lanePaused:
		return v1.PhasePaused
	case laneRetiring:
		return v1.PhaseRetiring
	case laneStopped:
		return v1.PhasePending
	case laneFailed:
		return v1.PhaseFailed
	case laneLoading:
		return v1.PhaseLoading
	case laneSelfCheck:
		if snap.Admitting != nil {
			return v1.PhaseCompiling
		}
		return v1.PhaseLoading
	}
	if !loaded || !snap.Running {
		return v1.PhaseLoading // a faulted worker's replacement is starting
	}
	return v1.PhaseReady
}

func phaseMessage(p v1.PlacementPhase, st *v1.LanePlacementStatus) string {
	switch p {
	case v1.PhaseReady:
		return fmt.Sprintf("serving on worker generation %d", st.WorkerGeneration)
	case v1.PhaseCompiling:
		return fmt.Sprintf("compiling rung %d: %d of %d layers", st.Compile.Rung, st.Compile.LayersDone, st.Compile.LayersTotal)
	case v1.PhaseFailed:
		if st.LastFault != nil {
			return st.LastFault.Code + ": " + st.LastFault.Message
		}
	case v1.PhasePaused:
		return "the node is paused; the lane is unloaded until it resumes"
	case v1.PhaseRetiring:
		return "the lane is being unloaded; the placement goes once its worker has exited"
	case v1.PhasePending:
		return "the node's agent is not running; the placement is re-adopted when it returns"
	}
	return "the lane's worker is starting"
}

func toRungs(rs []int) []v1.Rung {
	if len(rs) == 0 {
		return nil
	}
	out := make([]v1.Rung, len(rs))
	for i, r := range rs {
		out[i] = v1.Rung(r)
	}
	return out
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t.Truncate(time.Second))
	return &mt
}

// NodeProgressInterval is the least time between two writes of the node's status that only
// report progress (allocation, cached rungs, the compile queue, the number of lanes, the
// conditions' messages): a Mac compiling its lanes changes them every second, and a thousand
// Macs writing them that often are most of what the API server does in a rollout. A change
// of what placement reads (a condition, the platform, the worker, the capacity) is written
// within StatusInterval.
const NodeProgressInterval = 10 * time.Second

// DefaultPlacementProgressInterval is the least time between two writes of a placement's status
// that only report progress (the layers of the shape being compiled, its predicted time, the
// prewarm's counts, the Ready condition's message that counts the layers); Config's
// PlacementProgressInterval sets another. The API server hands every placement write to
// every agent's placement watch and filters it there: its watch cache narrows an event's
// watchers only by a trigger the resource's registry sets (k8s.io/apiserver
// pkg/storage/cacher/cacher.go, indexedTrigger; Pods set spec.nodeName in kubernetes
// pkg/registry/core/pod/storage/storage.go), and a custom resource's sets none. So a thousand
// Macs reporting each compiled layer every second cost the API server a thousand dispatches a
// write (make scale at 1,000 Macs: 14 placement status writes a second in the rollout, the
// largest write stream after the Leases). A change of phase, condition, resident or cached
// shapes, or fault is written within StatusInterval.
const DefaultPlacementProgressInterval = 5 * time.Second

// placementProgressOnly reports whether two placement statuses differ only in what
// Config.PlacementProgressInterval coalesces.
func placementProgressOnly(a, b v1.LanePlacementStatus) bool {
	mask := func(st v1.LanePlacementStatus) v1.LanePlacementStatus {
		if st.Compile != nil {
			st.Compile = &v1.CompileProgress{Rung: st.Compile.Rung, LayersTotal: st.Compile.LayersTotal}
		}
		if st.Prewarm != nil {
			st.Prewarm = &v1.PrewarmSummary{State: st.Prewarm.State}
		}
		// Of the conditions' messages only Ready's while compiling counts the layers; the others
		// say why (which certificate is awaited, how the artifact was verified) and are
		// written as they change.
		st.Conditions = slices.Clone(st.Conditions)
		for i, c := range st.Conditions {
			if c.Type == v1.ConditionReady && c.Reason == string(v1.PhaseCompiling) {
				st.Conditions[i].Message = ""
			}
		}
		return st
	}
	return equality.Semantic.DeepEqual(mask(a), mask(b))
}

// progressOnly reports whether two node statuses differ only in what NodeProgressInterval
// coalesces.
func progressOnly(a, b v1.MacNodeStatus) bool {
	mask := func(st v1.MacNodeStatus) v1.MacNodeStatus {
		st.Allocated, st.CachedRungs, st.CompileQueue, st.Lanes = v1.ExecutableBudget{}, nil, v1.CompileQueueSummary{}, 0
		st.Conditions = slices.Clone(st.Conditions)
		for i := range st.Conditions {
			st.Conditions[i].Message, st.Conditions[i].LastTransitionTime = "", metav1.Time{}
		}
		return st
	}
	return equality.Semantic.DeepEqual(mask(a), mask(b))
}

// writeNodeStatus applies the MacNode's status if it differs from what the agent reports; a
// difference in progress alone only when progressDue.
func (a *Agent) writeNodeStatus(ctx context.Context, progressDue bool) (bool, error) {
	node := &v1.MacNode{}
	if err := a.kube.Get(ctx, client.ObjectKey{Name: a.cfg.NodeName}, node); err != nil {
		return false, err
	}
	a.mu.Lock()
	a.node = node.DeepCopy()
	paused, adminPaused := a.pausedLocked(), a.paused
	lanes := map[string]string{} // supervisor key -> identity
	for _, l := range a.lanes {
		if l.loaded && l.identity != nil {
			lanes[l.key] = l.identity.Name
		}
	}
	port := a.port
	a.mu.Unlock()

	stored := node.DeepCopy()
	st := &node.Status
	now := a.cfg.Clock.Now()
	sup := a.sup.Node()
	st.ObservedGeneration = node.Generation
	st.Platform, st.Worker = a.cfg.Platform, a.cfg.Worker
	st.Capacity = v1.ExecutableBudget{LayerExecutables: int32(sup.Budget)}
	st.Allocated = v1.ExecutableBudget{LayerExecutables: int32(sup.Used)}
	st.Addresses = []v1.NodeAddress{{Type: "InternalIP", Address: a.cfg.Address}}
	st.ServingPort = port
	st.Lanes = int32(len(lanes))
	cached := map[string][]v1.Rung{}
	for key, id := range lanes {
		if snap, ok := a.sup.Snapshot(key); ok {
			for _, r := range snap.Cached {
				if !slices.Contains(cached[id], v1.Rung(r)) {
					cached[id] = append(cached[id], v1.Rung(r))
				}
			}
		}
	}
	st.CachedRungs = nil
	for id, rs := range cached {
		slices.Sort(rs)
		st.CachedRungs = append(st.CachedRungs, v1.CachedRungs{Identity: id, Rungs: rs})
	}
	slices.SortFunc(st.CachedRungs, func(x, y v1.CachedRungs) int { return strings.Compare(x.Identity, y.Identity) })
	st.CompileQueue = v1.CompileQueueSummary{Length: int32(sup.QueueLength), Running: sup.Running}
	if !sup.PredictedDrain.IsZero() {
		// Rounded up to 5 s so the estimate does not rewrite the node every second.
		secs := int32((sup.PredictedDrain.Sub(now) + 5*time.Second - 1) / (5 * time.Second) * 5)
		st.CompileQueue.PredictedDrainSeconds = max(secs, 0)
	}
	t := metav1.NewTime(now.Truncate(time.Second))
	cond := func(typ string, status metav1.ConditionStatus, reason, message string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message,
			ObservedGeneration: node.Generation, LastTransitionTime: t})
	}
	// Ready is not the agent's to say: the lifecycle controller writes it from the Lease. The
	// agent says it runs.
	cond(v1.NodeConditionAgentReady, metav1.ConditionTrue, v1.NodeReasonAgentRunning, fmt.Sprintf("the agent is running; %d lanes loaded", len(lanes)))
	cond(v1.NodeConditionANEAvailable, metav1.ConditionTrue, "Backend"+capitalise(string(a.cfg.Worker.Backend)),
		fmt.Sprintf("workers run the %s backend", a.cfg.Worker.Backend))
	switch {
	case adminPaused:
		cond(v1.NodeConditionPaused, metav1.ConditionTrue, "PausedByAdminAPI", "paused through the agent's admin API; every lane is unloaded")
	case paused:
		cond(v1.NodeConditionPaused, metav1.ConditionTrue, "PausedBySpec", "spec.paused is set; every lane is unloaded")
	default:
		cond(v1.NodeConditionPaused, metav1.ConditionFalse, "NotPaused", "the node serves its lanes")
	}
	if equality.Semantic.DeepEqual(stored.Status, node.Status) || (!progressDue && progressOnly(stored.Status, node.Status)) {
		return false, nil
	}
	// Applied, not patched: the agent's fields and its own conditions only, so a controller's
	// condition (Ready, AddressAllowed) that the informer's cache does not show yet is neither
	// erased nor reverted, and no conflict costs a pass.
	return true, statusapply.ApplyAgentStatus(ctx, a.kube, a.cfg.NodeName, node.Status)
}

func capitalise(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
