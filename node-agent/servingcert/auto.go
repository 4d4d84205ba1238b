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

// Package servingcert is where the agent's HTTP API gets its TLS serving certificate: from the
// cluster's CSR API under the fleet's own signer, rotated before it expires by client-go's
// certificate manager, as a kubelet gets its serving certificate (Auto); or from files an
// administrator provides (Files).
package servingcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// SignerName is the fleet's signer of agent serving certificates, whose approver and signer is
// synapse-controller (controllers/agentcert): it issues a node only its own name and addresses.
const SignerName = "fleet.synapse.dev/agent-serving"

const (
	// DefaultWaitTimeout bounds the wait for the first certificate: minutes without one mean
	// that nothing could be requested, or the request was denied, or no approver is running,
	// unless the request is still waiting its turn (see MaxPendingWait).
	DefaultWaitTimeout = 2 * time.Minute
	// MaxPendingWait bounds the wait for the first certificate while its request is pending,
	// not judged: a signer with a fleet's requests queued (a thousand Macs booting at once, or
	// placed on at once) judges one in minutes, and an agent that gave up after the wait
	// timeout started again and asked again, at the back of the queue. make scale at a
	// thousand Macs saw 1,088 such restarts, each adding a request and a drain, until the
	// fleet collapsed; at 600 Macs, 21.
	MaxPendingWait = 15 * time.Minute
	// ProgressInterval is how often a wait for the first certificate says what it waits for.
	ProgressInterval = 15 * time.Second
)

// usages are a TLS server's, for the ECDSA key the manager generates (no key encipherment:
// client-go's DefaultKubeletServingGetUsages asks the same of an ECDSA key).
var usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}

// Config configures an Auto source.
type Config struct {
	// Node is the node's name: the certificate's subject (CN=<node>) and its DNS name.
	Node string
	// Addresses are the IP addresses the node advertises (its MacNode's InternalIP), which the
	// certificate names beside the node's name.
	Addresses []string
	// Client is the node's own identity: the signer approves only a request it made.
	Client kubernetes.Interface
	// Dir keeps the certificate and its key across restarts (client-go's file store, as the
	// kubelet's pki directory); "" keeps them in memory.
	Dir string
	// Lifetime is asked of the signer (spec.expirationSeconds; 0: the signer's default).
	Lifetime time.Duration
	// WaitTimeout bounds the wait for the first certificate (DefaultWaitTimeout if zero).
	WaitTimeout time.Duration
	Clock       clock.WithTicker
	Log         logr.Logger
}

// Auto obtains the serving certificate through the CSR API and keeps it fresh: client-go's
// certificate manager requests a new one at 70 to 90% of the current one's lifetime (jittered,
// so a fleet started together does not rotate together), and GetCertificate hands every new
// TLS connection the current one, so a rotation needs no restart of the listener.
type Auto struct {
	cfg    Config
	client *recordingClient
	store  certificate.Store

	mu sync.Mutex
	// template is what the next request asks for: the node's name and addresses, and the
	// Service names of the lanes placed on it (ServeLanes), sorted.
	template *x509.CertificateRequest
	// reported says whether the node's MacNode reports its addresses yet; the template is
	// withheld until it does, since the signer approves only addresses the MacNode reports.
	reported func() bool
	open     bool // latched once reported
	// onIssued is called after each certificate is stored (OnIssued).
	onIssued func()
	// handed are the templates last handed to the manager, newest first: its template read
	// and its request's creation are a round trip apart, and its template loop may read a
	// newer one meanwhile. held is the one the last request asked with (since heldSince),
	// handed to the manager instead of a newer one while that request waits (for MaxHold at
	// most), and once it is answered (answered, at answeredAt) for a few seconds while the
	// certificate names all the template asks (see currentTemplate).
	handed                [3]*x509.CertificateRequest
	held                  *x509.CertificateRequest
	heldSince, answeredAt time.Time
	answered              bool
	// refused are the lanes' Service names the signer left out of a certificate whose request
	// asked for them, and when: they are not asked for again for RefusedRetry, or the
	// manager, never satisfied by what it got, would ask again every second.
	refused map[string]time.Time

	manager atomic.Pointer[certificate.Manager]
	// latest is the last certificate stored; issued is signalled each time one is.
	latest atomic.Pointer[tls.Certificate]
	issued chan struct{}

	expiry   prometheus.Gauge
	failures prometheus.Counter
}

