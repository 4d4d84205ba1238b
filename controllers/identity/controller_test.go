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

package identity_test

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/identity"
)

var seq int

func reconcileIdentity(ctl *identity.Controller, id *v1.CertifiedIdentity) *v1.CertifiedIdentity {
	GinkgoHelper()
	_, err := ctl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(id)})
	Expect(err).NotTo(HaveOccurred())
	out := &v1.CertifiedIdentity{}
	if err := kube.Get(ctx, client.ObjectKeyFromObject(id), out); apierrors.IsNotFound(err) {
		return nil
	} else {
		Expect(err).NotTo(HaveOccurred())
	}
	return out
}

var _ = Describe("Identities", func() {
	It("should count the nodes that match, list the lanes that use it, and block its deletion until none does", func() {
		seq++
		digest := v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 1000+seq))
		id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("gte-%d", seq)},
			Spec: v1.CertifiedIdentitySpec{
				Worker: v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
				Model: v1.ModelIdentity{Name: "gte", Revision: "r1", Layers: 22, HiddenSize: 768, EmbeddingDimensions: 768,
					CheckpointDigest: "sha256:0d3b4c1f8e2a7b6c5d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"},
				ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: "sha256:9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"},
				MacOSBuild:       "25B78", VectorSpaceID: "gte"}}
		Expect(kube.Create(ctx, id)).To(Succeed())
		for i, build := range []v1.MacOSBuild{"25B78", "25B78", "25C56"} {
			n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("mac-%d-%d", seq, i)}}
			Expect(kube.Create(ctx, n)).To(Succeed())
			n.Status.Platform.MacOSBuild = build
			n.Status.Worker = v1.NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim}
			Expect(kube.Status().Update(ctx, n)).To(Succeed())
		}
		lane := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lane-%d", seq), Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: id.Name},
				Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, lane)).To(Succeed())

		ctl := identity.NewController(clocktesting.NewFakeClock(time.Now()), kube, events.NewFakeRecorder(10))
		reconcileIdentity(ctl, id) // adds the finalizer
		got := reconcileIdentity(ctl, id)
		Expect(got.Finalizers).To(ContainElement(v1.FinalizerInUse))
		Expect(got.Status.MatchingNodes).To(BeEquivalentTo(2), "the node on another macOS build does not match")
		Expect(got.Status.Lanes).To(Equal([]string{"default/" + lane.Name}))
		Expect(got.Status.LaneCount).To(BeEquivalentTo(1))
		Expect(meta.IsStatusConditionTrue(got.Status.Conditions, v1.IdentityConditionMatched)).To(BeTrue())

		Expect(kube.Delete(ctx, got)).To(Succeed())
		got = reconcileIdentity(ctl, id)
		Expect(got).NotTo(BeNil(), "an identity in use was deleted")
		Expect(meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady).Reason).To(Equal(v1.IdentityReasonInUse))

		// The lane moves to another identity; its old placement still runs this one.
		p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: lane.Name + "-mac", Namespace: "default", Finalizers: []string{v1.FinalizerRetirement}},
			Spec: v1.LanePlacementSpec{Lane: lane.Name, Node: "mac", Identity: id.Name, Task: v1.TaskEmbed, Device: v1.DeviceANE,
				Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(kube.Create(ctx, p)).To(Succeed())
		Expect(kube.Delete(ctx, lane)).To(Succeed())
		got = reconcileIdentity(ctl, id)
		Expect(got).NotTo(BeNil(), "an identity a placement runs was deleted")
		Expect(meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady).Message).To(ContainSubstring(p.Name))

		Expect(kube.Delete(ctx, p)).To(Succeed())
		Expect(reconcileIdentity(ctl, id)).NotTo(BeNil(), "the placement's worker still runs until its agent retires it")
		Expect(kube.Get(ctx, client.ObjectKeyFromObject(p), p)).To(Succeed())
		p.Finalizers = nil
		Expect(kube.Update(ctx, p)).To(Succeed())
		Expect(reconcileIdentity(ctl, id)).To(BeNil(), "the identity stayed after its last lane and placement went")
	})

	It("should write a change of its lanes alone at most every LanesInterval, and a change of its matching nodes at once", func() {
		seq++
		digest := v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 3000+seq))
		id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%d", seq)},
			Spec: v1.CertifiedIdentitySpec{
				Worker: v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
				Model: v1.ModelIdentity{Name: "gte", Revision: "r1", Layers: 22, HiddenSize: 768, EmbeddingDimensions: 768,
					CheckpointDigest: "sha256:0d3b4c1f8e2a7b6c5d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"},
				ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: "sha256:9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"},
				MacOSBuild:       "25B78", VectorSpaceID: "gte"}}
		Expect(kube.Create(ctx, id)).To(Succeed())
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%d", seq)}}
		Expect(kube.Create(ctx, ns)).To(Succeed())
		addLane := func(i int) {
			GinkgoHelper()
			Expect(kube.Create(ctx, &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lane-%d", i), Namespace: ns.Name},
				Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: id.Name},
					Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}})).To(Succeed())
		}
		addNode := func(i int) {
			GinkgoHelper()
			n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("burst-%d-%d", seq, i)}}
			Expect(kube.Create(ctx, n)).To(Succeed())
			n.Status.Platform.MacOSBuild = "25B78"
			n.Status.Worker = v1.NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim}
			Expect(kube.Status().Update(ctx, n)).To(Succeed())
		}
		clk := clocktesting.NewFakeClock(time.Now())
		ctl := identity.NewController(clk, kube, events.NewFakeRecorder(10))
		step := func() (reconcile.Result, *v1.CertifiedIdentity) {
			GinkgoHelper()
			res, err := ctl.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(id)})
			Expect(err).NotTo(HaveOccurred())
			got := &v1.CertifiedIdentity{}
			Expect(kube.Get(ctx, client.ObjectKeyFromObject(id), got)).To(Succeed())
			return res, got
		}
		addNode(0)
		step() // adds the finalizer
		res, got := step()
		Expect(res.RequeueAfter).To(BeZero(), "the first write waited")
		Expect(got.Status.MatchingNodes).To(BeEquivalentTo(1))
		Expect(got.Status.LaneCount).To(BeZero())

		addLane(0)
		res, got = step()
		Expect(res.RequeueAfter).To(Equal(identity.LanesInterval), "a lane right after a write was not held back")
		Expect(got.Status.LaneCount).To(BeZero(), "a change of the lanes alone was written within LanesInterval")

		clk.Step(2 * time.Second)
		addLane(1)
		res, got = step()
		Expect(res.RequeueAfter).To(Equal(identity.LanesInterval-2*time.Second), "the wait is counted from the last write")
		Expect(got.Status.LaneCount).To(BeZero())

		addNode(1)
		res, got = step()
		Expect(res.RequeueAfter).To(BeZero())
		Expect(got.Status.MatchingNodes).To(BeEquivalentTo(2), "a change of the matching nodes waited")
		Expect(got.Status.LaneCount).To(BeEquivalentTo(2), "the write of the nodes left out the lanes held back")

		addLane(2)
		res, got = step()
		Expect(res.RequeueAfter).To(Equal(identity.LanesInterval))
		Expect(got.Status.LaneCount).To(BeEquivalentTo(2))
		clk.Step(identity.LanesInterval)
		res, got = step()
		Expect(res.RequeueAfter).To(BeZero())
		Expect(got.Status.LaneCount).To(BeEquivalentTo(3), "the lanes held back were never written")
		Expect(got.Status.Lanes).To(Equal([]string{ns.Name + "/lane-0", ns.Name + "/lane-1", ns.Name + "/lane-2"}))

		res, _ = step()
		Expect(res.RequeueAfter).To(BeZero(), "nothing to change still asked to come back")
	})

	It("should count every lane that uses it and list the first ones by name, however many there are", func() {
		seq++
		digest := v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 2000+seq))
		id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("busy-%d", seq)},
			Spec: v1.CertifiedIdentitySpec{
				Worker: v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: v1.BackendSim},
				Model: v1.ModelIdentity{Name: "gte", Revision: "r1", Layers: 22, HiddenSize: 768, EmbeddingDimensions: 768,
					CheckpointDigest: "sha256:0d3b4c1f8e2a7b6c5d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e"},
				ConversionPolicy: v1.ConversionPolicy{Name: "ane-fp16-v1", Digest: "sha256:9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0"},
				MacOSBuild:       "25B78", VectorSpaceID: "gte"}}
		Expect(kube.Create(ctx, id)).To(Succeed())
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("busy-%d", seq)}}
		Expect(kube.Create(ctx, ns)).To(Succeed())
		const lanes = identity.ListedLanes + 20
		for i := range lanes {
			Expect(kube.Create(ctx, &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("lane-%03d", i), Namespace: ns.Name},
				Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: id.Name},
					Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}})).To(Succeed())
		}
		ctl := identity.NewController(clocktesting.NewFakeClock(time.Now()), kube, events.NewFakeRecorder(10))
		reconcileIdentity(ctl, id)
		got := reconcileIdentity(ctl, id)
		Expect(got.Status.LaneCount).To(BeEquivalentTo(lanes))
		Expect(got.Status.Lanes).To(HaveLen(identity.ListedLanes))
		Expect(got.Status.Lanes[0]).To(Equal(ns.Name + "/lane-000"))

		Expect(kube.Delete(ctx, got)).To(Succeed())
		got = reconcileIdentity(ctl, id)
		Expect(meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady).Message).To(
			ContainSubstring(fmt.Sprintf("used by %d lanes: %s/lane-000", lanes, ns.Name)))
		Expect(meta.FindStatusCondition(got.Status.Conditions, v1.ConditionReady).Message).To(ContainSubstring("and 115 more"))
	})
})
