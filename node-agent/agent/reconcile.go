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
	"os"
	"path/filepath"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/aneartifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
	"github.com/ck-synapse/synapse-fleet/node-agent/refusal"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
)

// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=laneplacements/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=fleet.synapse.dev,resources=certifiedidentities,verbs=get

// RetryInterval is how long a lane that failed to load waits before it is tried again.
const RetryInterval = 10 * time.Second

// reconciler loads the lanes of the placements bound to this node.
type reconciler struct{ a *Agent }

func (r *reconciler) setup(mgr ctrl.Manager) error {
	all := handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, _ client.Object) []reconcile.Request {
		return r.a.placementRequests()
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("agent.placement").
		For(&v1.LanePlacement{}).
		// Pausing or resuming the node, or a change of its build, concerns every placement.
		// CertifiedIdentities are not watched: see placementIdentity.
		Watches(&v1.MacNode{}, all).
		WatchesRawSource(source.Channel(r.a.resync, all)).
		// Several agents may run in one process (the scale harness's hollow Macs), each with a
		// controller of this name.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4, SkipNameValidation: ptr.To(true)}).
		Complete(r)
}

func (a *Agent) placementRequests() []reconcile.Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]reconcile.Request, 0, len(a.lanes))
	for k := range a.lanes {
		out = append(out, reconcile.Request{NamespacedName: k})
	}
	return out
}

// Reconcile brings one placement's lane to what its placement and the node say.
func (r *reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	a := r.a
	if err := a.refreshNode(ctx); err != nil {
		return reconcile.Result{}, err
	}
	p := &v1.LanePlacement{}
	err := a.kube.Get(ctx, req.NamespacedName, p)
	switch {
	case apierrors.IsNotFound(err):
		// Gone without the handshake (forced away after the node was lost): unload it.
		a.unload(ctx, req.NamespacedName, true)
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	if p.Spec.Node != a.cfg.NodeName {
		return reconcile.Result{}, nil
	}
	if !p.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, r.retire(ctx, p)
	}
	l := a.entry(p)
	if a.isPaused() {
		a.unload(ctx, req.NamespacedName, false)
		a.setState(l, lanePaused, nil)
		return reconcile.Result{}, nil
	}

	identity, err := a.placementIdentity(ctx, l, p)
	if err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		a.unload(ctx, req.NamespacedName, false)
		a.fail(l, "IdentityNotFound", fmt.Sprintf("CertifiedIdentity %s does not exist", p.Spec.Identity))
		// No watch brings the identity's creation: the placement looks again.
		return reconcile.Result{RequeueAfter: RetryInterval}, nil
	}
	if node := a.ownNode(); node == nil || !identity.Matches(node) {
		// The approval is for another worker binary or macOS build: nothing loads.
		a.unload(ctx, req.NamespacedName, false)
		a.fail(l, "IdentityMismatch", fmt.Sprintf("node %s does not run identity %s (worker %s, macOS %s)",
			a.cfg.NodeName, identity.Name, identity.Spec.Worker.BinaryDigest, identity.Spec.MacOSBuild))
		return reconcile.Result{}, nil
	}

	a.mu.Lock()
	l.generation = p.Generation
	reload := l.loaded && (!sameLoad(l.spec, p.Spec) || l.identity.Name != identity.Name || l.identity.UID != identity.UID)
	loaded, retryAt := l.loaded, l.retryAt
	a.mu.Unlock()
	if reload {
		a.unload(ctx, req.NamespacedName, false)
		loaded = false
	}
	if loaded {
		a.mu.Lock()
		prewarmChanged := !slices.Equal(l.spec.PrewarmRungs, p.Spec.PrewarmRungs)
		l.spec = p.Spec
		// The request deadline is the front door's: applied to the next call, the worker kept.
		l.api.Deadline = time.Duration(p.Spec.RequestDeadlineSeconds) * time.Second
		ready := l.state == laneReady
		a.mu.Unlock()
		if prewarmChanged && ready {
			_ = a.sup.Prewarm(l.key, rungs(p.Spec.PrewarmRungs))
		}
		return reconcile.Result{}, nil
	}
	if now := a.cfg.Clock.Now(); now.Before(retryAt) {
		return reconcile.Result{RequeueAfter: retryAt.Sub(now)}, nil
	}
	return r.load(ctx, l, p, identity)
}

