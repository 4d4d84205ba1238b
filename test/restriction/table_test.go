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

package restriction

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/statusapply"
	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
)

// row is one write an agent makes. rule is the policy rule that refuses it ("" when it is
// allowed); rbac says the shipped RBAC already refuses it, before admission.
type row struct {
	name string
	act  func(w *world) error
	rule string
	rbac bool
}

// A placement's or MacNode's change, made by the acting identity on a fresh copy.
func updatePlacement(w *world, p *v1.LanePlacement, change func(*v1.LanePlacement)) error {
	got := get(p.DeepCopy())
	change(got)
	return w.as.Update(ctx, got)
}

func updatePlacementStatus(w *world, p *v1.LanePlacement) error {
	got := get(p.DeepCopy())
	got.Status.Phase = v1.PhaseReady
	return w.as.Status().Update(ctx, got)
}

func updateNodeStatus(w *world, name string) error {
	n := node(name)
	n.Status.ServingPort = 8080
	return w.as.Status().Update(ctx, n)
}

// controllerWrites gives the node the conditions the controllers write (as they do, each
// applied on its own), so that a row can try to change them.
func controllerWrites(name string) {
	GinkgoHelper()
	now := metav1.Now()
	for _, c := range []struct {
		manager string
		cond    metav1.Condition
	}{
		{statusapply.LifecycleManager, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionUnknown, Reason: v1.NodeReasonLeaseExpired,
			Message: "the agent's Lease has not been seen renewed", LastTransitionTime: now}},
		{statusapply.AddressManager, metav1.Condition{Type: v1.NodeConditionAddressAllowed, Status: metav1.ConditionFalse,
			Reason: v1.NodeReasonAddressNotAllowed, Message: "outside every allowed CIDR", LastTransitionTime: now}},
	} {
		Expect(statusapply.ApplyCondition(ctx, admin, name, statusapply.Manager(c.manager, c.cond.Type), c.cond)).To(Succeed())
	}
}

// nodeUnknownOn marks the placement NodeReady=False, as the lifecycle controller does when its
// node's Lease expires.
func nodeUnknownOn(p *v1.LanePlacement) {
	GinkgoHelper()
	got := get(p.DeepCopy())
	meta.SetStatusCondition(&got.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionNodeReady, Status: metav1.ConditionFalse,
		Reason: v1.PlacementReasonNodeUnknown, Message: "the node is Unknown", LastTransitionTime: metav1.Now()})
	Expect(admin.Status().Update(ctx, got)).To(Succeed())
}

// agentStatus is a status as the agent reports it, with its own condition types.
func agentStatus() v1.MacNodeStatus {
	now := metav1.Now()
	return v1.MacNodeStatus{ServingPort: 8080, Lanes: 1, Conditions: []metav1.Condition{
		{Type: v1.NodeConditionAgentReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonAgentRunning, Message: "the agent is running", LastTransitionTime: now},
		{Type: v1.NodeConditionPaused, Status: metav1.ConditionFalse, Reason: "NotPaused", Message: "the node serves its lanes", LastTransitionTime: now},
	}}
}

// setNodeCondition has the node write cond into its own MacNode's conditions by a merge patch
// of the whole list, as the agent once wrote Ready.
func setNodeCondition(w *world, cond metav1.Condition) error {
	n := node(w.self)
	stored := n.DeepCopy()
	cond.LastTransitionTime = metav1.Now()
	meta.SetStatusCondition(&n.Status.Conditions, cond)
	return w.as.Status().Patch(ctx, n, client.MergeFrom(stored))
}

func lease(name, namespace, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(holder), RenewTime: ptr.To(metav1.NowMicro())}}
}

// requestCertificate creates a serving certificate request for the node's name from signer, named csr-<node>.
func requestCertificate(w *world, signer string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: w.self}, DNSNames: []string{w.self}}, key)
	Expect(err).NotTo(HaveOccurred())
	_, err = w.cs.CertificatesV1().CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "csr-" + w.self},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: signer, Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}}}, metav1.CreateOptions{})
	return err
}

