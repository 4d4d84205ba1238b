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

package v1alpha1_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
)

// Valid manifests of each kind, as a user writes them. Each refusal below starts from one of
// these and breaks exactly one rule.
const (
	validLane = `
apiVersion: fleet.synapse.dev/v1alpha1
kind: CatalogLane
metadata: {generateName: lane-, namespace: default}
spec:
  model: gte-modernbert-base
  task: embed
  device: ane
  identityRef: {name: gte-modernbert-base-25b78-w1}
  rungs: [128, 256, 512]
  ceiling: 512
  maxResidentShapes: 2
  replicas: 2
  admissionBoundSeconds: 600
  requestDeadlineSeconds: 30
`
	validIdentity = `
apiVersion: fleet.synapse.dev/v1alpha1
kind: CertifiedIdentity
metadata: {generateName: identity-}
spec:
  worker:
    signingIdentifier: synapse-ane-worker
    binaryDigest: sha256:5b1e0c54a7f0b4b8f3d8a2c9e6f1d0a3b7c4e9f2a1d6b8c3e5f7a9b0c2d4e6f8
    protocolVersion: 3
    backend: ane
  model:
    name: gte-modernbert-base
    revision: e7f32e3
    checkpointDigest: sha256:0d3b4c1f8e2a7b6c5d9e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e
    layers: 22
    hiddenSize: 768
    embeddingDimensions: 768
  conversionPolicy:
    name: ane-fp16-v1
    digest: sha256:9f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a0
  macOSBuild: 25B78
  vectorSpaceID: gte-modernbert-base/e7f32e3
`
	validPolicy = `
apiVersion: fleet.synapse.dev/v1alpha1
kind: PrewarmPolicy
metadata: {generateName: prewarm-, namespace: default}
spec:
  laneSelector: {matchLabels: {tier: search}}
  rungs: [128, 256, 512]
`
	validNode = `
apiVersion: fleet.synapse.dev/v1alpha1
kind: MacNode
metadata: {generateName: mac-}
spec: {}
`
	validPlacement = `
apiVersion: fleet.synapse.dev/v1alpha1
kind: LanePlacement
metadata: {generateName: placement-, namespace: default}
spec:
  lane: gte-search
  node: mac-1
  identity: gte-modernbert-base-25b78-w1
  task: embed
  device: ane
  rungs: [128, 256, 512]
  ceiling: 512
  maxResidentShapes: 2
  admissionBoundSeconds: 600
  requestDeadlineSeconds: 30
  prewarmRungs: [128, 256]
`
)

func manifest(text string) *unstructured.Unstructured {
	GinkgoHelper()
	obj := &unstructured.Unstructured{}
	Expect(yaml.Unmarshal([]byte(text), &obj.Object)).To(Succeed())
	return obj
}

// edit changes one field of a manifest.
type edit func(obj *unstructured.Unstructured)

func set(value any, path ...string) edit {
	return func(obj *unstructured.Unstructured) {
		GinkgoHelper()
		Expect(unstructured.SetNestedField(obj.Object, value, path...)).To(Succeed())
	}
}

func unset(path ...string) edit {
	return func(obj *unstructured.Unstructured) { unstructured.RemoveNestedField(obj.Object, path...) }
}

func rungs(values ...int64) []any {
	out := make([]any, len(values))
	for i, v := range values {
		out[i] = v
	}
	return out
}

// expectRefused asserts that the API server refused the write as invalid, with a message that
// contains every fragment.
func expectRefused(err error, fragments ...string) {
	GinkgoHelper()
	Expect(err).To(HaveOccurred(), "the API server accepted a manifest it should refuse")
	Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected an Invalid error, got: %v", err)
	for _, f := range fragments {
		Expect(err.Error()).To(ContainSubstring(f))
	}
}

