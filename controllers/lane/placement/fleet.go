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

package placement

import (
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// AssumeTimeout is how long a placement this controller created stays charged to its node
// without the informer showing it. The informer normally shows it within moments; only a
// placement created and deleted again between two of the informer's lists is never shown, and
// this keeps such a one from holding its node's budget forever.
const AssumeTimeout = 2 * time.Minute

// fleet is the placement controller's picture of the fleet, as the kube-scheduler keeps its
// own cache of nodes and the pods bound to them. It is fed by the informers' events and by
// the controller's own decisions:
//
//   - every MacNode, indexed by the identity key its worker and macOS build give it and by its
//     labels, so the nodes that can take a lane are found without walking the fleet;
//   - every placement, charged to its node and listed under its lane: one shape of its identity's layers, the least the
//     lane needs resident to serve (prewarmed shapes beyond it are evicted on demand, so what a
//     node reports allocated is not what bounds placement). A placement the controller has
//     created is charged at once, before the informer shows it ("assumed"), so lanes placed in
//     the same moments see each other and spread, and no node is charged past its budget;
//   - every lane the controller has reconciled, with those still short of replicas indexed by
//     the identity key they need, so a node event enqueues only the lanes it can affect.
//
// Objects from the informers are shared with the cache and only read.
type fleet struct {
	clk clock.PassiveClock

	mu         sync.Mutex
	nodes      map[string]*nodeInfo
	byKey      map[identityKey]map[string]*nodeInfo
	byLabel    map[string]map[string]*nodeInfo // "key=value" -> nodes
	placements map[types.NamespacedName]*placementInfo
	byLane     map[types.NamespacedName]map[types.NamespacedName]*placementInfo
	layers     map[string]int32 // identity name -> layers (an identity's spec is immutable)
	// identities holds the generation of every identity the informer has shown: its status
	// (written as lanes come and go) changes nothing placement reads.
	identities map[string]int64
	lanes      map[types.NamespacedName]*laneInfo
	// waiting holds the lanes short of replicas whose identity exists, by the key it needs.
	waiting map[identityKey]map[types.NamespacedName]*laneInfo
	// nodesFreed counts the node events that can let a waiting lane place (a node turned
	// schedulable, changed worker or labels, or grew): a lane that was found short while one
	// arrived was not yet waiting for it (see observeLane).
	nodesFreed uint64
}

// identityKey is what every identity that matches a node shares with it: the worker binary and
// the macOS build. CertifiedIdentity.Matches decides; the key only narrows the search.
type identityKey struct {
	digest v1.Sha256Digest
	build  v1.MacOSBuild
}

func nodeKey(n *v1.MacNode) identityKey {
	return identityKey{n.Status.Worker.BinaryDigest, n.Status.Platform.MacOSBuild}
}

func identityKeyOf(id *v1.CertifiedIdentity) identityKey {
	return identityKey{id.Spec.Worker.BinaryDigest, id.Spec.MacOSBuild}
}

// nodeInfo is one node and the placements bound to it. node is nil for a node the informer has
// not shown (or no longer shows) that placements still name.
type nodeInfo struct {
	name       string
	node       *v1.MacNode
	placements map[types.NamespacedName]*placementInfo
}

func (n *nodeInfo) schedulable() bool { return n.node != nil && schedulable(n.node) }

func (n *nodeInfo) capacity() int32 {
	if n.node == nil {
		return 0
	}
	return n.node.Status.Capacity.LayerExecutables
}

// placementInfo is one placement: as the informer last showed it, or as the controller created
// it while it is assumed.
type placementInfo struct {
	key       types.NamespacedName
	lane      types.NamespacedName
	node      string
	identity  string
	obj       *v1.LanePlacement
	assumedAt time.Time // non-zero while assumed
	// deleting: the placement has a deletion timestamp, or this controller deleted it and the
	// informer has not shown that yet. It stays charged until it is gone: its worker runs until
	// the agent has retired it.
	deleting bool
}

// laneInfo is what node events need to know of a lane.
type laneInfo struct {
	key      types.NamespacedName
	identity string
	// id, selector and charge are set while the lane waits for nodes.
	id       *v1.CertifiedIdentity
	selector labels.Selector
	charge   int32
}

func newFleet(clk clock.PassiveClock) *fleet {
	return &fleet{clk: clk, nodes: map[string]*nodeInfo{}, byKey: map[identityKey]map[string]*nodeInfo{},
		byLabel: map[string]map[string]*nodeInfo{}, placements: map[types.NamespacedName]*placementInfo{},
		byLane: map[types.NamespacedName]map[types.NamespacedName]*placementInfo{}, layers: map[string]int32{}, identities: map[string]int64{}, lanes: map[types.NamespacedName]*laneInfo{}, waiting: map[identityKey]map[types.NamespacedName]*laneInfo{}}
}

// charged is what the node's placements charge it. Callers hold mu.
func (f *fleet) charged(n *nodeInfo) int32 {
	var sum int32
	for _, p := range n.placements {
		if !f.expired(p) {
			sum += f.layers[p.identity]
		}
	}
	return sum
}

// expired drops an assumption the informer never confirmed once it is AssumeTimeout old, and
// reports whether it did. Callers hold mu.
func (f *fleet) expired(p *placementInfo) bool {
	if p.assumedAt.IsZero() || f.clk.Since(p.assumedAt) <= AssumeTimeout {
		return false
	}
	f.dropLocked(p)
	return true
}

func (f *fleet) free(n *nodeInfo) int32 { return n.capacity() - f.charged(n) }

func (f *fleet) nodeLocked(name string) *nodeInfo {
	n := f.nodes[name]
	if n == nil {
		n = &nodeInfo{name: name, placements: map[types.NamespacedName]*placementInfo{}}
		f.nodes[name] = n
	}
	return n
}

// unindex removes a node from the identity and label indexes.
func (f *fleet) unindex(n *nodeInfo) {
	if n.node == nil {
		return
	}
	key := nodeKey(n.node)
	delete(f.byKey[key], n.name)
	if len(f.byKey[key]) == 0 {
		delete(f.byKey, key)
	}
	for k, v := range n.node.Labels {
		l := k + "=" + v
		delete(f.byLabel[l], n.name)
		if len(f.byLabel[l]) == 0 {
			delete(f.byLabel, l)
		}
	}
}

func (f *fleet) index(n *nodeInfo) {
	key := nodeKey(n.node)
	if f.byKey[key] == nil {
		f.byKey[key] = map[string]*nodeInfo{}
	}
	f.byKey[key][n.name] = n
	for k, v := range n.node.Labels {
		l := k + "=" + v
		if f.byLabel[l] == nil {
			f.byLabel[l] = map[string]*nodeInfo{}
		}
		f.byLabel[l][n.name] = n
	}
}

// observeNode records a node as the informer shows it and returns the lanes the change can
// affect: the lanes placed on it when what identities match on changed or it turned Ready or
// not, and the waiting lanes that could now fit on it. Progress reports, queue summaries,
// addresses, cached rungs and allocation move no lane and enqueue nothing.
func (f *fleet) observeNode(node *v1.MacNode) []reconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodeLocked(node.Name)
	old := n.node
	f.unindex(n)
	n.node = node
	f.index(n)

	var out []reconcile.Request
	if old == nil || !sameWorker(old, node) || nodeReady(old) != nodeReady(node) {
		// A lane counts only placements on Ready nodes as ready, and its rollout moves on them.
		out = f.placedLanes(n, out)
	}
	if n.schedulable() && (old == nil || !schedulable(old) || !sameWorker(old, node) ||
		!equality.Semantic.DeepEqual(old.Labels, node.Labels) ||
		node.Status.Capacity.LayerExecutables > old.Status.Capacity.LayerExecutables) {
		f.nodesFreed++
		out = f.fitting(n, out)
	}
	return out
}