func requestToken(w *world, node string, lifetime time.Duration) error {
	_, err := w.cs.CoreV1().ServiceAccounts(nodeidentity.Namespace).CreateToken(ctx, nodeidentity.ServiceAccountName(node),
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(lifetime / time.Second))}},
		metav1.CreateOptions{})
	return err
}

// requestTokenFor has self request its own token for audiences.
func requestTokenFor(w *world, audiences []string) error {
	_, err := w.cs.CoreV1().ServiceAccounts(nodeidentity.Namespace).CreateToken(ctx, nodeidentity.ServiceAccountName(w.self),
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences, ExpirationSeconds: ptr.To(int64(3600))}},
		metav1.CreateOptions{})
	return err
}

// apiAudiences are the API server's audiences, as Join recorded them.
func apiAudiences() []string {
	GinkgoHelper()
	cm := &corev1.ConfigMap{}
	Expect(admin.Get(ctx, client.ObjectKey{Namespace: nodeidentity.Namespace, Name: nodeidentity.AudiencesConfigMap}, cm)).To(Succeed())
	Expect(cm.Data[nodeidentity.AudiencesKey]).NotTo(BeEmpty())
	return strings.Split(cm.Data[nodeidentity.AudiencesKey], ",")
}

// recreateOwnNode deletes self's MacNode (as an administrator) and has self create it as
// given, as an agent registers on a fresh cluster.
func recreateOwnNode(w *world, n *v1.MacNode) error {
	Expect(admin.Delete(ctx, node(w.self))).To(Succeed())
	n.Name = w.self
	return w.as.Create(ctx, n)
}