// placementIdentity is the CertifiedIdentity the placement names: read from the API server
// once per placement (its UID) and identity name, and kept on the lane entry after. An
// identity's spec is immutable (CEL), and its deletion waits for every placement that names it
// to go (its finalizer), so the copy read for a placement stays true for as long as that
// placement lives; a placement of the same name made later (the lane placed here again) is
// another UID and reads it afresh. The agent therefore watches no identities: every identity's
// status write (its lane count, every few seconds while lanes are applied) went to every Mac of
// the fleet and reconciled every placement on each for nothing.
func (a *Agent) placementIdentity(ctx context.Context, l *lane, p *v1.LanePlacement) (*v1.CertifiedIdentity, error) {
	a.mu.Lock()
	kept := l.identityRead
	a.mu.Unlock()
	if kept.id != nil && kept.placement == p.UID && kept.id.Name == p.Spec.Identity {
		return kept.id, nil
	}
	id := &v1.CertifiedIdentity{}
	if err := a.kube.Get(ctx, client.ObjectKey{Name: p.Spec.Identity}, id); err != nil {
		return nil, err
	}
	a.mu.Lock()
	l.identityRead = identityCopy{placement: p.UID, id: id}
	a.mu.Unlock()
	return id, nil
}

// sameLoad reports whether two placement specs load the lane alike: the prewarm rungs and the
// request deadline are applied in place; anything else (the request limits included, which
// serving is set up with) reloads the lane, which the controller does a node at a time.
func sameLoad(a, b v1.LanePlacementSpec) bool {
	return slices.Equal(a.Rungs, b.Rungs) && a.Ceiling == b.Ceiling && a.MaxResidentShapes == b.MaxResidentShapes &&
		a.AdmissionBoundSeconds == b.AdmissionBoundSeconds && a.Task == b.Task && a.Identity == b.Identity && a.Device == b.Device &&
		a.MaxBatchTokens == b.MaxBatchTokens && a.MaxConcurrentRequests == b.MaxConcurrentRequests &&
		ptr.Deref(a.MaxQueuedRequests, -1) == ptr.Deref(b.MaxQueuedRequests, -1)
}

func rungs(rs []v1.Rung) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = int(r)
	}
	return out
}

// load starts the lane's worker and, in the background, its self-check and prewarm.
func (r *reconciler) load(ctx context.Context, l *lane, p *v1.LanePlacement, identity *v1.CertifiedIdentity) (reconcile.Result, error) {
	a := r.a
	key := laneKey(p.Spec, p.Namespace)
	a.mu.Lock()
	l.key, l.spec, l.identity = key, p.Spec, identity
	l.api = httpapi.Lane{Namespace: p.Namespace, Name: p.Spec.Lane, Key: key, Model: identity.Spec.Model.Name, Task: string(p.Spec.Task),
		// The device an answer names is the backend that computes it: sim for the stand-in.
		Device: string(a.cfg.Worker.Backend), Rungs: rungs(p.Spec.Rungs), Ceiling: int(p.Spec.Ceiling),
		Dimensions: int(identity.Spec.Model.EmbeddingDimensions), VectorSpace: identity.Spec.VectorSpaceID,
		Deadline: time.Duration(p.Spec.RequestDeadlineSeconds) * time.Second, MaxBatchTokens: int(p.Spec.MaxBatchTokens),
		Resident: func() []int { snap, _ := a.sup.Snapshot(key); return snap.Resident }}
	l.failure, l.verifyReason, l.verifyMessage, l.verified, l.probes = nil, "", "", nil, nil
	a.mu.Unlock()
	a.setState(l, laneLoading, nil)

	verified, err := a.verifyArtifact(p.Spec, identity)
	if err != nil {
		a.mu.Lock()
		l.retryAt = a.cfg.Clock.Now().Add(RetryInterval)
		a.mu.Unlock()
		a.fail(l, artifactReason(err), err.Error())
		a.cfg.Log.Info("the lane's artifact did not verify; nothing loads", "lane", key, "error", err.Error())
		return reconcile.Result{RequeueAfter: RetryInterval}, nil
	}
	tok, err := laneTokenizer(verified)
	if err != nil {
		a.mu.Lock()
		l.retryAt = a.cfg.Clock.Now().Add(RetryInterval)
		a.mu.Unlock()
		a.fail(l, "TokenizerUnreadable", err.Error())
		return reconcile.Result{RequeueAfter: RetryInterval}, nil
	}
	a.mu.Lock()
	l.verified = verified
	l.api.Tokenizer = tok
	a.mu.Unlock()
	spec := modelSpec(key, p.Spec, identity, verified.Dir)
	spec.Probe = a.probeJudge(l, key)
	if err := a.sup.LoadModel(ctx, spec); err != nil {
		a.mu.Lock()
		l.retryAt = a.cfg.Clock.Now().Add(RetryInterval)
		a.mu.Unlock()
		a.setState(l, laneFailed, &v1.Fault{Code: "load_failed", Message: err.Error()})
		return reconcile.Result{RequeueAfter: RetryInterval}, nil
	}
	a.serve.AddLane(servingLane(key, p.Spec, identity))
	a.mu.Lock()
	l.loaded = true
	a.mu.Unlock()
	a.setState(l, laneSelfCheck, nil)

	gen := a.generationOf(key)
	go func() {
		err := a.selfCheck(context.Background(), l)
		a.mu.Lock()
		current := l.loaded && l.key == key && a.generationOf(key) == gen
		a.mu.Unlock()
		if !current {
			return
		}
		if errors.Is(err, &refusal.Error{Code: refusal.ComputeUnitMismatch}) {
			return // the self-check's placement probe failed: the judge unloads the lane
		}
		if err != nil {
			a.setState(l, laneFailed, &v1.Fault{Code: "self_check_failed", Message: err.Error()})
			return
		}
		a.setState(l, laneReady, nil)
		a.mu.Lock()
		prewarm := rungs(l.spec.PrewarmRungs)
		a.mu.Unlock()
		if len(prewarm) > 0 {
			_ = a.sup.Prewarm(key, prewarm)
		}
	}()
	return reconcile.Result{}, nil
}

