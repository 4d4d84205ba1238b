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

package cli_test

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/kubectl-synapse/cli"
)

var now = time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)

// viewer is what the plugin's caller is granted: get and list of what it reads, as a
// read-only role that lets `kubectl get` read them would, and nothing else.
var viewer = []rbacv1.PolicyRule{
	{APIGroups: []string{v1.GroupVersion.Group}, Resources: []string{"cataloglanes", "laneplacements", "macnodes"}, Verbs: []string{"get", "list"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list"}},
	{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"get", "list"}},
}

// fixture is one spec's namespace, Macs and a kubeconfig of a ServiceAccount granted viewer.
type fixture struct {
	ns, kubeconfig string
	macs           []string
}

func newFixture() *fixture {
	GinkgoHelper()
	f := &fixture{ns: fmt.Sprintf("ks-%d", nextFixture.Add(1))}
	kube := env.Client
	Expect(kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: f.ns}})).To(Succeed())
	if err := kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cli.LeaseNamespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		Expect(err).NotTo(HaveOccurred())
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "platform-engineer"}}
	Expect(kube.Create(ctx, sa)).To(Succeed())
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-viewer"}, Rules: viewer}
	Expect(kube.Create(ctx, role)).To(Succeed())
	Expect(kube.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-viewer"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.ns, Name: sa.Name}}})).To(Succeed())
	DeferCleanup(func() {
		Expect(client.IgnoreNotFound(kube.Delete(ctx, role))).To(Succeed())
		for _, m := range f.macs {
			Expect(client.IgnoreNotFound(kube.Delete(ctx, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: m}}))).To(Succeed())
		}
	})
	cfg, err := env.ServiceAccountConfig(ctx, f.ns, sa.Name)
	Expect(err).NotTo(HaveOccurred())
	kc := clientcmdapi.NewConfig()
	kc.Clusters["envtest"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["platform-engineer"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["envtest"] = &clientcmdapi.Context{Cluster: "envtest", AuthInfo: "platform-engineer", Namespace: f.ns}
	kc.CurrentContext = "envtest"
	f.kubeconfig = filepath.Join(GinkgoT().TempDir(), "kubeconfig")
	Expect(clientcmd.WriteToFile(*kc, f.kubeconfig)).To(Succeed())
	return f
}

// run runs `kubectl synapse ARGS` as the fixture's ServiceAccount and returns its output's
// lines, each with its runs of spaces made one.
func (f *fixture) run(args ...string) ([]string, error) {
	GinkgoHelper()
	var out bytes.Buffer
	cmd := cli.NewCommand(cli.Options{Out: &out, Clock: clocktesting.NewFakePassiveClock(now)})
	cmd.SetArgs(append([]string{"--kubeconfig", f.kubeconfig}, args...))
	err := cmd.ExecuteContext(ctx)
	var lines []string
	for l := range strings.SplitSeq(strings.TrimRight(out.String(), "\n"), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return lines, err
}

func (f *fixture) mac(name string, ready metav1.ConditionStatus, reason string, used, queued int32, running string, drain int32, heartbeat time.Duration) {
	GinkgoHelper()
	name = f.ns + "-" + name
	f.macs = append(f.macs, name)
	n := &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
	Expect(env.Client.Create(ctx, n)).To(Succeed())
	n.Status = v1.MacNodeStatus{
		Platform:     v1.Platform{Chip: "M4", MacOSBuild: "25B78"},
		Worker:       v1.NodeWorker{Backend: v1.BackendSim},
		Capacity:     v1.ExecutableBudget{LayerExecutables: 100},
		Allocated:    v1.ExecutableBudget{LayerExecutables: used},
		CompileQueue: v1.CompileQueueSummary{Length: queued, Running: running, PredictedDrainSeconds: drain},
		Conditions: []metav1.Condition{
			{Type: v1.ConditionReady, Status: ready, Reason: reason, Message: "from the Lease", LastTransitionTime: metav1.NewTime(now)},
			{Type: v1.NodeConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAgentRunning, Message: "running", LastTransitionTime: metav1.NewTime(now)},
		},
	}
	Expect(env.Client.Status().Update(ctx, n)).To(Succeed())
	renewed := metav1.NewMicroTime(now.Add(-heartbeat))
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: cli.LeaseNamespace, Name: name},
		Spec: coordinationv1.LeaseSpec{RenewTime: &renewed}}
	Expect(env.Client.Create(ctx, lease)).To(Succeed())
	DeferCleanup(func() { Expect(client.IgnoreNotFound(env.Client.Delete(ctx, lease))).To(Succeed()) })
}