var rows = []row{
	// What an agent must be able to do.
	{name: "registers its own MacNode", act: func(w *world) error { return recreateOwnNode(w, &v1.MacNode{}) }},
	{name: "updates its own MacNode's status", act: func(w *world) error { return updateNodeStatus(w, w.self) }},
	{name: "patches its own MacNode's status", act: func(w *world) error {
		n := node(w.self)
		stored := n.DeepCopy()
		n.Status.Lanes = 2
		return w.as.Status().Patch(ctx, n, client.MergeFrom(stored))
	}},
	{name: "applies its own MacNode's status server-side, with its own condition types, beside the controllers'", act: func(w *world) error {
		controllerWrites(w.self)
		if err := statusapply.ApplyAgentStatus(ctx, w.as, w.self, agentStatus()); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(node(w.self).Status.Conditions, v1.ConditionReady); c == nil || c.Status != metav1.ConditionUnknown {
			return fmt.Errorf("the agent's status changed the controller's Ready condition: %+v", c)
		}
		return nil
	}},
	{name: "applies its own MacNode's status server-side with its compile queue emptied and nothing allocated, after a busy one", act: func(w *world) error {
		busy := agentStatus()
		busy.Allocated = v1.ExecutableBudget{LayerExecutables: 12}
		busy.CompileQueue = v1.CompileQueueSummary{Length: 1, Running: "team-a/lane-a@128", PredictedDrainSeconds: 5}
		if err := statusapply.ApplyAgentStatus(ctx, w.as, w.self, busy); err != nil {
			return err
		}
		// Every field of the queue and of the allocation goes back to its zero value: the
		// apply must clear them, not leave a null the schema refuses (a Mac whose last compile
		// finished could never write its status again).
		if err := statusapply.ApplyAgentStatus(ctx, w.as, w.self, agentStatus()); err != nil {
			return err
		}
		if st := node(w.self).Status; st.CompileQueue != (v1.CompileQueueSummary{}) || st.Allocated != (v1.ExecutableBudget{}) {
			return fmt.Errorf("the idle status left the busy one's queue %+v and allocation %+v", st.CompileQueue, st.Allocated)
		}
		return nil
	}},
	{name: "changes its own condition types on its MacNode beside the controllers'", act: func(w *world) error {
		controllerWrites(w.self)
		return setNodeCondition(w, metav1.Condition{Type: v1.NodeConditionPaused, Status: metav1.ConditionTrue, Reason: "PausedBySpec", Message: "paused"})
	}},
	{name: "applies its own placement's status server-side, with its own condition types, beside the controller's NodeReady", act: func(w *world) error {
		nodeUnknownOn(w.own)
		st := get(w.own.DeepCopy()).Status
		st.Phase = v1.PhaseReady
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: "Ready",
			Message: "serving", LastTransitionTime: metav1.Now()})
		if _, err := statusapply.ApplyAgentPlacementStatus(ctx, w.as, client.ObjectKeyFromObject(w.own), st); err != nil {
			return err
		}
		if c := meta.FindStatusCondition(get(w.own.DeepCopy()).Status.Conditions, v1.PlacementConditionNodeReady); c == nil || c.Status != metav1.ConditionFalse {
			return fmt.Errorf("the agent's status changed the controller's NodeReady condition: %+v", c)
		}
		return nil
	}},
	{name: "creates and renews its own Lease", act: func(w *world) error {
		l := lease(w.self, "synapse-node-lease", w.self)
		if err := w.as.Create(ctx, l); err != nil {
			return err
		}
		l.Spec.RenewTime = ptr.To(metav1.NowMicro())
		return w.as.Update(ctx, l)
	}},
	{name: "updates the status of a placement bound to it", act: func(w *world) error { return updatePlacementStatus(w, w.own) }},
	{name: "removes its retirement finalizer from a placement bound to it", act: func(w *world) error {
		got := get(w.own.DeepCopy())
		stored := got.DeepCopy()
		got.Finalizers = nil
		return w.as.Patch(ctx, got, client.MergeFromWithOptions(stored, client.MergeFromWithOptimisticLock{}))
	}},
	{name: "requests a token for itself", act: func(w *world) error { return requestToken(w, w.self, time.Hour) }},
	{name: "requests a token for itself naming the API server's audiences", act: func(w *world) error { return requestTokenFor(w, apiAudiences()) }},
	{name: "asks the API server who it is", act: func(w *world) error {
		review, err := w.cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err == nil && review.Status.UserInfo.Username != "system:serviceaccount:synapse-nodes:synapse-node-"+w.self {
			return fmt.Errorf("the API server says it is %q", review.Status.UserInfo.Username)
		}
		return err
	}},
	{name: "reviews a caller's token and access, as its API authenticates and authorizes every call", act: func(w *world) error {
		if _, err := w.cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
			Spec: authenticationv1.TokenReviewSpec{Token: "not-a-token", Audiences: []string{"fleet.synapse.dev"}}}, metav1.CreateOptions{}); err != nil {
			return err
		}
		_, err := w.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: "someone", ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "default", Verb: "create",
				Group: v1.GroupVersion.Group, Resource: "cataloglanes", Subresource: "embeddings", Name: "lane"}}}, metav1.CreateOptions{})
		return err
	}},
	{name: "requests a serving certificate from the fleet's signer", act: func(w *world) error { return requestCertificate(w, "fleet.synapse.dev/agent-serving") }},
	{name: "requests a certificate from the kubelet-serving signer", rule: "csr-signer", act: func(w *world) error {
		return requestCertificate(w, certificatesv1.KubeletServingSignerName)
	}},
	{name: "approves its own certificate request", rule: "csr-create-only", act: func(w *world) error {
		if err := requestCertificate(w, "fleet.synapse.dev/agent-serving"); err != nil {
			return err
		}
		csr, err := w.cs.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-"+w.self, metav1.GetOptions{})
		if err != nil {
			return err
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved, Status: "True", Reason: "Self"})
		_, err = w.cs.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{})
		return err
	}, rbac: true},
	{name: "reads its placements, its MacNode and an identity by name", act: func(w *world) error {
		var ps v1.LanePlacementList
		if err := w.as.List(ctx, &ps, client.MatchingLabels{v1.LabelNode: w.self}); err != nil {
			return err
		}
		if err := w.as.Get(ctx, client.ObjectKey{Name: w.self}, &v1.MacNode{}); err != nil {
			return err
		}
		// The world has no identity: a read the RBAC allows finds none (one it refused would be
		// Forbidden). The agent reads identities by name only, and lists or watches none.
		if err := w.as.Get(ctx, client.ObjectKey{Name: "absent"}, &v1.CertifiedIdentity{}); !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	}},

	// Other nodes' objects.
	{name: "registers a MacNode of another name (a fake Mac)", rule: "macnode-own", act: func(w *world) error {
		return w.as.Create(ctx, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Name: w.self + "-fake"}})
	}},
	{name: "updates another node's MacNode status", rule: "macnode-own", act: func(w *world) error { return updateNodeStatus(w, w.other) }},
	{name: "updates the status of another node's placement", rule: "placement-own", act: func(w *world) error { return updatePlacementStatus(w, w.others) }},
	{name: "strips the finalizer of another node's placement", rule: "placement-own", act: func(w *world) error {
		return updatePlacement(w, w.others, func(p *v1.LanePlacement) { p.Finalizers = nil })
	}},
	{name: "changes another node's placement spec", rule: "placement-own", act: func(w *world) error {
		return updatePlacement(w, w.others, func(p *v1.LanePlacement) { p.Spec.PrewarmRungs = []v1.Rung{128} })
	}},
	{name: "creates another node's Lease", rule: "lease-own", act: func(w *world) error {
		Expect(admin.Delete(ctx, lease(w.other, "synapse-node-lease", w.other))).To(Succeed())
		return w.as.Create(ctx, lease(w.other, "synapse-node-lease", w.self))
	}},
	{name: "renews another node's Lease", rule: "lease-own", act: func(w *world) error {
		l := get(lease(w.other, "synapse-node-lease", ""))
		l.Spec.RenewTime = ptr.To(metav1.NowMicro())
		return w.as.Update(ctx, l)
	}},
	{name: "requests another node's token", rule: "token-own", rbac: true, act: func(w *world) error { return requestToken(w, w.other, time.Hour) }},

	// Its own objects, beyond its share.
	{name: "pauses its own MacNode (spec)", rule: "macnode-status-only", rbac: true, act: func(w *world) error {
		n := node(w.self)
		n.Spec.Paused = true
		return w.as.Update(ctx, n)
	}},
	{name: "labels its own MacNode fleet.synapse.dev/*", rule: "macnode-status-only", rbac: true, act: func(w *world) error {
		n := node(w.self)
		n.Labels = map[string]string{"fleet.synapse.dev/trusted": "true"}
		return w.as.Update(ctx, n)
	}},
	{name: "registers its own MacNode with a fleet.synapse.dev/* label", rule: "fleet-labels", act: func(w *world) error {
		return recreateOwnNode(w, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"fleet.synapse.dev/trusted": "true"}}})
	}},
	{name: "registers its own MacNode with a finalizer", rule: "macnode-no-finalizers", act: func(w *world) error {
		return recreateOwnNode(w, &v1.MacNode{ObjectMeta: metav1.ObjectMeta{Finalizers: []string{"example.com/forever"}}})
	}},
	{name: "reports its own MacNode Ready (the Lease decides Ready)", rule: "macnode-conditions", act: func(w *world) error {
		return setNodeCondition(w, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed, Message: "alive"})
	}},
	{name: "turns its own MacNode Ready again over the controller's Unknown, applied server-side", rule: "macnode-conditions", act: func(w *world) error {
		controllerWrites(w.self)
		return statusapply.ApplyCondition(ctx, w.as, w.self, statusapply.AgentManager, metav1.Condition{Type: v1.ConditionReady,
			Status: metav1.ConditionTrue, Reason: v1.NodeReasonLeaseRenewed, Message: "alive", LastTransitionTime: metav1.Now()})
	}},
	{name: "removes the controller's Ready condition from its own MacNode", rule: "macnode-conditions", act: func(w *world) error {
		controllerWrites(w.self)
		n := node(w.self)
		meta.RemoveStatusCondition(&n.Status.Conditions, v1.ConditionReady)
		return w.as.Status().Update(ctx, n)
	}},
	{name: "marks its own placement NodeReady again over the controller's NodeReady=False", rule: "placement-conditions", act: func(w *world) error {
		nodeUnknownOn(w.own)
		p := get(w.own.DeepCopy())
		meta.SetStatusCondition(&p.Status.Conditions, metav1.Condition{Type: v1.PlacementConditionNodeReady, Status: metav1.ConditionTrue,
			Reason: v1.PlacementReasonNodeReady, Message: "alive", LastTransitionTime: metav1.Now()})
		return w.as.Status().Update(ctx, p)
	}},
	{name: "allows its own address (AddressAllowed)", rule: "macnode-conditions", act: func(w *world) error {
		controllerWrites(w.self)
		return setNodeCondition(w, metav1.Condition{Type: v1.NodeConditionAddressAllowed, Status: metav1.ConditionTrue,
			Reason: v1.NodeReasonAddressAllowed, Message: "allowed"})
	}},
	{name: "deletes its own MacNode", rule: "macnode-no-delete", rbac: true, act: func(w *world) error { return w.as.Delete(ctx, node(w.self)) }},
	{name: "changes its own placement's spec", rule: "placement-spec", act: func(w *world) error {
		return updatePlacement(w, w.own, func(p *v1.LanePlacement) { p.Spec.PrewarmRungs = []v1.Rung{128} })
	}},
	{name: "relabels its own placement (fleet.synapse.dev/node)", rule: "fleet-labels", act: func(w *world) error {
		return updatePlacement(w, w.own, func(p *v1.LanePlacement) { p.Labels[v1.LabelNode] = w.other })
	}},
	{name: "adds a finalizer to its own placement", rule: "placement-finalizers", act: func(w *world) error {
		return updatePlacement(w, w.own, func(p *v1.LanePlacement) { p.Finalizers = append(p.Finalizers, "example.com/forever") })
	}},
	{name: "removes another controller's finalizer from its own placement", rule: "placement-finalizers", act: func(w *world) error {
		Expect(updatePlacementAsAdmin(w.own, func(p *v1.LanePlacement) { p.Finalizers = append(p.Finalizers, "example.com/keep") })).To(Succeed())
		return updatePlacement(w, w.own, func(p *v1.LanePlacement) { p.Finalizers = []string{v1.FinalizerRetirement} })
	}},
	{name: "detaches its own placement from its lane (owner references)", rule: "placement-owner", act: func(w *world) error {
		return updatePlacement(w, w.own, func(p *v1.LanePlacement) { p.OwnerReferences = nil })
	}},
	{name: "creates a placement for itself", rule: "placement-update-only", rbac: true, act: func(w *world) error {
		p := w.own.DeepCopy()
		p.ObjectMeta = metav1.ObjectMeta{Name: "extra-" + w.self, Namespace: p.Namespace, Labels: p.Labels}
		p.Status = v1.LanePlacementStatus{}
		return w.as.Create(ctx, p)
	}},
	{name: "deletes its own placement", rule: "placement-update-only", rbac: true, act: func(w *world) error { return w.as.Delete(ctx, get(w.own.DeepCopy())) }},
	{name: "names another holder on its own Lease", rule: "lease-holder", act: func(w *world) error {
		return w.as.Create(ctx, lease(w.self, "synapse-node-lease", w.other))
	}},
	{name: "deletes its own Lease", rule: "lease-no-delete", rbac: true, act: func(w *world) error {
		Expect(admin.Create(ctx, lease(w.self, "synapse-node-lease", w.self))).To(Succeed())
		return w.as.Delete(ctx, lease(w.self, "synapse-node-lease", w.self))
	}},
	{name: "requests a token for itself that lives a year", rule: "token-lifetime", act: func(w *world) error {
		return requestToken(w, w.self, 365*24*time.Hour)
	}},
	{name: "requests a token for itself for another system's audience", rule: "token-audience", act: func(w *world) error {
		return requestTokenFor(w, []string{"vault"})
	}},
	{name: "requests a token for itself for the API server's audiences and another system's", rule: "token-audience", act: func(w *world) error {
		return requestTokenFor(w, append(apiAudiences(), "vault"))
	}},

	// Leases elsewhere: the cluster's own leader elections.
	{name: "creates its Lease in kube-system", rule: "lease-own", rbac: true, act: func(w *world) error {
		return w.as.Create(ctx, lease(w.self, "kube-system", w.self))
	}},
	{name: "takes over kube-system's kube-controller-manager Lease", rule: "lease-own", rbac: true, act: func(w *world) error {
		l := lease(fmt.Sprintf("kube-controller-manager-%d", seq), "kube-system", "kube-controller-manager")
		Expect(admin.Create(ctx, l)).To(Succeed())
		l.Spec.HolderIdentity = ptr.To(w.self)
		return w.as.Update(ctx, l)
	}},
	{name: "takes over the controller's leader-election Lease", rule: "lease-own", rbac: true, act: func(w *world) error {
		l := lease(fmt.Sprintf("synapse-controller-%d", seq), "synapse-system", "synapse-controller")
		Expect(admin.Create(ctx, l)).To(Succeed())
		l.Spec.HolderIdentity = ptr.To(w.self)
		return w.as.Update(ctx, l)
	}},

	// Everything else.
	{name: "creates a CatalogLane", rule: "nothing-else", rbac: true, act: func(w *world) error {
		return w.as.Create(ctx, &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "lane-by-" + w.self, Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "gte", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "gte"},
				Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}})
	}},
	{name: "creates a CertifiedIdentity", rule: "nothing-else", rbac: true, act: func(w *world) error {
		d := v1.Sha256Digest(fmt.Sprintf("sha256:%064x", 1))
		return w.as.Create(ctx, &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "id-by-" + w.self}, Spec: v1.CertifiedIdentitySpec{
			Worker:           v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: d, ProtocolVersion: 3, Backend: v1.BackendSim},
			Model:            v1.ModelIdentity{Name: "gte", Revision: "r", Layers: 22, HiddenSize: 768, EmbeddingDimensions: 768, CheckpointDigest: d},
			ConversionPolicy: v1.ConversionPolicy{Name: "p", Digest: d}, MacOSBuild: "25B78", VectorSpaceID: "gte"}})
	}},
	{name: "creates a Service", rule: "nothing-else", rbac: true, act: func(w *world) error {
		return w.as.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc-" + w.self, Namespace: "default"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}})
	}},
	{name: "creates an EndpointSlice pointing anywhere", rule: "nothing-else", rbac: true, act: func(w *world) error {
		return w.as.Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "eps-" + w.self, Namespace: "default"},
			AddressType: discoveryv1.AddressTypeIPv4, Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.1"}}}})
	}},
	{name: "creates a ServiceAccount in the nodes' namespace", rule: "nothing-else", rbac: true, act: func(w *world) error {
		return w.as.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "synapse-node-" + w.self + "-twin", Namespace: nodeidentity.Namespace}})
	}},
	{name: "deletes another Mac's ServiceAccount", rule: "nothing-else", rbac: true, act: func(w *world) error {
		return w.as.Delete(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: nodeidentity.ServiceAccountName(w.other), Namespace: nodeidentity.Namespace}})
	}},
	{name: "creates a ConfigMap", rule: "nothing-else", rbac: true, act: createConfigMap},
}