// laneTokenizer is the lane's model's tokenizer: the artifact's own tokenizer.json; the sim
// tokenizer for a sim artifact that has none; none for an ane artifact without one (its lane
// takes token ids only, and text is refused rather than tokenised by something else).
func laneTokenizer(v *artifact.Verified) (tokenizer.Tokenizer, error) {
	path := filepath.Join(v.Dir, aneartifact.TokenizerFile)
	if _, err := os.Stat(path); err == nil {
		return tokenizer.LoadHF(path)
	}
	if v.Manifest.Backend == "sim" {
		return tokenizer.Sim{}, nil
	}
	return nil, nil
}

func (a *Agent) generationOf(key string) int64 {
	snap, _ := a.sup.Snapshot(key)
	return snap.Generation
}

// retire unloads a deleted placement's lane and then lets the placement go: the finalizer is
// removed only after the worker's exit is confirmed and its reservations are refunded.
func (r *reconciler) retire(ctx context.Context, p *v1.LanePlacement) error {
	a := r.a
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	l := a.entry(p)
	a.setState(l, laneRetiring, nil)
	a.writePlacementStatus(ctx, key, true) // say Retiring while the worker drains
	a.unload(ctx, key, false)
	if snap, loaded := a.sup.Snapshot(l.key); loaded && snap.Retiring {
		// The unload gave up waiting (its context ended) before the worker's exit was
		// confirmed: the retirement goes on, and the finalizer stays until it is done.
		return fmt.Errorf("placement %s: lane %s is still retiring; its worker's exit is not confirmed yet", key, l.key)
	}
	if controllerutil.ContainsFinalizer(p, v1.FinalizerRetirement) {
		stored := p.DeepCopy()
		controllerutil.RemoveFinalizer(p, v1.FinalizerRetirement)
		if err := a.kube.Patch(ctx, p, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	a.mu.Lock()
	delete(a.lanes, key)
	a.mu.Unlock()
	a.cfg.Log.Info("placement retired; finalizer removed", "placement", key.String())
	return nil
}

// entry returns the placement's lane entry, creating it.
func (a *Agent) entry(p *v1.LanePlacement) *lane {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	l := a.lanes[key]
	if l == nil {
		l = &lane{placement: key, key: laneKey(p.Spec, p.Namespace), spec: p.Spec, generation: p.Generation}
		a.lanes[key] = l
	}
	return l
}

// unload retires the placement's lane from serving and the supervisor, if it is loaded, and
// forgets the entry when forget is set.
func (a *Agent) unload(ctx context.Context, key types.NamespacedName, forget bool) {
	a.mu.Lock()
	l := a.lanes[key]
	if l == nil {
		a.mu.Unlock()
		return
	}
	wasLoaded := l.loaded
	l.loaded = false
	if forget {
		delete(a.lanes, key)
	}
	a.mu.Unlock()
	if wasLoaded {
		a.unloadLane(ctx, l.key)
	}
	a.wake()
}

func (a *Agent) setState(l *lane, s laneState, failure *v1.Fault) {
	a.mu.Lock()
	l.state = s
	if failure != nil {
		failure.Time = metav1.NewTime(a.cfg.Clock.Now().Truncate(time.Second))
		l.failure = failure
	}
	a.mu.Unlock()
	a.wake()
}

func (a *Agent) fail(l *lane, reason, message string) {
	a.mu.Lock()
	l.verifyReason, l.verifyMessage = reason, message
	a.mu.Unlock()
	a.setState(l, laneFailed, &v1.Fault{Code: reason, Message: message})
}
