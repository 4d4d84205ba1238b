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
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	authenticationv1 "k8s.io/api/authentication/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/controller/openapi/builder"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/managedfields"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/manifests"
)

// Env is a running control plane.
type Env struct {
	env    *envtest.Environment
	Config *rest.Config
	Scheme *k8sruntime.Scheme
	// Client talks to it with the built-in kinds and the fleet kinds registered.
	Client client.WithWatch
}

// ConfigDir is config/ of this checkout, wherever the test runs from.
func ConfigDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "config")
}

// CRDDir is config/crd/bases of this checkout.
func CRDDir() string { return filepath.Join(ConfigDir(), "crd", "bases") }

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
	if err := apiextensionsv1.AddToScheme(e.Scheme); err != nil {
		return nil, err
	}
	if e.Client, err = client.NewWithWatch(cfg, client.Options{Scheme: e.Scheme}); err != nil {
		return nil, err
	}
	return e, nil
}

// Install applies what config/default installs in a cluster (the namespaces, the controller's
// and the agents' RBAC, the node-restriction policies), but the controller's Deployment and the
// CRDs, which Start installed.
func (e *Env) Install(ctx context.Context) error {
	objs, err := manifests.Read(filepath.Join(ConfigDir(), "default"))
	if err != nil {
		return err
	}
	return manifests.Apply(ctx, e.Client, manifests.Without(objs, "Deployment", "CustomResourceDefinition"))
}

// ServiceAccountConfig is a rest.Config that authenticates as the ServiceAccount, by a token
// from the TokenRequest API, as a pod running under it would.
func (e *Env) ServiceAccountConfig(ctx context.Context, namespace, name string) (*rest.Config, error) {
	cs, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return nil, err
	}
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("a token for %s/%s: %w", namespace, name, err)
	}
	cfg := rest.AnonymousClientConfig(e.Config)
	cfg.BearerToken = tr.Status.Token
	return cfg, nil
}

// CachedClient is a client that reads as a manager's does: from an informer cache, with the
// field indexes index registers, but the kinds of uncached, which it reads from the API
// server. The cache runs until ctx ends.
func (e *Env) CachedClient(ctx context.Context, index func(context.Context, client.FieldIndexer) error, uncached ...client.Object) (client.Client, error) {
	c, err := cache.New(e.Config, cache.Options{Scheme: e.Scheme})
	if err != nil {
		return nil, err
	}
	if err := index(ctx, c); err != nil {
		return nil, err
	}
	stopped := make(chan error, 1)
	go func() { stopped <- c.Start(ctx) }()
	if !c.WaitForCacheSync(ctx) {
		select {
		case err := <-stopped:
			return nil, fmt.Errorf("the cache did not start: %w", err)
		default:
			return nil, errors.New("the cache did not sync before the context ended")
		}
	}
	return client.New(e.Config, client.Options{Scheme: e.Scheme, Cache: &client.CacheOptions{Reader: c, DisableFor: uncached}})
}

// Stop stops the control plane.
func (e *Env) Stop() error { return e.env.Stop() }

// Suite registers, for the calling ginkgo suite, a BeforeSuite that starts the control plane and
// then runs setup (wiring the suite's own clients, namespaces, ...) and an AfterSuite that stops
// it. The returned Env is filled in before the first spec runs.
func Suite(setup ...func(*Env)) *Env {
	e := &Env{}
	ginkgo.BeforeSuite(func() {
		started, err := Start()
		gomega.Expect(err).NotTo(gomega.HaveOccurred())
		*e = *started
		for _, f := range setup {
			f(e)
		}
	})
	ginkgo.AfterSuite(func() {
		gomega.Expect(e.Stop()).To(gomega.Succeed())
	})
	return e
}

// RunSpecs runs the package's specs, in random order. When any fails, it ends by saying which
// and why in a few lines, with the seed that replays the order: go test prints them last, after
// the test's FAIL line, where a CI log's tail shows them (ginkgo's own summary names only the
// failures' places, and their messages come pages earlier).
func RunSpecs(t *testing.T, name string) {
	gomega.RegisterFailHandler(ginkgo.Fail)
	suiteConfig, reporterConfig := ginkgo.GinkgoConfiguration()
	suiteConfig.RandomizeAllSpecs = true
	var report ginkgo.Report
	ginkgo.ReportAfterSuite("failures, last", func(r ginkgo.Report) { report = r })
	if !ginkgo.RunSpecs(t, name, suiteConfig, reporterConfig) {
		for _, line := range failureSummary(report, 5) {
			t.Log(line)
		}
	}
}

// failureSummary is a line for the seed and one for each of the first max failed specs: its
// name, where it failed and the first 300 characters of its message.
func failureSummary(r ginkgo.Report, max int) []string {
	lines := []string{fmt.Sprintf("seed %d (replay the order with -ginkgo.seed %[1]d); the first failures:", r.SuiteConfig.RandomSeed)}
	for _, s := range r.SpecReports {
		if !s.Failed() {
			continue
		}
		if len(lines) > max {
			lines = append(lines, "...")
			break
		}
		msg := strings.Join(strings.Fields(s.Failure.Message), " ")
		if len(msg) > 300 {
			msg = msg[:300] + "..."
		}
		lines = append(lines, fmt.Sprintf("%s %s at %s: %s", s.LeafNodeType, s.FullText(), s.Failure.Location, msg))
	}
	return lines
}

// Counting wraps c so that every read (get, list) adds one to reads and every write (create,
// update, patch, delete, status patch) one to writes; either counter may be nil. Tests use it
// to see how many API requests a reconcile makes, and that an idle one writes nothing.
func Counting(c client.WithWatch, reads, writes *atomic.Int64) client.WithWatch {
	add := func(n *atomic.Int64) {
		if n != nil {
			n.Add(1)
		}
	}
	return interceptor.NewClient(c, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			add(reads)
			return c.Get(ctx, key, obj, opts...)
		},
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			add(reads)
			return c.List(ctx, list, opts...)
		},
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			add(writes)
			return c.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			add(writes)
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			add(writes)
			return c.Patch(ctx, obj, patch, opts...)
		},
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			add(writes)
			return c.Delete(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			add(writes)
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	})
}

// TypeConverter is the API server's schema of the project's CRDs (config/crd/bases), built as
// the API server builds it (apiextensions-apiserver's customresource_handler.go), for fake
// clients that server-side apply: without it they deduce the schema from the object, and a
// list keyed by type (status.conditions) merges as a whole, as the API server's does not.
func TypeConverter() (managedfields.TypeConverter, error) {
	files, err := filepath.Glob(filepath.Join(CRDDir(), "*.yaml"))
	if err != nil {
		return nil, err
	}
	specs := []*spec3.OpenAPI{}
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(raw, crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, v := range crd.Spec.Versions {
			s, err := builder.BuildOpenAPIV3(crd, v.Name, builder.Options{})
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", f, v.Name, err)
			}
			specs = append(specs, s)
		}
	}
	merged, err := builder.MergeSpecsV3(specs...)
	if err != nil {
		return nil, err
	}
	return managedfields.NewTypeConverter(merged.Components.Schemas, false)
}