func (f *fixture) lane(name string, replicas, ready int32, conds ...metav1.Condition) {
	GinkgoHelper()
	l := &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Spec: v1.CatalogLaneSpec{
		Model: "gte-modernbert-base", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
		Rungs: []v1.Rung{128, 512}, Replicas: replicas, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	Expect(env.Client.Create(ctx, l)).To(Succeed())
	for i := range conds {
		conds[i].LastTransitionTime = metav1.NewTime(now)
	}
	l.Status = v1.CatalogLaneStatus{ObservedGeneration: l.Generation, ReadyReplicas: ready, UpdatedReplicas: ready,
		VectorSpaceID: "gte-modernbert-base/e7f32e3", Conditions: conds}
	Expect(env.Client.Status().Update(ctx, l)).To(Succeed())
}

func (f *fixture) placement(lane, mac string, phase v1.PlacementPhase, compile *v1.CompileProgress, fault *v1.Fault, conds ...metav1.Condition) {
	GinkgoHelper()
	mac = f.ns + "-" + mac
	p := &v1.LanePlacement{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: lane + "-" + mac,
		Labels: map[string]string{v1.LabelLane: lane, v1.LabelNode: mac}},
		Spec: v1.LanePlacementSpec{Lane: lane, Node: mac, Identity: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE,
			Rungs: []v1.Rung{128, 512}, Ceiling: 512, MaxResidentShapes: 2, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}
	Expect(env.Client.Create(ctx, p)).To(Succeed())
	for i := range conds {
		conds[i].LastTransitionTime = metav1.NewTime(now)
	}
	p.Status = v1.LanePlacementStatus{Phase: phase, Compile: compile, LastFault: fault, Conditions: conds}
	Expect(env.Client.Status().Update(ctx, p)).To(Succeed())
}

func cond(typ string, status metav1.ConditionStatus, reason, message string) metav1.Condition {
	return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: message}
}

func at(d time.Duration) *metav1.Time { t := metav1.NewTime(now.Add(d)); return &t }

