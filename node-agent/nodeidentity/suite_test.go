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

package nodeidentity_test

import (
	"context"
	"path/filepath"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"

	"github.com/ck-synapse/synapse-fleet/internal/manifests"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx   = context.Background()
	env   *testenv.Env
	admin kubernetes.Interface
	_     = testenv.Suite(func(e *testenv.Env) {
		env = e
		var err error
		admin, err = kubernetes.NewForConfig(e.Config)
		Expect(err).NotTo(HaveOccurred())
		// The namespaces, the agents' RBAC and the node-restriction policies (a renewal must
		// pass them), as a cluster has them.
		for _, dir := range []string{"agent", "policies"} {
			objs, err := manifests.Read(filepath.Join(testenv.ConfigDir(), dir))
			Expect(err).NotTo(HaveOccurred())
			Expect(manifests.Apply(ctx, e.Client, objs)).To(Succeed())
		}
	})
)

func TestNodeIdentity(t *testing.T) { testenv.RunSpecs(t, "Node identity") }
