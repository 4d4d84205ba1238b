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

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	fleetv1alpha1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

type options struct {
	assets      string
	controller  string
	crds        string
	samples     string
	kubeconfig  string
	probeAddr   string
	metricsAddr string
}

// fleet is what run leaves running until its context ends.
type fleet struct {
	kubeconfig string
	kubectl    string
	client     client.Client
}

// run starts the fleet, calls ready once everything is up, and tears it all down when ctx ends.
func run(ctx context.Context, opts options, out io.Writer, ready func(io.Writer, fleet)) (err error) {
	if opts.assets == "" {
		return errors.New("no control-plane binaries: pass --assets or set KUBEBUILDER_ASSETS (make dev does)")
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: opts.assets,
		CRDDirectoryPaths:     []string{opts.crds},
		ErrorIfCRDPathMissing: true,
	}
	fmt.Fprintln(out, "starting etcd and kube-apiserver ...")
	cfg, err := env.Start()
	if err != nil {
		return fmt.Errorf("starting the control plane: %w", err)
	}
	defer func() {
		fmt.Fprintln(out, "stopping the control plane ...")
		err = errors.Join(err, env.Stop())
	}()

	if err := os.MkdirAll(filepath.Dir(opts.kubeconfig), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(opts.kubeconfig, env.KubeConfig, 0o600); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	defer os.Remove(opts.kubeconfig)

	scheme := runtime.NewScheme()
	if err := fleetv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}

	controller, err := startController(opts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, controller.stop(10*time.Second)) }()
	if err := waitHealthy(ctx, "http://"+opts.probeAddr+"/readyz", controller); err != nil {
		return fmt.Errorf("waiting for the controller: %w", err)
	}

	if err := applyDir(ctx, c, opts.samples); err != nil {
		return fmt.Errorf("applying the samples: %w", err)
	}

	ready(out, fleet{kubeconfig: opts.kubeconfig, kubectl: filepath.Join(opts.assets, "kubectl"), client: c})
	<-ctx.Done()
	fmt.Fprintln(out, "stopping ...")
	return nil
}

// process is a child process whose exit one goroutine waits for.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited; err is set then
	err  error
}

func startController(opts options) (*process, error) {
	cmd := exec.Command(opts.controller,
		"--kubeconfig", opts.kubeconfig,
		"--leader-elect=false",
		"--health-probe-bind-address", opts.probeAddr,
		"--metrics-bind-address", opts.metricsAddr,
	)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own process group, so Ctrl-C in the terminal reaches devfleet alone and the
	// controller is stopped in order, before the control plane goes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (run 'make build'): %w", opts.controller, err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// waitHealthy polls url until it answers 200, the process exits, or a minute passes.
func waitHealthy(ctx context.Context, url string, p *process) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return wait.PollUntilContextCancel(ctx, 200*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-p.done:
			return false, fmt.Errorf("the controller exited (%v); its log is above", p.err)
		default:
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil // not listening yet
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
}

// stop asks the process to terminate and kills it after grace.
func (p *process) stop(grace time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %s and was killed", p.cmd.Path, grace)
	}
	var exit *exec.ExitError
	if errors.As(p.err, &exit) && !exit.Exited() {
		return nil // ended by our signal
	}
	return p.err
}

// applyDir creates every object of every YAML file in dir (kustomization.yaml aside), in name
// order, which puts identities before the lanes that reference them.
func applyDir(ctx context.Context, c client.Client, dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, doc := range strings.Split(string(data), "\n---\n") {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(obj.Object) == 0 {
				continue
			}
			if err := c.Create(ctx, obj); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
		}
	}
	return nil
}

func printUsage(out io.Writer, f fleet) {
	k := fmt.Sprintf("%s --kubeconfig %s", f.kubectl, f.kubeconfig)
	fmt.Fprintf(out, `
Synapse Fleet is running locally: etcd, kube-apiserver, the CRDs, synapse-controller and the
samples of config/samples.

  export KUBECONFIG=%s
  %s get cataloglanes,certifiedidentities,prewarmpolicies
  %s get cataloglanes -o wide
  %s explain cataloglane.spec

Press Ctrl-C to stop everything; the control plane's data is removed.
`, f.kubeconfig, k, k, k)
}
