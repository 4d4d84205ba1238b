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
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/internal/manifests"
)

// controllerNamespace holds the controller's ServiceAccount and its leader-election Lease.
const controllerNamespace = "synapse-system"

// repoRoot is the module's root, wherever the test runs from.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// buildController builds synapse-controller into dir.
func buildController(dir string) (string, error) {
	out := filepath.Join(dir, "synapse-controller")
	cmd := exec.Command("go", "build", "-o", out, ".")
	cmd.Dir = repoRoot()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building synapse-controller: %v\n%s", err, b)
	}
	return out, nil
}

// controllerKubeconfig writes a kubeconfig for the controller's ServiceAccount with a token from
// the TokenRequest API: the controller runs with the RBAC config/rbac ships, nothing more.
func controllerKubeconfig(ctx context.Context, cp *controlPlane, path string) error {
	sa := &corev1.ServiceAccount{}
	if err := cp.Client.Get(ctx, client.ObjectKey{Namespace: controllerNamespace, Name: "synapse-controller"}, sa); err != nil {
		return fmt.Errorf("the controller's ServiceAccount (config/rbac): %w", err)
	}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(6 * 3600))}}
	if err := cp.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		return fmt.Errorf("requesting the controller's token: %w", err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["scale"] = &clientcmdapi.Cluster{Server: cp.Config.Host, CertificateAuthorityData: cp.Config.CAData}
	kc.AuthInfos["synapse-controller"] = &clientcmdapi.AuthInfo{Token: tr.Status.Token}
	kc.Contexts["scale"] = &clientcmdapi.Context{Cluster: "scale", AuthInfo: "synapse-controller"}
	kc.CurrentContext = "scale"
	return clientcmd.WriteToFile(*kc, path)
}

// controllerProcess is synapse-controller running as its own process, with leader election on,
// so its CPU time and peak memory are its own.
type controllerProcess struct {
	bin, kubeconfig, logPath string
	args                     []string
	metricsAddr, pprofAddr   string
	cmd                      *exec.Cmd
	done                     chan struct{}
	log                      *os.File
	// Restarts counts the times it exited and was started again; cpuBefore and peakBefore are
	// what its earlier processes used.
	Restarts   int
	cpuBefore  float64
	peakBefore int64
}

// memoryLimit is the manager container's memory limit: the controller keeps its heap under a
// share of it as in its Deployment, where it reads the limit from its cgroup (a process here
// has none to read).
func newControllerProcess(bin, kubeconfig, logPath string, grace, eviction time.Duration, evictionRate float64, memoryLimit string) *controllerProcess {
	c := &controllerProcess{bin: bin, kubeconfig: kubeconfig, logPath: logPath,
		metricsAddr: freeAddr(), pprofAddr: freeAddr()}
	c.args = []string{"--kubeconfig", kubeconfig, "--leader-elect=true", "--leader-election-namespace", controllerNamespace,
		"--metrics-bind-address", c.metricsAddr, "--health-probe-bind-address", freeAddr(), "--pprof-bind-address", c.pprofAddr,
		"--node-grace-period", grace.String(), "--node-eviction-timeout", eviction.String(),
		// A thousand Macs' Lease renewals and status writes keep the API server busy, and the
		// apply of thousands of lanes at once more so: a renewal of the controller's own Lease
		// may take seconds to answer. The defaults (renew within 10 s) would have the leader give
		// up and exit mid-rollout, which the report would count as a storm nobody asked for. A
		// cluster that slow raises these the same way.
		"--leader-elect-lease-duration", "60s", "--leader-elect-renew-deadline", "45s",
		// The harness scrapes the loopback in plain HTTP; a cluster's controller serves metrics
		// authenticated (the default).
		"--metrics-secure=false",
		// The Macs' addresses (advertisedRange): published in the lanes' EndpointSlices.
		"--endpoint-cidrs", advertisedRange.String(), "--memory-limit", memoryLimit}
	if evictionRate > 0 {
		c.args = append(c.args, "--node-eviction-rate", strconv.FormatFloat(evictionRate, 'g', -1, 64))
	}
	return c
}