// New returns an Auto source; Obtain starts it.
func New(cfg Config) (*Auto, error) {
	if cfg.Node == "" || cfg.Client == nil || cfg.Clock == nil {
		return nil, errors.New("servingcert: a node name, a client and a clock are required")
	}
	if cfg.WaitTimeout == 0 {
		cfg.WaitTimeout = DefaultWaitTimeout
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cfg.Node}, DNSNames: []string{cfg.Node}}
	for _, a := range cfg.Addresses {
		ip := net.ParseIP(a)
		if ip == nil {
			return nil, fmt.Errorf("servingcert: %q is not an IP address", a)
		}
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	}
	s := &Auto{cfg: cfg, template: tmpl, issued: make(chan struct{}, 1), refused: map[string]time.Time{},
		expiry: prometheus.NewGauge(prometheus.GaugeOpts{Name: "synapse_agent_serving_certificate_expiration_timestamp_seconds",
			Help: "When the HTTP API's current serving certificate expires (Unix time); it is renewed at 70 to 90% of its lifetime."}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{Name: "synapse_agent_serving_certificate_renewal_failures_total",
			Help: "Attempts to obtain a serving certificate that failed (the request could not be made, was denied, or was not signed in time)."}),
	}
	s.client = &recordingClient{Interface: cfg.Client, onCreate: s.requested}
	var inner certificate.Store = &memoryStore{}
	if cfg.Dir != "" {
		fs, err := newFileStore(cfg.Dir, cfg.Log)
		if err != nil {
			return nil, err
		}
		inner = fs
	}
	s.store = &notifyingStore{Store: inner, onUpdate: s.stored}
	return s, nil
}

// Obtain starts obtaining the certificate, and renewing it until ctx ends, once reported says
// the node's MacNode reports its addresses; it returns when the first certificate is there (at
// once if the store holds a valid one), or after the wait timeout (MaxPendingWait while its
// request waits for its answer) with a *NotIssuedError that says what became of the request.
func (s *Auto) Obtain(ctx context.Context, reported func() bool) error {
	s.mu.Lock()
	s.reported = reported
	s.mu.Unlock()
	// The manager logs through the context's logger (klog's contextual logging).
	mctx := klog.NewContext(ctx, s.cfg.Log)
	m, err := certificate.NewManager(&certificate.Config{
		ClientsetFn:                  func(*tls.Certificate) (kubernetes.Interface, error) { return s.client, nil },
		GetTemplate:                  s.currentTemplate,
		SignerName:                   SignerName,
		Usages:                       usages,
		RequestedCertificateLifetime: lifetime(s.cfg.Lifetime),
		CertificateStore:             s.store,
		CertificateRenewFailure:      s.failures,
		Name:                         "serving-certificate",
		Ctx:                          &mctx,
	})
	if err != nil {
		return fmt.Errorf("the serving certificate's manager: %w", err)
	}
	s.manager.Store(&m)
	if c := m.Current(); c != nil {
		s.expiry.Set(float64(c.Leaf.NotAfter.Unix()))
		s.cfg.Log.Info("serving with the stored certificate; it is renewed before it expires", "notAfter", c.Leaf.NotAfter.UTC())
	}
	m.Start()
	return s.waitFirst(ctx)
}

func lifetime(d time.Duration) *time.Duration {
	if d == 0 {
		return nil
	}
	return &d
}

// currentTemplate is the manager's GetTemplate: nil (ask for nothing yet) until the node
// reports its addresses; else the template, or the one the last request asked with (held)
// while that request waits and, for a few seconds once answered, while the certificate names
// all both ask.
//
// client-go's manager, handed a template its pending request does not match, stops waiting
// for that request and makes another (kubernetes/client-go util/certificate/
// certificate_manager.go, the dynamic template loop: "if we're currently waiting on a
// submitted request that no longer matches what we want, stop waiting"). In a rollout a Mac
// learns of its lanes one after another, so it abandoned request after request, each new one
// at the back of the signer's queue, and the signer judged every abandoned one for nothing.
// Held, the request keeps its place; the signer certifies with it the Services of the lanes
// placed on the node since (controllers/agentcert, withPlacedLanes). Answered, it stays what
// the manager is handed while the certificate satisfies the template: the manager acts on a
// template-changed signal queued while it waited by comparing the template with its last
// request alone, not with the certificate, and would ask again for names it already has.
func (s *Auto) currentTemplate() *x509.CertificateRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.open {
		if s.reported == nil || !s.reported() {
			return nil
		}
		s.open = true
	}
	if s.held != nil {
		var keep bool
		if s.answered {
			latest := s.latest.Load()
			// Not when the certificate left out a name the request asked for (refused): the
			// manager, never satisfied by the request, would ask with it again and again.
			keep = latest != nil && satisfies(latest.Leaf, s.template) && satisfies(latest.Leaf, s.held) &&
				s.cfg.Clock.Since(s.answeredAt) < answeredHold
		} else {
			// Before the first certificate the agent waits on a pending request for
			// MaxPendingWait: its request is not to be abandoned sooner.
			hold := MaxHold
			if s.latest.Load() == nil {
				hold = MaxPendingWait
			}
			keep = s.cfg.Clock.Since(s.heldSince) < hold
		}
		if keep {
			s.hand(s.held)
			return s.held
		}
		s.held, s.answered = nil, false
	}
	s.hand(s.template)
	return s.template
}

