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

package finalizers

import (
	"context"
	"fmt"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
)

// digest is the worker binary every stand-in Mac reports and the identities approve.
var digest = v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 42))

// mac stands in for a Mac's agent in the cluster, as its own joined identity: it registers its
// MacNode, heartbeats its Lease, and retires its placements that are being deleted (removes
// their retirement finalizer), every 200 ms until stopped, as the agent would.
type mac struct {
	name string
	as   client.Client
	stop context.CancelFunc
	done chan struct{}
}

var (
	macsMu  sync.Mutex
	running []*mac
)

func startMac(name string) *mac {
	GinkgoHelper()
	joined, err := nodeidentity.Join(ctx, kubernetes.NewForConfigOrDie(env.Config), nodeidentity.JoinOptions{Node: name,
		Server: env.Config.Host, CAData: env.Config.CAData, Lifetime: time.Hour, Dir: GinkgoT().TempDir()})
	Expect(err).NotTo(HaveOccurred())
	cfg, err := clientcmd.BuildConfigFromFlags("", joined.Kubeconfig)
	Expect(err).NotTo(HaveOccurred())
	m := &mac{name: name, done: make(chan struct{})}
	m.as, err = client.New(cfg, client.Options{Scheme: env.Scheme})
	Expect(err).NotTo(HaveOccurred())

	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(m.as.Create(ctx, n)).To(Succeed())
	Expect(m.heartbeat()).To(Succeed())
	runCtx, cancel := context.WithCancel(ctx)
	m.stop = cancel
	go func() {
		defer close(m.done)
		for {
			select {
			case <-runCtx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			_ = m.heartbeat()
			_ = m.retire()
		}
	}()
	macsMu.Lock()
	running = append(running, m)
	macsMu.Unlock()
	return m
}

// die stops the Mac's agent, as a crash does: nothing of it renews or retires any more.
func (m *mac) die() {
	m.stop()
	<-m.done
}

func stopMacs() {
	macsMu.Lock()
	defer macsMu.Unlock()
	for _, m := range running {
		m.die()
	}
	running = nil
}

// heartbeat renews the Lease and reports the node's approved worker.
func (m *mac) heartbeat() error {
	l := &coordinationv1.Lease{}
	err := m.as.Get(ctx, client.ObjectKey{Namespace: "synapse-node-lease", Name: m.name}, l)
	switch {
	case apierrors.IsNotFound(err):
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: m.name, Namespace: "synapse-node-lease"},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(m.name), RenewTime: ptr.To(metav1.NowMicro())}}
		err = m.as.Create(ctx, l)
	case err == nil:
		l.Spec.RenewTime = ptr.To(metav1.NowMicro())
		err = m.as.Update(ctx, l)
	}
	if err != nil {
		return err
	}
	// The agent's own report, written as the agent writes it; the lifecycle controller turns
	// the node Ready from the Lease.
	return statusapply.ApplyAgentStatus(ctx, m.as, m.name, v1.MacNodeStatus{
		Platform:    v1.Platform{Chip: "M4", MacOSBuild: "25B78"},
		Worker:      v1.NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
		Capacity:    v1.ExecutableBudget{LayerExecutables: 100},
		Addresses:   []v1.NodeAddress{{Type: "InternalIP", Address: "192.0.2.10"}},
		ServingPort: 8080,
		Conditions: []metav1.Condition{{Type: v1.NodeConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAgentRunning,
			Message: "the agent is running", LastTransitionTime: metav1.Now()}},
	})
}

// retire removes the retirement finalizer of the Mac's placements being deleted.
func (m *mac) retire() error {
	var ps v1.LanePlacementList
	if err := m.as.List(ctx, &ps, client.MatchingLabels{v1.LabelNode: m.name}); err != nil {
		return err
	}
	for i := range ps.Items {
		p := &ps.Items[i]
		if p.DeletionTimestamp.IsZero() || !controllerutil.ContainsFinalizer(p, v1.FinalizerRetirement) {
			continue
		}
		stored := p.DeepCopy()
		controllerutil.RemoveFinalizer(p, v1.FinalizerRetirement)
		if err := m.as.Patch(ctx, p, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{})); client.IgnoreNotFound(err) != nil {
			return err
		}
	}
	return nil
}

// collectGarbage does what the garbage collector (which envtest does not run) does for a
// deleted lane: its placements, owned by it, are deleted.
func collectGarbage() {
	GinkgoHelper()
	var ps v1.LanePlacementList
	Expect(admin.List(ctx, &ps)).To(Succeed())
	for i := range ps.Items {
		p := &ps.Items[i]
		owner := metav1.GetControllerOf(p)
		if owner == nil || !p.DeletionTimestamp.IsZero() {
			continue
		}
		lane := &v1.CatalogLane{}
		err := admin.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: owner.Name}, lane)
		if apierrors.IsNotFound(err) || (err == nil && lane.UID != owner.UID) {
			Expect(client.IgnoreNotFound(admin.Delete(ctx, p))).To(Succeed())
		}
	}
}
