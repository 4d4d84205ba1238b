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

package agentcert

import (
	"context"
	"fmt"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers/internal/names"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
)

// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=fleet.synapse.dev/agent-serving,verbs=approve;sign;attest
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=clustertrustbundles,verbs=get;list;watch;create;update

const (
	// CASecret holds the fleet CA (tls.crt, tls.key) in the controller's namespace.
	CASecret = "synapse-fleet-agent-serving-ca"
	// TrustBundle is the ClusterTrustBundle clients read the CA from: a bundle linked to the
	// signer is named for it.
	TrustBundle = "fleet.synapse.dev:agent-serving:ca"
	// CALifetime is the fleet CA's validity.
	CALifetime = 10 * 365 * 24 * time.Hour
	// DefaultCertLifetime and MaxCertLifetime bound a serving certificate: an agent rotates
	// it well before it expires (client-go's certificate manager, at 70-90% of its life).
	DefaultCertLifetime = 24 * time.Hour
	MaxCertLifetime     = 7 * 24 * time.Hour
)

// Condition reasons the controller writes on requests.
const (
	ReasonApproved = "AgentServingApproved"
	ReasonDenied   = "AgentServingDenied"
	ReasonFailed   = "AgentServingSigningFailed"
)

// Controller approves, denies and signs the agents' serving certificate requests.
type Controller struct {
	clk       clock.PassiveClock
	kube      client.Client
	reader    client.Reader
	namespace string
	policy    endpoints.AddressPolicy

	mu sync.Mutex
	// ca is the CA last read from its Secret, at caRead; requests are signed with it for
	// CARecheck before the Secret is read again.
	ca     *CA
	caRead time.Time
}

// CARecheck is how long the CA read from its Secret signs requests before it is read again: a
// CA replaced in the Secret signs from then on, and a fleet's burst of requests does not read
// and parse the Secret once each.
const CARecheck = time.Minute

// signingCA is the CA requests are signed with (EnsureCA, read again after CARecheck).
func (c *Controller) signingCA(ctx context.Context) (*CA, error) {
	c.mu.Lock()
	ca, at := c.ca, c.caRead
	c.mu.Unlock()
	if ca != nil && c.clk.Since(at) < CARecheck {
		return ca, nil
	}
	ca, err := c.EnsureCA(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.ca, c.caRead = ca, c.clk.Now()
	c.mu.Unlock()
	return ca, nil
}

// NewController returns the controller; the CA's Secret (in namespace) and the requesters'
// MacNodes and placements are read uncached, by reader. A request may name the Services of the
// lanes placed on its node (LaneServiceDNSName). kube reads from the manager's cache, with the
// controllers' field indexes (controllers.IndexFields): the other MacNodes that report a
// requested address are listed by one. An IP address is certified only where policy lets the
// lanes' EndpointSlices list it.
func NewController(clk clock.PassiveClock, kube client.Client, reader client.Reader, namespace string, policy endpoints.AddressPolicy) *Controller {
	return &Controller{clk: clk, kube: kube, reader: reader, namespace: namespace, policy: policy}
}

// Name of the controller.
func (c *Controller) Name() string { return "agentcert" }

// Register makes sure the CA and its trust bundle exist once leading, and watches the
// requests of the fleet's signer.
func (c *Controller) Register(_ context.Context, mgr ctrl.Manager) error {
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		_, err := c.EnsureCA(ctx)
		return err
	})); err != nil {
		return err
	}
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		csr, ok := o.(*certificatesv1.CertificateSigningRequest)
		return ok && csr.Spec.SignerName == SignerName
	})
	return ctrl.NewControllerManagedBy(mgr).Named(c.Name()).
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(ours)).
		WithOptions(controller.Options{MaxConcurrentReconciles: MaxConcurrentReconciles}).
		Complete(c)
}

// MaxConcurrentReconciles: judging a request mostly waits on the API server (the node, its
// placements and their Services are read uncached), and every Mac asks for a certificate when
// its lanes change, so a fleet's rollout brings them by the hundred.
const MaxConcurrentReconciles = 4