// hand records t as handed to the manager.
func (s *Auto) hand(t *x509.CertificateRequest) {
	if s.handed[0] != t {
		s.handed = [3]*x509.CertificateRequest{t, s.handed[0], s.handed[1]}
	}
}

// satisfies reports whether leaf names every DNS name and IP address t asks for (as the
// manager judges a certificate against its template).
func satisfies(leaf *x509.Certificate, t *x509.CertificateRequest) bool {
	if leaf == nil || leaf.Subject.CommonName != t.Subject.CommonName {
		return false
	}
	for _, n := range t.DNSNames {
		if !slices.Contains(leaf.DNSNames, n) {
			return false
		}
	}
	for _, ip := range t.IPAddresses {
		if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// answeredHold is how long an answered request's template is still handed to the manager: it
// acts on a template-changed signal queued while it waited within about a second of the
// answer (its rotation loop runs every second). Held longer, the next rotation would ask with
// that request's names rather than the lanes placed then.
const answeredHold = 5 * time.Second

// MaxHold bounds how long a request waiting to be judged holds back a newer template: a
// request the signer has not judged by then (a signer down, or denying it again and again) no
// longer keeps new lanes' names out of the next request.
const MaxHold = 5 * time.Minute

// requested is told of each request made, with the DNS names it asked for: the template it
// was made from (the newest handed that asks for them, though a newer one was handed since)
// is held from then (currentTemplate). A request made again with the template
// held while its request waits (the manager asking again after a denial) keeps the hold's
// start.
func (s *Auto) requested(asked []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.IndexFunc(s.handed[:], func(t *x509.CertificateRequest) bool { return t != nil && slices.Equal(t.DNSNames, asked) })
	if i < 0 {
		return
	}
	if s.held == s.handed[i] && !s.answered {
		return
	}
	s.held, s.heldSince, s.answered = s.handed[i], s.cfg.Clock.Now(), false
}

// stored is called with every certificate the manager stores: the first, and each rotation.
func (s *Auto) stored(c *tls.Certificate) {
	s.latest.Store(c)
	s.expiry.Set(float64(c.Leaf.NotAfter.Unix()))
	s.cfg.Log.Info("a serving certificate was issued; new connections get it", "request", s.client.last(),
		"notBefore", c.Leaf.NotBefore.UTC(), "notAfter", c.Leaf.NotAfter.UTC(), "dnsNames", c.Leaf.DNSNames)
	select {
	case s.issued <- struct{}{}:
	default:
	}
	s.mu.Lock()
	if s.held != nil {
		s.answered, s.answeredAt = true, s.cfg.Clock.Now()
	}
	issued := s.onIssued
	var refused []string
	for _, name := range s.client.askedFor() {
		if name != s.cfg.Node && !slices.Contains(c.Leaf.DNSNames, name) {
			s.refused[name] = s.cfg.Clock.Now()
			refused = append(refused, name)
		}
	}
	if len(refused) > 0 {
		s.setNamesLocked(slices.DeleteFunc(slices.Clone(s.template.DNSNames), func(n string) bool { return slices.Contains(refused, n) }))
	}
	s.mu.Unlock()
	if len(refused) > 0 {
		s.cfg.Log.Info("the signer left lanes' Service names out of the certificate (its request's Approved condition says why); they are asked for again in a while",
			"names", refused, "retryIn", RefusedRetry)
	}
	if issued != nil {
		issued()
	}
}

// ServeLanes says which lanes are placed on the node: the certificate names their Services
// (<lane>.<namespace>.svc), so that a client calling a
// lane through its Service verifies the node's certificate. A lane added asks for a new
// certificate within a second (the manager checks its template every second and replaces a
// certificate that lacks a name the template holds: kubernetes/client-go
// util/certificate/certificate_manager.go, certSatisfiesTemplateLocked), or, while a request
// waits to be judged, is certified with it (currentTemplate). A lane removed stays named
// until the next rotation.
func (s *Auto) ServeLanes(lanes []types.NamespacedName) {
	var want []string
	for _, l := range lanes {
		want = append(want, v1.LaneServiceDNSName(l.Namespace, l.Name))
	}
	slices.Sort(want)
	want = slices.Compact(want)
	s.mu.Lock()
	defer s.mu.Unlock()
	names := []string{s.cfg.Node}
	for _, n := range want {
		if at, ok := s.refused[n]; ok && s.cfg.Clock.Since(at) < RefusedRetry {
			continue
		}
		names = append(names, n)
	}
	// A lane that left the node and comes back is asked for anew.
	for n := range s.refused {
		if !slices.Contains(want, n) {
			delete(s.refused, n)
		}
	}
	s.setNamesLocked(names)
}

// RefusedRetry is how long a lane's Service name the signer left out of the certificate is not
// asked for again (the lane's name is another Service's, say).
const RefusedRetry = 10 * time.Minute

// setNamesLocked makes names the template's DNS names: a new template, never the one handed to
// the manager changed under it.
func (s *Auto) setNamesLocked(names []string) {
	if slices.Equal(s.template.DNSNames, names) {
		return
	}
	t := *s.template
	t.DNSNames = names
	s.template = &t
}

// NamesLane says whether the current certificate names the lane's Service: a placement of it
// is not Ready until it does, or a call through the Service would fail to verify. A name the
// signer refused counts as named: the lane has no Service of its own to be called through (its
// name is another Service's), and its placement serves calls to the node.
func (s *Auto) NamesLane(lane types.NamespacedName) bool {
	s.mu.Lock()
	_, refused := s.refused[v1.LaneServiceDNSName(lane.Namespace, lane.Name)]
	s.mu.Unlock()
	if refused {
		return true
	}
	c, err := s.GetCertificate(nil)
	if err != nil || c.Leaf == nil {
		return false
	}
	return slices.Contains(c.Leaf.DNSNames, v1.LaneServiceDNSName(lane.Namespace, lane.Name))
}

// OnIssued has f called after each certificate is issued (the agent then writes its
// placements' status again: a lane waiting for its Service name may be Ready now).
func (s *Auto) OnIssued(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onIssued = f
}

// waitFirst waits until a certificate is there, saying every ProgressInterval what it waits
// for, and at most the wait timeout; while the request waits for its answer, at most
// MaxPendingWait.
func (s *Auto) waitFirst(ctx context.Context) error {
	if m := s.manager.Load(); m != nil && (*m).Current() != nil {
		return nil
	}
	start := s.cfg.Clock.Now()
	deadline := s.cfg.Clock.NewTimer(s.cfg.WaitTimeout)
	defer deadline.Stop()
	progress := s.cfg.Clock.NewTicker(ProgressInterval)
	defer progress.Stop()
	for {
		select {
		case <-s.issued:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("waiting for the serving certificate: %w", ctx.Err())
		case <-progress.C():
			s.cfg.Log.Info("waiting for the serving certificate", "state", s.state(ctx))
		case <-deadline.C():
			state, waiting := s.stateOf(ctx)
			waited := s.cfg.Clock.Since(start)
			if left := MaxPendingWait - waited; waiting && left > 0 {
				s.cfg.Log.Info("the certificate request waits its turn with the signer; the agent waits on, and asks for nothing new meanwhile",
					"state", state, "waited", waited.Round(time.Second), "waitsAtMost", MaxPendingWait)
				deadline.Reset(min(s.cfg.WaitTimeout, left))
				continue
			}
			s.failures.Inc()
			return &NotIssuedError{Waited: waited.Round(time.Second), Request: s.client.last(), State: state}
		}
	}
}

// errNoCertificate is a handshake's answer while there is no valid certificate (before the
// first, or after the current one expired unrenewed).
var errNoCertificate = errors.New("no valid serving certificate: the request to signer " + SignerName + " is not signed yet, or the last certificate expired unrenewed")

// GetCertificate is the TLS server's: the manager's current certificate, or the one just
// stored if it is newer. The manager makes a certificate current only after its store returns
// it, so in that instant (the first one included) the one just stored is served, if it has not
// expired; NamesLane reads the same.
func (s *Auto) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	latest := s.latest.Load()
	if latest != nil && !s.cfg.Clock.Now().Before(latest.Leaf.NotAfter) {
		latest = nil
	}
	if m := s.manager.Load(); m != nil {
		// The one just stored, if the manager has not made it current yet: a placement made
		// Ready because it names the lane's Service is served with it.
		if c := (*m).Current(); c != nil && (latest == nil || latest == c || latest.Leaf.NotAfter.Before(c.Leaf.NotAfter)) {
			return c, nil
		}
	}
	if latest != nil {
		return latest, nil
	}
	return nil, errNoCertificate
}

// Describe and Collect make the source's metrics part of the agent's.
func (s *Auto) Describe(ch chan<- *prometheus.Desc) {
	s.expiry.Describe(ch)
	s.failures.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *Auto) Collect(ch chan<- prometheus.Metric) {
	s.expiry.Collect(ch)
	s.failures.Collect(ch)
}

// NotIssuedError says that no certificate came within the wait, and what became of the request.
type NotIssuedError struct {
	// Waited is how long the agent waited.
	Waited time.Duration
	// Request is the last certificate signing request made ("" if none was).
	Request string
	// State is what became of it.
	State string
}

func (e *NotIssuedError) Error() string {
	return fmt.Sprintf("no serving certificate from signer %s within %s: %s", SignerName, e.Waited, e.State)
}