var _ = Describe("The samples", func() {
	It("should all be accepted", func() {
		files, err := filepath.Glob(filepath.Join("..", "..", "config", "samples", "fleet_*.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(files).To(HaveLen(5))
		for _, f := range files {
			data, err := os.ReadFile(f)
			Expect(err).NotTo(HaveOccurred())
			for _, doc := range strings.Split(string(data), "\n---\n") {
				obj := manifest(doc)
				Expect(k8sClient.Create(ctx, obj)).To(Succeed(), "sample %s", f)
				Expect(k8sClient.Delete(ctx, obj)).To(Succeed())
			}
		}
	})
})

var _ = Describe("Defaults", func() {
	It("should give a lane one replica, a 600 s admission bound and a 30 s deadline", func() {
		lane := manifest(validLane)
		unset("spec", "replicas")(lane)
		unset("spec", "admissionBoundSeconds")(lane)
		unset("spec", "requestDeadlineSeconds")(lane)
		Expect(k8sClient.Create(ctx, lane)).To(Succeed())
		Expect(lane.Object["spec"]).To(HaveKeyWithValue("replicas", BeEquivalentTo(1)))
		Expect(lane.Object["spec"]).To(HaveKeyWithValue("admissionBoundSeconds", BeEquivalentTo(600)))
		Expect(lane.Object["spec"]).To(HaveKeyWithValue("requestDeadlineSeconds", BeEquivalentTo(30)))
	})

	It("should give a prewarm policy the rungs 128, 256 and 512", func() {
		policy := manifest(validPolicy)
		unset("spec", "rungs")(policy)
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		got, _, err := unstructured.NestedSlice(policy.Object, "spec", "rungs")
		Expect(err).NotTo(HaveOccurred())
		Expect(got).To(Equal(rungs(128, 256, 512)))
	})
})

var _ = Describe("Placements", func() {
	It("should refuse a change of a placement's identity or vector space: a new identity is a new placement", func() {
		p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Name: "immutable-identity", Namespace: "default"},
			Spec: v1.LanePlacementSpec{Lane: "gte", Node: "mac", Identity: "gte-r1", VectorSpaceID: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE,
				Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		changed := p.DeepCopy()
		changed.Spec.Identity = "gte-r2"
		expectRefused(k8sClient.Update(ctx, changed), "identity is immutable")
		changed = p.DeepCopy()
		changed.Spec.VectorSpaceID = "gte-v2"
		expectRefused(k8sClient.Update(ctx, changed), "vectorSpaceID is immutable")
	})
})

var _ = Describe("A lane's status", func() {
	It("should hold the nodes of the largest rollout allowed, old and new together", func() {
		lane := manifest(validLane)
		Expect(k8sClient.Create(ctx, lane)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, lane)).To(Succeed()) })
		// spec.replicas and spec.rollout.maxSurge at their maximum: a blue/green's new
		// placements beside the old.
		nodes := make([]string, v1.MaxStatusNodes)
		for i := range nodes {
			nodes[i] = fmt.Sprintf("mac-%03d", i)
		}
		key := client.ObjectKeyFromObject(lane)
		_, err := statusapply.ApplyLanePlacementStatus(ctx, k8sClient, key, v1.CatalogLaneStatus{Replicas: 512, UpdatedReplicas: 256, Nodes: nodes,
			Conditions: []metav1.Condition{{Type: v1.LaneConditionPlaced, Status: metav1.ConditionTrue, Reason: v1.LaneReasonPlaced,
				Message: "512 of 256 replicas placed", LastTransitionTime: metav1.Unix(1_800_000_000, 0)}}})
		Expect(err).NotTo(HaveOccurred())
	})
})