// intruderRows act as a ServiceAccount of synapse-nodes that is named for no node: it is in
// the agents' group, so the shipped RBAC lets it write node status; the policies do not.
var intruderRows = []row{
	{name: "writes a MacNode's status", rule: "node-identity", act: func(w *world) error {
		n := node(w.self)
		n.Status.ServingPort = 1
		return w.as.Status().Update(ctx, n)
	}},
	{name: "writes a placement's status", rule: "node-identity", act: func(w *world) error { return updatePlacementStatus(w, w.own) }},
	{name: "renews a Lease", rule: "node-identity", act: func(w *world) error {
		return w.as.Create(ctx, lease(w.self, "synapse-node-lease", w.self))
	}},
}

func updatePlacementAsAdmin(p *v1.LanePlacement, change func(*v1.LanePlacement)) error {
	got := get(p.DeepCopy())
	change(got)
	return admin.Update(ctx, got)
}

// expect checks a row's outcome: allowed, refused by the shipped RBAC, or refused by the
// policies with the message naming the rule.
func expect(err error, r row, policiesOnly bool) {
	GinkgoHelper()
	switch {
	case r.rule == "":
		Expect(err).NotTo(HaveOccurred())
	case r.rbac && !policiesOnly:
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want RBAC's refusal, got %v", err)
		Expect(err.Error()).To(ContainSubstring("cannot"))
	default:
		Expect(apierrors.IsForbidden(err)).To(BeTrue(), "want the policy's refusal, got %v", err)
		Expect(err.Error()).To(ContainSubstring("ValidatingAdmissionPolicy 'synapse-agent-"))
		Expect(err.Error()).To(ContainSubstring("rule " + r.rule + ":"))
	}
}