// nodeEpoch is the count of node events that can let a waiting lane place; a reconcile reads
// it before it places and hands it to observeLane.
func (f *fleet) nodeEpoch() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodesFreed
}

// sameWorker reports whether two versions of a node run the same worker on the same platform,
// everything an identity is matched on.
func sameWorker(a, b *v1.MacNode) bool {
	return equality.Semantic.DeepEqual(a.Status.Worker, b.Status.Worker) && equality.Semantic.DeepEqual(a.Status.Platform, b.Status.Platform)
}

// forgetNode drops a deleted node; its placements' lanes are enqueued to retire them.
func (f *fleet) forgetNode(name string) []reconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[name]
	if n == nil {
		return nil
	}
	f.unindex(n)
	n.node = nil
	out := f.placedLanes(n, nil)
	if len(n.placements) == 0 {
		delete(f.nodes, name)
	}
	return out
}

func (f *fleet) placedLanes(n *nodeInfo, out []reconcile.Request) []reconcile.Request {
	for _, p := range n.placements {
		out = append(out, reconcile.Request{NamespacedName: p.lane})
	}
	return out
}

// fitting appends the waiting lanes that fit on n now. Callers hold mu.
func (f *fleet) fitting(n *nodeInfo, out []reconcile.Request) []reconcile.Request {
	if n.node == nil {
		return out
	}
	free := f.free(n)
	set := labels.Set(n.node.Labels)
	for key, l := range f.waiting[nodeKey(n.node)] {
		if l.charge <= free && l.id.Matches(n.node) && l.selector.Matches(set) && !f.placedOn(key, n) {
			out = append(out, reconcile.Request{NamespacedName: key})
		}
	}
	return out
}

