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

package apiauth_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ck-synapse/synapse-fleet/node-agent/nodeidentity"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

var (
	ctx   = context.Background()
	env   *testenv.Env
	admin kubernetes.Interface
	// asNode is a joined Mac's own identity, under the agents' RBAC and the node-restriction
	// policies: the reviews are made as an agent makes them.
	asNode kubernetes.Interface
	_      = testenv.Suite(func(e *testenv.Env) {
		env = e
		Expect(e.Install(ctx)).To(Succeed())
		var err error
		admin, err = kubernetes.NewForConfig(e.Config)
		Expect(err).NotTo(HaveOccurred())
		joined, err := nodeidentity.Join(ctx, admin, nodeidentity.JoinOptions{Node: "mac-1", Server: e.Config.Host,
			CAData: e.Config.CAData, Lifetime: time.Hour, Dir: testDir})
		Expect(err).NotTo(HaveOccurred())
		cfg, err := clientcmd.BuildConfigFromFlags("", joined.Kubeconfig)
		Expect(err).NotTo(HaveOccurred())
		asNode, err = kubernetes.NewForConfig(cfg)
		Expect(err).NotTo(HaveOccurred())
	})
	testDir string
)

func TestAPIAuth(t *testing.T) {
	testDir = t.TempDir()
	testenv.RunSpecs(t, "API authentication and authorization")
}