func entries() []any {
	var out []any
	for _, policiesOnly := range []bool{false, true} {
		mode := "with the shipped RBAC"
		if policiesOnly {
			mode = "with every RBAC right (the policies alone)"
		}
		for _, r := range rows {
			verdict := "may"
			if r.rule != "" {
				verdict = "may not: it"
			}
			out = append(out, Entry(fmt.Sprintf("%s, a node agent %s %s", mode, verdict, r.name), r, policiesOnly))
		}
	}
	return out
}

var _ = Describe("Node restriction", func() {
	DescribeTable("acting as a joined Mac's own identity", append([]any{
		func(r row, policiesOnly bool) {
			w := newWorld(policiesOnly)
			expect(r.act(w), r, policiesOnly)
		}}, entries()...)...,
	)

	DescribeTable("acting as a ServiceAccount of the nodes' namespace named for no node, with every RBAC right", append([]any{
		func(r row) {
			w := newWorld(false)
			seq++
			w.as = intruder(fmt.Sprintf("intruder-%d", seq))
			expect(r.act(w), r, true)
		}}, func() []any {
		var out []any
		for _, r := range intruderRows {
			out = append(out, Entry("it may not: it "+r.name, r))
		}
		return out
	}()...)...,
	)

	It("has at least 25 refusals, and every rule refuses something", func() {
		refused := map[string]bool{}
		for _, r := range append(rows, intruderRows...) {
			if r.rule != "" {
				refused[r.rule] = true
			}
		}
		Expect(len(rows) + len(intruderRows)).To(BeNumerically(">=", 25))
		Expect(refused).To(HaveLen(len(allRules)))
		for _, rule := range allRules {
			Expect(refused).To(HaveKey(rule))
		}
	})
})

// allRules are the rules of config/policies, each of which a row exercises.
var allRules = []string{"node-identity", "macnode-own", "macnode-no-delete", "macnode-status-only", "macnode-conditions", "fleet-labels", "macnode-no-finalizers",
	"placement-update-only", "placement-own", "placement-spec", "placement-conditions", "placement-finalizers", "placement-owner",
	"lease-own", "lease-no-delete", "lease-holder", "token-own", "token-audience", "token-lifetime", "csr-create-only", "csr-signer", "nothing-else"}