func (f *fleet) placedOn(lane types.NamespacedName, n *nodeInfo) bool {
	for _, p := range n.placements {
		if p.lane == lane {
			return true
		}
	}
	return false
}

// observeIdentity records an identity's layers, which its placements charge, and returns the
// lanes that name it when it is new or its spec changed. Its status changes (the lanes that
// use it, rewritten every few seconds while lanes are applied) enqueue nothing: enqueuing every
// lane of the identity on each would place a burst of N lanes N times over.
func (f *fleet) observeIdentity(id *v1.CertifiedIdentity) []reconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.layers[id.Name] = id.Spec.Model.Layers
	if gen, seen := f.identities[id.Name]; seen && gen == id.Generation {
		return nil
	}
	f.identities[id.Name] = id.Generation
	return f.lanesOf(id.Name)
}

// identityGone returns the lanes that name a deleted identity. Its layers stay known: its
// placements, until they go, still hold their shapes.
func (f *fleet) identityGone(name string) []reconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.identities, name)
	return f.lanesOf(name)
}

func (f *fleet) lanesOf(identity string) []reconcile.Request {
	var out []reconcile.Request
	for key, l := range f.lanes {
		if l.identity == identity {
			out = append(out, reconcile.Request{NamespacedName: key})
		}
	}
	return out
}

// observePlacement records a placement as the informer shows it, confirming it if it was
// assumed, and returns its lane if the change matters to it: a placement not made by this
// controller, a new phase, a changed spec or a deletion.
func (f *fleet) observePlacement(p *v1.LanePlacement) []reconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
	lane := types.NamespacedName{Namespace: p.Namespace, Name: p.Spec.Lane}
	old := f.placements[key]
	var relevant bool
	switch {
	case old == nil: // made by someone else, or before this controller started
		relevant = true
	case !old.assumedAt.IsZero(): // the controller's own, counted when it was made
		relevant = p.Status.Phase != "" || !p.DeletionTimestamp.IsZero()
	default:
		relevant = old.obj.Status.Phase != p.Status.Phase || old.obj.Generation != p.Generation ||
			old.obj.Status.ObservedGeneration != p.Status.ObservedGeneration ||
			old.obj.DeletionTimestamp.IsZero() != p.DeletionTimestamp.IsZero()
	}
	if old != nil {
		f.dropLocked(old)
	}
	info := &placementInfo{key: key, lane: lane, node: p.Spec.Node, identity: p.Spec.Identity, obj: p,
		deleting: !p.DeletionTimestamp.IsZero() || (old != nil && old.deleting)}
	f.addLocked(info)
	if !relevant {
		return nil
	}
	return []reconcile.Request{{NamespacedName: lane}}
}

// placementGone drops a deleted placement and returns its lane and the waiting lanes that fit
// in the budget it frees.
func (f *fleet) placementGone(namespace, name string) []reconcile.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := types.NamespacedName{Namespace: namespace, Name: name}
	p := f.placements[key]
	if p == nil {
		return nil
	}
	f.dropLocked(p)
	out := []reconcile.Request{{NamespacedName: p.lane}}
	if n := f.nodes[p.node]; n != nil {
		out = f.fitting(n, out)
	}
	return out
}

// addLocked records a placement under its key, its node and its lane. Callers hold mu.
func (f *fleet) addLocked(p *placementInfo) {
	f.placements[p.key] = p
	f.nodeLocked(p.node).placements[p.key] = p
	if f.byLane[p.lane] == nil {
		f.byLane[p.lane] = map[types.NamespacedName]*placementInfo{}
	}
	f.byLane[p.lane][p.key] = p
}