var _ = Describe("kubectl synapse", func() {
	var f *fixture
	BeforeEach(func() {
		f = newFixture()
		f.mac("a", metav1.ConditionTrue, v1.NodeReasonLeaseRenewed, 44, 2, "team/search@512", 95, 4*time.Second)
		f.mac("b", metav1.ConditionUnknown, v1.NodeReasonLeaseExpired, 22, 0, "", 0, 3*time.Minute)
		f.lane("search", 2, 1,
			cond(v1.LaneConditionPlaced, metav1.ConditionTrue, v1.LaneReasonPlaced, "2 of 2 replicas placed"),
			cond(v1.ConditionReady, metav1.ConditionFalse, "Compiling", "1 of 2 replicas ready"),
			cond(v1.LaneConditionProgressing, metav1.ConditionFalse, v1.LaneReasonRolloutComplete, "every placement is current"))
		f.lane("docs", 1, 0,
			cond(v1.LaneConditionPlaced, metav1.ConditionFalse, v1.LaneReasonBudgetFull, "mac-c lacks 6 executables"),
			cond(v1.ConditionReady, metav1.ConditionFalse, v1.LaneReasonBudgetFull, "mac-c lacks 6 executables"))
		f.placement("search", "a", v1.PhaseCompiling,
			&v1.CompileProgress{Rung: 512, LayersDone: 7, LayersTotal: 22, PredictedReadyTime: at(90 * time.Second)}, nil,
			cond(v1.ConditionReady, metav1.ConditionFalse, "Compiling", "rung 512: 7 of 22 layers"),
			cond(v1.PlacementConditionWorkerRunning, metav1.ConditionTrue, "Running", "worker generation 1 is serving"))
		f.placement("search", "b", v1.PhaseFailed, nil,
			&v1.Fault{Code: "ArtifactMissing", Message: "no artifact at the identity's path", Time: metav1.NewTime(now.Add(-2 * time.Minute))},
			cond(v1.ConditionReady, metav1.ConditionFalse, "Failed", "the lane could not be loaded"),
			cond(v1.PlacementConditionArtifactVerified, metav1.ConditionFalse, "ArtifactMissing", "no artifact at the identity's path"))
		Expect(env.Client.Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "search-placed"},
			EventTime: metav1.NewMicroTime(now.Add(-5 * time.Minute)), ReportingController: "synapse-controller", ReportingInstance: "test",
			Action: "Place", Reason: v1.LaneReasonPlaced, Type: corev1.EventTypeNormal, Note: "placed on 2 Macs",
			Regarding: corev1.ObjectReference{Kind: "CatalogLane", Namespace: f.ns, Name: "search"}})).To(Succeed())
		Expect(env.Client.Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "docs-budget"},
			EventTime: metav1.NewMicroTime(now.Add(-time.Minute)), ReportingController: "synapse-controller", ReportingInstance: "test",
			Action: "Place", Reason: v1.LaneReasonBudgetFull, Type: corev1.EventTypeWarning, Note: "mac-c lacks 6 executables",
			Regarding: corev1.ObjectReference{Kind: "CatalogLane", Namespace: f.ns, Name: "docs"}})).To(Succeed())
	})

	It("lists the namespace's lanes with their replicas, space, rollout and why they are not Ready", func() {
		out, err := f.run("lanes")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal([]string{
			"NAMESPACE LANE READY UP-TO-DATE SPACE ROLLOUT WHY NOT READY",
			f.ns + " docs 0/1 0 gte-modernbert-base/e7f32e3 - BudgetFull: mac-c lacks 6 executables",
			f.ns + " search 1/2 1 gte-modernbert-base/e7f32e3 RolloutComplete Compiling: 1 of 2 replicas ready",
		}))
	})

	It("lists the Macs with Ready, executables, lanes, last heartbeat and compile queue", func() {
		out, err := f.run("macs")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainElements(
			fmt.Sprintf("%s-a True LeaseRenewed True AgentRunning 44/100 %s/search 4s 2 (drains in 95s) 25B78 sim", f.ns, f.ns),
			fmt.Sprintf("%s-b Unknown LeaseExpired True AgentRunning 22/100 %s/search 3m 0 25B78 sim", f.ns, f.ns),
		))
	})

	It("lists each Mac's compiles with the placements' layers and ETA, the next ready first", func() {
		f.placement("docs", "a", v1.PhaseCompiling,
			&v1.CompileProgress{Rung: 128, LayersDone: 20, LayersTotal: 28, PredictedReadyTime: at(30 * time.Second)}, nil)
		out, err := f.run("compiles")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainElements(
			fmt.Sprintf("%s-a team/search@512 2 in 95s %s/docs-%[1]s-a 128 20/28 in 30s", f.ns, f.ns),
			fmt.Sprintf("%s-a team/search@512 2 in 95s %s/search-%[1]s-a 512 7/22 in 90s", f.ns, f.ns),
			fmt.Sprintf("%s-b - 0 - - - - -", f.ns),
		))
		Expect(strings.Join(out, "\n")).To(MatchRegexp(`docs-[^\n]*\n[^\n]*search-`), "the placement ready first comes first")
	})

	It("explains a lane from its conditions down to its placements, Macs and events", func() {
		out, err := f.run("why", "search")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(Equal([]string{
			fmt.Sprintf("Lane %s/search: 1 of 2 replicas Ready", f.ns),
			"Placed True Placed: 2 of 2 replicas placed",
			"Ready False Compiling: 1 of 2 replicas ready",
			"Progressing False RolloutComplete: every placement is current",
			"Placements (2):",
			fmt.Sprintf("search-%s-a on %[1]s-a: Compiling", f.ns),
			"Ready False Compiling: rung 512: 7 of 22 layers",
			"compiling rung 512: 7 of 22 layers, ready in 90s",
			fmt.Sprintf("Mac %s-a: Ready True LeaseRenewed", f.ns),
			fmt.Sprintf("search-%s-b on %[1]s-b: Failed", f.ns),
			"Ready False Failed: the lane could not be loaded",
			"ArtifactVerified False ArtifactMissing: no artifact at the identity's path",
			"last fault ArtifactMissing (2m ago): no artifact at the identity's path",
			fmt.Sprintf("Mac %s-b: Ready Unknown LeaseExpired", f.ns),
			"Events (1):",
			"5m ago Normal Placed CatalogLane/search: placed on 2 Macs",
			"Every reason is explained in docs/troubleshooting.md.",
		}))
	})

	It("says which lane it did not find", func() {
		_, err := f.run("why", "nope")
		Expect(err).To(MatchError(fmt.Sprintf("lane nope not found in namespace %s", f.ns)))
	})

	It("reads every namespace with -A", func() {
		out, err := f.run("lanes", "-A")
		Expect(err).NotTo(HaveOccurred())
		Expect(out).To(ContainElement(HavePrefix(f.ns + " search 1/2")))
	})

	It("needs no right beyond get and list", func() {
		for _, args := range [][]string{{"lanes"}, {"macs"}, {"compiles"}, {"why", "docs"}} {
			_, err := f.run(args...)
			Expect(err).NotTo(HaveOccurred(), "kubectl synapse %v", args)
		}
	})

	It("says what it may not read when a right is missing", func() {
		Expect(env.Client.Delete(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: f.ns + "-viewer"}})).To(Succeed())
		Eventually(func(g Gomega) {
			_, err := f.run("lanes")
			g.Expect(err).To(MatchError(ContainSubstring("listing lanes")))
			g.Expect(err).To(MatchError(ContainSubstring("forbidden")))
		}).Should(Succeed())
	})
})

var nextFixture atomic.Int64