// deployedMemoryLimit reads the memory limit of the manager container of the Deployment in the
// manifest at path.
func deployedMemoryLimit(path string) (string, error) {
	objs, err := manifests.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := kruntime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
			return "", err
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			if q, ok := c.Resources.Limits[corev1.ResourceMemory]; ok && c.Name == "manager" {
				return q.String(), nil
			}
		}
	}
	return "", fmt.Errorf("%s has no Deployment whose manager container has a memory limit", path)
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer l.Close()
	return l.Addr().String()
}

func (c *controllerProcess) start() error {
	if c.cmd != nil && c.cmd.ProcessState != nil {
		if ru, ok := c.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			c.cpuBefore += time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
			c.peakBefore = max(c.peakBefore, ru.Maxrss*1024)
		}
	}
	if c.log != nil {
		_ = c.log.Close()
	}
	log, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	c.log = log
	c.cmd = exec.Command(c.bin, c.args...)
	c.cmd.Stdout, c.cmd.Stderr = log, log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.cmd.Start(); err != nil {
		return err
	}
	c.done = make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	return nil
}

// exited says why the controller exited, nil while it runs.
func (c *controllerProcess) exited() error {
	select {
	case <-c.done:
		return fmt.Errorf("the controller exited: %v", c.cmd.ProcessState)
	default:
		return nil
	}
}

// stop stops it as a rollout would (SIGTERM: it gives up its leader Lease and exits).
func (c *controllerProcess) stop() error {
	if c.cmd == nil {
		return nil
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
	err := c.log.Close()
	c.log = nil
	return err
}

// usage is the CPU seconds and peak resident set of its processes so far (Linux: /proc).
func (c *controllerProcess) usage() (cpu float64, peakRSS int64, err error) {
	cpu, peakRSS, err = procUsage(c.cmd.Process.Pid)
	return c.cpuBefore + cpu, max(c.peakBefore, peakRSS), err
}

func procUsage(pid int) (cpu float64, peakRSS int64, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command (which may hold spaces) start at its closing parenthesis.
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	const ticks = 100 // USER_HZ on Linux
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			peakRSS = kb * 1024
		}
	}
	return (utime + stime) / ticks, peakRSS, nil
}

// metrics scrapes the controller's Prometheus endpoint.
func (c *controllerProcess) metrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	return scrapeHTTP(ctx, "http://"+c.metricsAddr+"/metrics")
}

// scrapeHTTP reads a Prometheus text endpoint, retrying a few times (about 1.5 s in all): a
// process under the scale test's load may miss one scrape, which must not fail a report that
// took many minutes to make.
func scrapeHTTP(ctx context.Context, url string) (families map[string]*dto.MetricFamily, err error) {
	err = retry.OnError(retry.DefaultBackoff, func(error) bool { return ctx.Err() == nil }, func() error {
		families, err = scrapeHTTPOnce(ctx, url)
		return err
	})
	return families, err
}

func scrapeHTTPOnce(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// reconciles sums controller_runtime_reconcile_total of one controller.
func reconciles(families map[string]*dto.MetricFamily, controller string) float64 {
	var sum float64
	for _, m := range families["controller_runtime_reconcile_total"].GetMetric() {
		if labelsOf(m)["controller"] == controller {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// queued sums the depth of every controller's work queue.
func queued(families map[string]*dto.MetricFamily) float64 {
	var sum float64
	for _, m := range families["workqueue_depth"].GetMetric() {
		sum += m.GetGauge().GetValue()
	}
	return sum
}

// profile saves a CPU profile of the controller of the given length to path.
func (c *controllerProcess) profile(ctx context.Context, seconds int, path string) error {
	return saveProfile(ctx, http.DefaultClient, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", c.pprofAddr, seconds), path)
}

// heapProfile saves the controller's heap profile (after a garbage collection, so it holds what
// is live) to path.
func (c *controllerProcess) heapProfile(ctx context.Context, path string) error {
	return saveProfile(ctx, http.DefaultClient, fmt.Sprintf("http://%s/debug/pprof/heap?gc=1", c.pprofAddr), path)
}

// saveProfile writes the profile a /debug/pprof URL answers, through hc, to path.
func saveProfile(ctx context.Context, hc *http.Client, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}