// dropLocked forgets a placement. Callers hold mu.
func (f *fleet) dropLocked(p *placementInfo) {
	delete(f.placements, p.key)
	delete(f.byLane[p.lane], p.key)
	if len(f.byLane[p.lane]) == 0 {
		delete(f.byLane, p.lane)
	}
	if n := f.nodes[p.node]; n != nil {
		delete(n.placements, p.key)
		if n.node == nil && len(n.placements) == 0 {
			delete(f.nodes, p.node)
		}
	}
}

// lanePlacements returns the lane's live placements, assumed ones included, and the nodes it
// has placements on, those being deleted included (a placement's name is taken until it is
// gone). The objects are shared: read them, copy before changing.
func (f *fleet) lanePlacements(lane types.NamespacedName) (live []*v1.LanePlacement, on map[string]struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	on = map[string]struct{}{}
	for _, p := range f.byLane[lane] {
		if f.expired(p) { // deletes from byLane[lane], which a range allows
			continue
		}
		on[p.node] = struct{}{}
		if !p.deleting {
			live = append(live, p.obj)
		}
	}
	slices.SortFunc(live, func(a, b *v1.LanePlacement) int { return strings.Compare(a.Name, b.Name) })
	return live, on
}

// deleted records that the controller deleted a placement: it counts no longer as one of its
// lane's replicas, and still charges its node until it is gone.
func (f *fleet) deleted(p *v1.LanePlacement) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if info := f.placements[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}]; info != nil {
		info.deleting = true
	}
}

// matches reports whether the named node is known and runs identity exactly.
func (f *fleet) matches(node string, id *v1.CertifiedIdentity) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[node]
	return n != nil && n.node != nil && id.Matches(n.node)
}

// healthy reports whether the named node is known and Ready: scale-down removes placements on
// nodes that are not first, whatever their placements last said.
func (f *fleet) healthy(node string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodes[node]
	return n != nil && n.node != nil && nodeReady(n.node)
}

func nodeReady(n *v1.MacNode) bool {
	return meta.IsStatusConditionTrue(n.Status.Conditions, v1.ConditionReady)
}

// request is one lane's search for nodes.
type request struct {
	lane     types.NamespacedName
	id       *v1.CertifiedIdentity
	selector map[string]string
	rungs    []v1.Rung
	want     int                 // nodes to find
	taken    map[string]struct{} // nodes the lane has placements on
}

// outcome says what a search found: the nodes reserved, and otherwise how many nodes run the
// identity, how many of those the selector takes, and how many of those lack the budget.
type outcome struct {
	chosen                    []string
	matching, selected, short int
}

// reserve finds up to req.want nodes for the lane and charges each at once with an assumed
// placement (made by newPlacement for that node), so that the next lane placed sees them. A
// node qualifies when it runs the identity, the selector takes it, it is schedulable, the lane
// is not on it, and its free budget holds one shape; the best come first (see better). The caller creates the placements and calls forget for any it
// could not create.
func (f *fleet) reserve(req request, newPlacement func(node string) *v1.LanePlacement) outcome {
	f.mu.Lock()
	defer f.mu.Unlock()
	charge := req.id.Spec.Model.Layers
	f.layers[req.id.Name] = charge
	type candidate struct {
		n            *nodeInfo
		cached       int
		charged, cap int32
		count        int
	}
	var out outcome
	var eligible []candidate
	selector := labels.SelectorFromSet(req.selector)
	for _, n := range f.searchSet(identityKeyOf(req.id), req.selector) {
		if !req.id.Matches(n.node) || !selector.Matches(labels.Set(n.node.Labels)) {
			continue
		}
		if _, on := req.taken[n.name]; on || !n.schedulable() {
			continue
		}
		charged := f.charged(n)
		if n.capacity()-charged < charge {
			out.short++
			continue
		}
		eligible = append(eligible, candidate{n: n, cached: cachedRungs(n.node, req.id.Name, req.rungs), charged: charged, cap: n.capacity(), count: len(n.placements)})
	}
	for range req.want {
		if len(eligible) == 0 {
			break
		}
		best := 0
		for i := 1; i < len(eligible); i++ {
			if better(eligible[i].n, eligible[best].n, eligible[i].cached, eligible[best].cached, eligible[i].charged, eligible[best].charged,
				eligible[i].count, eligible[best].count) {
				best = i
			}
		}
		n := eligible[best].n
		eligible = slices.Delete(eligible, best, best+1)
		p := newPlacement(n.name)
		info := &placementInfo{key: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}, lane: req.lane, node: n.name,
			identity: req.id.Name, obj: p, assumedAt: f.clk.Now()}
		if _, known := f.placements[info.key]; !known {
			f.addLocked(info)
		}
		out.chosen = append(out.chosen, n.name)
	}
	if len(out.chosen) < req.want {
		// Said only when the lane stays short: count what stands in the way.
		out.short = 0
		for _, n := range f.byKey[identityKeyOf(req.id)] {
			if !req.id.Matches(n.node) {
				continue
			}
			out.matching++
			if !selector.Matches(labels.Set(n.node.Labels)) {
				continue
			}
			out.selected++
			if _, on := req.taken[n.name]; !on && n.schedulable() && f.free(n) < charge {
				out.short++
			}
		}
	}
	return out
}