var _ = Describe("A manifest that breaks a rule", func() {
	DescribeTable("should be refused with a message that says what to fix",
		func(base string, change edit, fragments ...string) {
			obj := manifest(base)
			change(obj)
			expectRefused(k8sClient.Create(ctx, obj), fragments...)
		},
		// CatalogLane
		Entry("a lane without a device", validLane, unset("spec", "device"),
			"spec.device: Required value"),
		Entry("a lane on another device", validLane, set("gpu", "spec", "device"),
			`spec.device: Unsupported value: "gpu": supported values: "ane"`),
		Entry("a lane with an unknown task", validLane, set("classify", "spec", "task"),
			`spec.task: Unsupported value: "classify": supported values: "embed", "rerank"`),
		Entry("a lane without a model", validLane, unset("spec", "model"),
			"spec.model: Required value"),
		Entry("a lane whose model name has capitals", validLane, set("GTE-ModernBERT", "spec", "model"),
			"spec.model: Invalid value", "should match"),
		Entry("a lane without an identity", validLane, unset("spec", "identityRef"),
			"spec.identityRef: Required value"),
		Entry("a lane with an empty identity name", validLane, set("", "spec", "identityRef", "name"),
			"spec.identityRef.name", "at least 1 chars long"),
		Entry("a lane without rungs", validLane, unset("spec", "rungs"),
			"spec.rungs: Required value"),
		Entry("a lane with an empty ladder", validLane, set(rungs(), "spec", "rungs"),
			"spec.rungs", "at least 1 items"),
		Entry("a lane with a rung that is not a multiple of 64", validLane, set(rungs(128, 300), "spec", "rungs"),
			"spec.rungs[1]", "multiple of 64"),
		Entry("a lane with a rung below 64", validLane, set(rungs(0, 128), "spec", "rungs"),
			"spec.rungs[0]", "greater than or equal to 64"),
		Entry("a lane with a rung above 8192", validLane, set(rungs(128, 16384), "spec", "rungs"),
			"spec.rungs[1]", "less than or equal to 8192"),
		Entry("a lane with descending rungs", validLane, set(rungs(512, 256, 128), "spec", "rungs"),
			"rungs must be in ascending order, for example [128, 256, 512]"),
		Entry("a lane with a duplicate rung", validLane, set(rungs(128, 128, 256), "spec", "rungs"),
			"spec.rungs[1]: Duplicate value: 128"),
		Entry("a lane with nine rungs", validLane, set(rungs(64, 128, 192, 256, 320, 384, 448, 512, 576), "spec", "rungs"),
			"spec.rungs", "must have at most 8 items"),
		Entry("a lane whose ceiling exceeds its largest rung", validLane, set(int64(1024), "spec", "ceiling"),
			"ceiling must not exceed the largest rung: add a larger rung or lower the ceiling"),
		Entry("a lane whose batch bound is below its largest rung", validLane, set(int64(100), "spec", "maxBatchTokens"),
			"maxBatchTokens must be at least the ceiling (or the largest rung), or no single input could be served"),
		Entry("a lane with no room to run a call", validLane, set(int64(0), "spec", "maxConcurrentRequests"),
			"spec.maxConcurrentRequests", "should be greater than or equal to 1"),
		Entry("a lane with more resident shapes than rungs", validLane, set(int64(4), "spec", "maxResidentShapes"),
			"maxResidentShapes must not exceed the number of rungs"),
		Entry("a lane whose admission bound exceeds 600 s", validLane, set(int64(601), "spec", "admissionBoundSeconds"),
			"spec.admissionBoundSeconds", "less than or equal to 600"),
		Entry("a lane with a zero admission bound", validLane, set(int64(0), "spec", "admissionBoundSeconds"),
			"spec.admissionBoundSeconds", "greater than or equal to 1"),
		Entry("a lane whose deadline exceeds 600 s", validLane, set(int64(3600), "spec", "requestDeadlineSeconds"),
			"spec.requestDeadlineSeconds", "less than or equal to 600"),
		Entry("a lane with negative replicas", validLane, set(int64(-1), "spec", "replicas"),
			"spec.replicas", "greater than or equal to 0"),
		Entry("a lane whose name has a dot, which no Service name may", validLane, set("gte.v2", "metadata", "name"),
			"metadata.name must be a DNS-1035 label"),
		Entry("a lane whose name starts with a digit", validLane, set("2gte", "metadata", "name"),
			"metadata.name must be a DNS-1035 label"),
		Entry("a lane whose name is longer than a label value may be", validLane, set("gte-"+strings.Repeat("a", 60), "metadata", "name"),
			"metadata.name must be a DNS-1035 label"),
		Entry("a lane with a negative maxUnavailable", validLane, set(int64(-1), "spec", "rollout", "maxUnavailable"),
			"spec.rollout.maxUnavailable", "greater than or equal to 0"),
		Entry("a lane whose rollout could neither add a placement nor retire one", validLane, set(int64(0), "spec", "rollout", "maxSurge"),
			"spec.rollout", "maxSurge and maxUnavailable must not both be 0", "set maxSurge to 1 (a spare node) or maxUnavailable to 1"),
		Entry("a lane with a zero progress deadline", validLane, set(int64(0), "spec", "rollout", "progressDeadlineSeconds"),
			"spec.rollout.progressDeadlineSeconds", "greater than or equal to 1"),

		// CertifiedIdentity
		Entry("an identity whose binary digest is not SHA-256", validIdentity,
			set("md5:0123456789abcdef0123456789abcdef", "spec", "worker", "binaryDigest"),
			"spec.worker.binaryDigest: Invalid value", `should match '^sha256:[a-f0-9]{64}$'`),
		Entry("an identity whose checkpoint digest has capitals", validIdentity,
			set("sha256:0D3B4C1F8E2A7B6C5D9E0F1A2B3C4D5E6F708192A3B4C5D6E7F8091A2B3C4D5E", "spec", "model", "checkpointDigest"),
			"spec.model.checkpointDigest: Invalid value"),
		Entry("an identity for protocol 2", validIdentity, set(int64(2), "spec", "worker", "protocolVersion"),
			"spec.worker.protocolVersion", "greater than or equal to 3"),
		Entry("an identity without a worker backend", validIdentity, unset("spec", "worker", "backend"),
			"spec.worker.backend: Required value"),
		Entry("an identity for an unknown worker backend", validIdentity, set("gpu", "spec", "worker", "backend"),
			`spec.worker.backend: Unsupported value: "gpu": supported values: "ane", "sim"`),
		Entry("an identity with a version number for a macOS build", validIdentity, set("26.1", "spec", "macOSBuild"),
			"spec.macOSBuild: Invalid value"),
		Entry("an identity without a macOS build", validIdentity, unset("spec", "macOSBuild"),
			"spec.macOSBuild: Required value"),
		Entry("an identity of a model with no layers", validIdentity, set(int64(0), "spec", "model", "layers"),
			"spec.model.layers", "greater than or equal to 1"),
		Entry("an identity of a model whose width is not a multiple of 64", validIdentity, set(int64(1000), "spec", "model", "hiddenSize"),
			"spec.model.hiddenSize", "multiple of 64"),
		Entry("an identity without a vector space", validIdentity, unset("spec", "vectorSpaceID"),
			"spec.vectorSpaceID: Required value"),
		Entry("an identity without a conversion policy digest", validIdentity, unset("spec", "conversionPolicy", "digest"),
			"spec.conversionPolicy.digest: Required value"),
		Entry("an identity whose signing identifier has spaces", validIdentity, set("synapse ane worker", "spec", "worker", "signingIdentifier"),
			"spec.worker.signingIdentifier: Invalid value"),

		// PrewarmPolicy
		Entry("a prewarm policy with descending rungs", validPolicy, set(rungs(512, 128), "spec", "rungs"),
			"rungs must be in ascending order"),
		Entry("a prewarm policy with a rung that is not a multiple of 64", validPolicy, set(rungs(100), "spec", "rungs"),
			"spec.rungs[0]", "multiple of 64"),
		Entry("a prewarm policy with a malformed selector", validPolicy,
			set([]any{map[string]any{"key": "tier", "operator": "Near"}}, "spec", "laneSelector", "matchExpressions"),
			"laneSelector.matchExpressions operator must be In, NotIn, Exists or DoesNotExist"),
		Entry("a prewarm policy whose In expression has no values", validPolicy,
			set([]any{map[string]any{"key": "tier", "operator": "In"}}, "spec", "laneSelector", "matchExpressions"),
			"In and NotIn need values, Exists and DoesNotExist take none"),

		// LanePlacement
		Entry("a placement that prewarms a rung outside its ladder", validPlacement, set(rungs(128, 1024), "spec", "prewarmRungs"),
			"prewarmRungs must be rungs of the lane's ladder"),
		Entry("a placement without a ceiling", validPlacement, unset("spec", "ceiling"),
			"spec.ceiling: Required value"),
		Entry("a placement without a node", validPlacement, unset("spec", "node"),
			"spec.node: Required value"),
	)

	DescribeTable("in status should be refused",
		func(base string, status map[string]any, fragments ...string) {
			obj := manifest(base)
			Expect(k8sClient.Create(ctx, obj)).To(Succeed())
			obj.Object["status"] = status
			expectRefused(k8sClient.Status().Update(ctx, obj), fragments...)
		},
		Entry("a node serving on port 70000", validNode, map[string]any{"servingPort": int64(70000)},
			"status.servingPort", "less than or equal to 65535"),
		Entry("a node with an unknown worker backend", validNode, map[string]any{"worker": map[string]any{"backend": "gpu"}},
			`status.worker.backend: Unsupported value: "gpu": supported values: "ane", "sim"`),
		Entry("a node claiming more than 100 layer executables", validNode, map[string]any{"capacity": map[string]any{"layerExecutables": int64(120)}},
			"status.capacity.layerExecutables", "less than or equal to 100"),
		Entry("a placement in an unknown phase", validPlacement, map[string]any{"phase": "Sleeping"},
			`status.phase: Unsupported value: "Sleeping"`),
		Entry("a placement on an unknown backend", validPlacement, map[string]any{"backend": "gpu"},
			`status.backend: Unsupported value: "gpu": supported values: "ane", "sim"`),
		Entry("a simulated probe that reports measured times", validPlacement,
			map[string]any{"probes": []any{map[string]any{"rung": int64(128), "simulated": true, "deviceMicroseconds": int64(200), "cpuMicroseconds": int64(500), "ratio": "0.40"}}},
			"a simulated probe reports no measured times"),
		Entry("a placement keeping more than 5 worker warnings", validPlacement,
			map[string]any{"workerWarnings": map[string]any{"count": int64(6), "recent": []any{"a", "b", "c", "d", "e", "f"}}},
			"status.workerWarnings.recent", "must have at most 5 items"),
	)
})

