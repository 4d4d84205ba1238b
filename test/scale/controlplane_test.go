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

package scale

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

// controllerUser is the controller's identity: the ServiceAccount config/rbac binds.
const controllerUser = "system:serviceaccount:synapse-system:synapse-controller"

// auditPolicy records the controller's writes only: they are what the report attributes to it
// (writes per placement, writes of a resync), and recording nothing else keeps the audit log
// off the API server's critical path.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: ["` + controllerUser + `"]
  verbs: ["create", "update", "patch", "delete", "deletecollection"]
- level: None
`

// controlPlane is etcd and a kube-apiserver whose certificates live in a directory of ours, so
// it can be killed and started again with its clients' credentials still good.
type controlPlane struct {
	env    *envtest.Environment
	Config *rest.Config
	Scheme *k8sruntime.Scheme
	Client client.Client
	dir    string
	audit  string
}

func startControlPlane(dir string) (*controlPlane, error) {
	certs := filepath.Join(dir, "apiserver")
	if err := os.MkdirAll(certs, 0o700); err != nil {
		return nil, err
	}
	cp := &controlPlane{dir: dir, audit: filepath.Join(dir, "audit.log")}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return nil, err
	}
	// A restarted API server loads every object from etcd while the whole fleet retries against
	// it: at a thousand Macs on two cores that takes longer than envtest's default 20 s to
	// be healthy (the full-size run's API server storm failed so), and a longer bound costs
	// nothing when it starts quickly.
	// envtest sets every component's StartTimeout to the Environment's ControlPlaneStartTimeout
	// (sigs.k8s.io/controller-runtime pkg/envtest/server.go, Start), so the bound is set there:
	// one set on the APIServer alone was overwritten with the 20 s default.
	api := &envtest.APIServer{CertDir: certs}
	api.Configure().Set("audit-policy-file", policy).Set("audit-log-path", cp.audit).
		Set("audit-log-format", "json").
		// A Service per lane: envtest's default range (a /24) holds 254, a real cluster's
		// default a /12.
		Set("service-cluster-ip-range", "10.96.0.0/12")
	cp.env = &envtest.Environment{CRDDirectoryPaths: []string{testenv.CRDDir()}, ErrorIfCRDPathMissing: true,
		ControlPlane: envtest.ControlPlane{APIServer: api}, ControlPlaneStartTimeout: 5 * time.Minute, ControlPlaneStopTimeout: 2 * time.Minute}
	cfg, err := cp.env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane (run 'make test' or 'make scale' so that KUBEBUILDER_ASSETS points at the binaries hack/envtest.sh builds): %w", err)
	}
	cp.Config = cfg
	cp.Scheme = k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(cp.Scheme); err != nil {
		return nil, err
	}
	if err := v1.AddToScheme(cp.Scheme); err != nil {
		return nil, err
	}
	if cp.Client, err = client.New(cfg, client.Options{Scheme: cp.Scheme}); err != nil {
		return nil, err
	}
	return cp, nil
}

func (cp *controlPlane) Stop() error { return cp.env.Stop() }

// restartAPIServer kills the kube-apiserver, as a crash would, and starts it again on the same
// port with the same certificates; etcd keeps running, so nothing stored is lost.
func (cp *controlPlane) restartAPIServer() error {
	s := cp.env.ControlPlane.GetAPIServer()
	pid, err := cp.apiServerPID()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	if err := s.Stop(); err != nil {
		return err
	}
	return s.Start()
}

func (cp *controlPlane) apiServerPID() (int, error) {
	return pidWithArg("--cert-dir=" + cp.env.ControlPlane.GetAPIServer().CertDir)
}

func (cp *controlPlane) etcdPID() (int, error) {
	return pidWithArg("--data-dir=" + cp.env.ControlPlane.Etcd.DataDir)
}

// pidWithArg finds the process one of whose arguments is arg (Linux: /proc).
func pidWithArg(arg string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(cmdline), "\x00"), arg) {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("no process has the argument %s", arg)
}

// requestCounts are API requests by "verb resource[/subresource]"; those refused are counted
// again under "throttled (429) ..." and "rejected by priority level ...", which name no verb, so
// total never counts them twice.
type requestCounts map[string]float64

func (r requestCounts) minus(before requestCounts) requestCounts {
	out := requestCounts{}
	for k, v := range r {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

func (r requestCounts) total(verbs ...string) float64 {
	var sum float64
	for k, v := range r {
		if verb, _, _ := strings.Cut(k, " "); len(verbs) == 0 || slices.Contains(verbs, verb) {
			sum += v
		}
	}
	return sum
}

// writeVerbs are the writes, as the API server's metrics (POST, PUT, ...) and its audit log
// (create, update, ...) name them.
var writeVerbs = []string{"POST", "PUT", "PATCH", "DELETE", "APPLY", "DELETECOLLECTION", "CREATE", "UPDATE"}

// apiRequests scrapes the API server's apiserver_request_total: every request it has answered,
// whoever sent it.
func (cp *controlPlane) apiRequests(ctx context.Context) (requestCounts, error) {
	families, err := scrapeREST(ctx, cp.Config, "/metrics")
	if err != nil {
		return nil, err
	}
	out := requestCounts{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		l := labelsOf(m)
		res := l["resource"]
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		out[l["verb"]+" "+res] += m.GetCounter().GetValue()
		if l["code"] == "429" {
			out["throttled (429)"] += m.GetCounter().GetValue()
			out["throttled (429) "+l["verb"]+" "+res] += m.GetCounter().GetValue()
		}
	}
	// Which priority level refused them, and why (queue full, time out in queue, ...): the
	// API server's own account (kubernetes/website content/en/docs/concepts/cluster-administration/
	// flow-control.md, "apiserver_flowcontrol_rejected_requests_total").
	for _, m := range families["apiserver_flowcontrol_rejected_requests_total"].GetMetric() {
		l := labelsOf(m)
		out["rejected by priority level "+l["priority_level"]+" ("+l["reason"]+")"] += m.GetCounter().GetValue()
	}
	return out, nil
}

// profile writes the API server's CPU profile over the next seconds to path (its
// /debug/pprof, which kube-apiserver serves with --profiling, its default, to a caller allowed
// the non-resource URL: the harness's own administrator).
func (cp *controlPlane) profile(ctx context.Context, seconds int, path string) error {
	hc, err := rest.HTTPClientFor(cp.Config)
	if err != nil {
		return err
	}
	return saveProfile(ctx, hc, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", strings.TrimSuffix(cp.Config.Host, "/"), seconds), path)
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.GetLabel() {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// scrapeREST reads a Prometheus text endpoint of the API server, retrying as scrapeHTTP does.
func scrapeREST(ctx context.Context, cfg *rest.Config, path string) (families map[string]*dto.MetricFamily, err error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	err = retry.OnError(retry.DefaultBackoff, func(error) bool { return ctx.Err() == nil }, func() error {
		families, err = scrapeRESTOnce(ctx, hc, strings.TrimSuffix(cfg.Host, "/")+path)
		return err
	})
	return families, err
}

func scrapeRESTOnce(ctx context.Context, hc *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

func parseMetrics(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// auditLog reads the controller's writes from the API server's audit log.
type auditLog struct {
	path string
	mu   sync.Mutex
	off  int64
	all  []auditEvent
}

type auditEvent struct {
	At       time.Time
	Verb     string
	Resource string // resource[/subresource]
	// Manager is a patch's or apply's field manager (its fieldManager parameter), which says
	// which controller wrote a status two of them write parts of.
	Manager string
	// Code is the answer's HTTP status: a write refused (a create of a name that exists, a
	// conflict) is counted apart from one that wrote.
	Code int
	// Namespace and Name of the object written.
	Namespace, Name string
}

// read takes in what the log gained since the last read.
func (a *auditLog) read() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	f, err := os.Open(a.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(a.off, 0); err != nil {
		return err
	}
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			break // a partial last line is read next time
		}
		a.off += int64(len(line))
		var e struct {
			Verb      string `json:"verb"`
			Stage     string `json:"stage"`
			ObjectRef *struct {
				Resource, Subresource, Namespace, Name string
			} `json:"objectRef"`
			RequestURI     string `json:"requestURI"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
		}
		if json.Unmarshal(line, &e) != nil || e.ObjectRef == nil || e.Stage != "ResponseComplete" {
			continue
		}
		res := e.ObjectRef.Resource
		if e.ObjectRef.Subresource != "" {
			res += "/" + e.ObjectRef.Subresource
		}
		var manager string
		if e.Verb == "patch" {
			if u, err := url.Parse(e.RequestURI); err == nil {
				manager = u.Query().Get("fieldManager")
			}
		}
		code := 0
		if e.ResponseStatus != nil {
			code = e.ResponseStatus.Code
		}
		a.all = append(a.all, auditEvent{At: e.RequestReceivedTimestamp, Verb: e.Verb, Resource: res, Manager: manager, Code: code,
			Namespace: e.ObjectRef.Namespace, Name: e.ObjectRef.Name})
	}
	return nil
}

// between returns the controllers' writes received in [from, to), by "verb resource", for a
// patch "verb resource (field manager)", and for a write refused "... refused CODE";
// leader-election writes (the Lease in the controller's namespace, and the events about it) are
// left to leaderElection.
func (a *auditLog) between(from, to time.Time) requestCounts {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := requestCounts{}
	for _, e := range a.all {
		if e.At.Before(from) || !e.At.Before(to) {
			continue
		}
		if e.Namespace == controllerNamespace && (e.Resource == "leases" || e.Resource == "events") {
			continue
		}
		key := strings.ToUpper(e.Verb) + " " + e.Resource
		if e.Manager != "" {
			key += " (" + e.Manager + ")"
		}
		if e.Code >= 300 {
			key += " refused " + strconv.Itoa(e.Code)
		}
		out[key]++
	}
	return out
}

// leaderElection counts the leader-election writes received in [from, to).
func (a *auditLog) leaderElection(from, to time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, e := range a.all {
		if !e.At.Before(from) && e.At.Before(to) && e.Namespace == controllerNamespace && (e.Resource == "leases" || e.Resource == "events") {
			n++
		}
	}
	return n
}