// better orders candidate a before b: the smaller share of its budget charged (lanes spread
// over the fleet), then more of the lane's rungs in aned's cache (a cold compile avoided among
// nodes as free as each other), then fewer placements, then the name. The cache does not come
// first: it would pile every lane of a model onto the first node that compiled it.
func better(a, b *nodeInfo, cachedA, cachedB int, chargedA, chargedB int32, countA, countB int) bool {
	// chargedA/capA < chargedB/capB, without division.
	if l, r := int64(chargedA)*int64(b.capacity()), int64(chargedB)*int64(a.capacity()); l != r {
		return l < r
	}
	if cachedA != cachedB {
		return cachedA > cachedB
	}
	if countA != countB {
		return countA < countB
	}
	return a.name < b.name
}

// searchSet is the smallest index set holding every node the identity and selector can take:
// the nodes of the identity's key, or those of one of the selector's labels if fewer.
func (f *fleet) searchSet(key identityKey, selector map[string]string) map[string]*nodeInfo {
	set := f.byKey[key]
	for k, v := range selector {
		if s := f.byLabel[k+"="+v]; len(s) < len(set) {
			set = s
		}
	}
	return set
}

// assumed replaces an assumed placement's object with the one the API server returned.
func (f *fleet) assumed(p *v1.LanePlacement) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if info := f.placements[types.NamespacedName{Namespace: p.Namespace, Name: p.Name}]; info != nil && !info.assumedAt.IsZero() {
		info.obj = p
	}
}

// forget drops an assumed placement that could not be created.
func (f *fleet) forget(namespace, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.placements[types.NamespacedName{Namespace: namespace, Name: name}]; p != nil && !p.assumedAt.IsZero() {
		f.dropLocked(p)
	}
}

// observeLane records a reconciled lane: the identity it names and, if it is short of
// replicas while its identity exists, that it waits for nodes of the identity's key. since is
// the nodeEpoch read before the lane was placed: it reports whether a node that may fit arrived
// meanwhile, whose event found the lane not yet waiting and enqueued nothing (a node turned
// Ready by the lifecycle controller while the lane was being placed), so the lane is placed
// again now rather than at the next node event, which may never come.
func (f *fleet) observeLane(lane *v1.CatalogLane, id *v1.CertifiedIdentity, short bool, since uint64) (missed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	key := types.NamespacedName{Namespace: lane.Namespace, Name: lane.Name}
	f.unwait(key)
	l := &laneInfo{key: key, identity: lane.Spec.IdentityRef.Name}
	f.lanes[key] = l
	if !short || id == nil {
		return false
	}
	l.id, l.selector, l.charge = id, labels.SelectorFromSet(lane.Spec.NodeSelector), id.Spec.Model.Layers
	k := identityKeyOf(id)
	if f.waiting[k] == nil {
		f.waiting[k] = map[types.NamespacedName]*laneInfo{}
	}
	f.waiting[k][key] = l
	return f.nodesFreed != since
}

// forgetLane drops a deleted lane.
func (f *fleet) forgetLane(key types.NamespacedName) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.unwait(key)
	delete(f.lanes, key)
}

func (f *fleet) unwait(key types.NamespacedName) {
	l := f.lanes[key]
	if l == nil || l.id == nil {
		return
	}
	k := identityKeyOf(l.id)
	delete(f.waiting[k], key)
	if len(f.waiting[k]) == 0 {
		delete(f.waiting, k)
	}
}