var _ = Describe("Immutability", func() {
	It("should refuse any change to an identity's spec and say to create a new one", func() {
		identity := manifest(validIdentity)
		Expect(k8sClient.Create(ctx, identity)).To(Succeed())
		set("25C56", "spec", "macOSBuild")(identity)
		expectRefused(k8sClient.Update(ctx, identity),
			"spec is immutable: create a new CertifiedIdentity for a new worker, model, conversion policy or macOS build")
	})

	It("should still let the controller write an identity's status", func() {
		identity := manifest(validIdentity)
		Expect(k8sClient.Create(ctx, identity)).To(Succeed())
		identity.Object["status"] = map[string]any{"matchingNodes": int64(3)}
		Expect(k8sClient.Status().Update(ctx, identity)).To(Succeed())
	})

	It("should refuse moving a placement to another node", func() {
		placement := manifest(validPlacement)
		Expect(k8sClient.Create(ctx, placement)).To(Succeed())
		set("mac-2", "spec", "node")(placement)
		expectRefused(k8sClient.Update(ctx, placement), "node is immutable: a move is a new placement")
	})

	It("should let a placement's prewarm rungs change", func() {
		placement := manifest(validPlacement)
		Expect(k8sClient.Create(ctx, placement)).To(Succeed())
		set(rungs(128), "spec", "prewarmRungs")(placement)
		Expect(k8sClient.Update(ctx, placement)).To(Succeed())
	})
})