// Reconcile judges one request, then signs it once approved.
func (c *Controller) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	csr := &certificatesv1.CertificateSigningRequest{}
	if err := c.kube.Get(ctx, req.NamespacedName, csr); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != SignerName || len(csr.Status.Certificate) > 0 ||
		hasCondition(csr, certificatesv1.CertificateDenied) || hasCondition(csr, certificatesv1.CertificateFailed) {
		return reconcile.Result{}, nil
	}
	var node *v1.MacNode
	if name := NodeOf(csr); name != "" {
		// Read from the API server, not the cache: an agent asks for its certificate as soon as
		// its MacNode reports its address, and a cache a moment behind would deny it.
		node = &v1.MacNode{}
		if err := c.reader.Get(ctx, client.ObjectKey{Name: name}, node); apierrors.IsNotFound(err) {
			node = nil
		} else if err != nil {
			return reconcile.Result{}, err
		}
	}
	var services []string
	if node != nil {
		var err error
		if services, err = c.laneServices(ctx, node.Name); err != nil {
			return reconcile.Result{}, err
		}
	}
	parsed, left, verdict := Judge(csr, node, services)
	if verdict == nil {
		var err error
		if verdict, err = c.contested(ctx, node, parsed, services); err != nil {
			return reconcile.Result{}, err
		}
	}
	var added []string
	if verdict == nil {
		added = withPlacedLanes(parsed, services)
	}
	if !hasCondition(csr, certificatesv1.CertificateApproved) {
		cond := certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue,
			Reason: ReasonApproved, Message: "the node's own identity asks for its own names and addresses", LastUpdateTime: metav1.NewTime(c.clk.Now())}
		if len(left) > 0 {
			cond.Message += fmt.Sprintf("; left out of the certificate, as no lane placed on the node holds them (its placement went, or a Service not the lane's holds its name): %s",
				names.Some(left))
		}
		if len(added) > 0 {
			cond.Message += fmt.Sprintf("; also certified for the Services of lanes placed on the node that it does not name (placed since it asked): %s", names.Some(added))
		}
		if verdict != nil {
			cond.Type, cond.Reason, cond.Message = certificatesv1.CertificateDenied, ReasonDenied, verdict.Error()
		}
		csr.Status.Conditions = append(csr.Status.Conditions, cond)
		ctrl.LoggerFrom(ctx).Info("judged an agent serving certificate request", "csr", csr.Name, "requester", csr.Spec.Username, "verdict", cond.Type, "message", cond.Message)
		if err := c.kube.SubResource("approval").Update(ctx, csr); err != nil || verdict != nil {
			return reconcile.Result{}, err
		}
		// Signed in the same pass, from what was just judged: a second pass would read the
		// node, its placements and their Services again for nothing, and a fleet's requests
		// wait in one queue (under a thousand Macs' rollout, a request waited minutes between
		// its approval and its signature, past the agents' wait for their first certificate).
	}
	if verdict != nil {
		// Approved by someone else, but not a request this signer would approve: it signs
		// only what a node may hold.
		return reconcile.Result{}, c.fail(ctx, csr, verdict.Error())
	}
	ca, err := c.signingCA(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var expiration *int32
	if csr.Spec.ExpirationSeconds != nil {
		expiration = csr.Spec.ExpirationSeconds
	}
	cert, err := ca.Sign(parsed, csr.Spec.Usages, expiration, c.clk.Now(), DefaultCertLifetime, MaxCertLifetime)
	if err != nil {
		return reconcile.Result{}, c.fail(ctx, csr, err.Error())
	}
	csr.Status.Certificate = cert
	return reconcile.Result{}, c.kube.SubResource("status").Update(ctx, csr)
}

// laneServices are the Service DNS names of the lanes placed on node, read from the API server
// as the node is: an agent asks for a certificate naming a lane as soon as it sees the lane's
// placement. A lane whose name is taken by a Service that is not its own (one the endpoints
// controller never takes over: kubernetes in default, say) is left out: no Mac is certified for
// another Service's name.
func (c *Controller) laneServices(ctx context.Context, node string) ([]string, error) {
	var ps v1.LanePlacementList
	if err := c.reader.List(ctx, &ps, client.MatchingLabels{v1.LabelNode: node}); err != nil {
		return nil, err
	}
	var out []string
	for _, p := range ps.Items {
		if p.Spec.Node != node || !p.DeletionTimestamp.IsZero() {
			continue
		}
		svc := &corev1.Service{}
		err := c.reader.Get(ctx, client.ObjectKey{Namespace: p.Namespace, Name: p.Spec.Lane}, svc)
		switch {
		case apierrors.IsNotFound(err):
			// Not created yet: the lanes' Service controller creates it, and no one else may
			// take the name from a lane's.
		case err != nil:
			return nil, err
		case !endpoints.LaneService(svc, p.Spec.Lane):
			continue
		}
		out = append(out, v1.LaneServiceDNSName(p.Namespace, p.Spec.Lane))
	}
	return out, nil
}

func (c *Controller) fail(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, msg string) error {
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateFailed,
		Status: corev1.ConditionTrue, Reason: ReasonFailed, Message: msg, LastUpdateTime: metav1.NewTime(c.clk.Now())})
	return c.kube.SubResource("status").Update(ctx, csr)
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// EnsureCA reads the fleet CA from its Secret, creating both on first use, and publishes its
// certificate in the ClusterTrustBundle. Two replicas racing to create it agree on the
// first one written.
func (c *Controller) EnsureCA(ctx context.Context) (*CA, error) {
	s := &corev1.Secret{}
	err := c.reader.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: CASecret}, s)
	if apierrors.IsNotFound(err) {
		certPEM, keyPEM, genErr := NewCA(c.clk.Now(), CALifetime)
		if genErr != nil {
			return nil, genErr
		}
		s = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: CASecret}, Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM}}
		if err = c.kube.Create(ctx, s); apierrors.IsAlreadyExists(err) {
			err = c.reader.Get(ctx, client.ObjectKey{Namespace: c.namespace, Name: CASecret}, s)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("the fleet CA's Secret %s/%s: %w", c.namespace, CASecret, err)
	}
	ca, err := ParseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, err
	}
	return ca, c.publish(ctx, ca)
}

// publish writes the CA's certificate into the trust bundle, if it is not there already.
func (c *Controller) publish(ctx context.Context, ca *CA) error {
	ctb := &certificatesv1.ClusterTrustBundle{}
	err := c.kube.Get(ctx, client.ObjectKey{Name: TrustBundle}, ctb)
	switch {
	case apierrors.IsNotFound(err):
		ctb = &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: TrustBundle},
			Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: SignerName, TrustBundle: string(ca.PEM)}}
		if err := c.kube.Create(ctx, ctb); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("publishing the fleet CA: %w", err)
		}
		return nil
	case err != nil:
		return err
	case ctb.Spec.TrustBundle == string(ca.PEM):
		return nil
	}
	ctb.Spec.TrustBundle = string(ca.PEM)
	return c.kube.Update(ctx, ctb)
}
