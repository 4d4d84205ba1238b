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

// Package testenv starts the envtest control plane (the kube-apiserver and etcd that
// hack/envtest.sh builds) with the project's CRDs installed, for the envtest suites.
package testenv

import (
	"fmt"
	"path/filepath"
	"runtime"

	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// Env is a running control plane.
type Env struct {
	env    *envtest.Environment
	Config *rest.Config
	Scheme *k8sruntime.Scheme
	// Client talks to it with the built-in kinds and the fleet kinds registered.
	Client client.WithWatch
}

// CRDDir is config/crd/bases of this checkout, wherever the test runs from.
func CRDDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "config", "crd", "bases")
}

// Start starts a control plane with the CRDs installed.
func Start() (*Env, error) {
	e := &Env{env: &envtest.Environment{CRDDirectoryPaths: []string{CRDDir()}, ErrorIfCRDPathMissing: true}}
	cfg, err := e.env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest (run 'make test' so that KUBEBUILDER_ASSETS points at the binaries hack/envtest.sh builds): %w", err)
	}
	e.Config = cfg
	e.Scheme = k8sruntime.NewScheme()
	if err := clientgoscheme.AddToScheme(e.Scheme); err != nil {
		return nil, err
	}
	if err := v1.AddToScheme(e.Scheme); err != nil {
		return nil, err
	}
	if e.Client, err = client.NewWithWatch(cfg, client.Options{Scheme: e.Scheme}); err != nil {
		return nil, err
	}
	return e, nil
}

// Stop stops the control plane.
func (e *Env) Stop() error { return e.env.Stop() }
