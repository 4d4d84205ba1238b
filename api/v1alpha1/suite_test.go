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

package v1alpha1_test

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

// The API suite runs the generated CRDs in a real kube-apiserver, so what it asserts is what a
// user applying a manifest is told.
var (
	ctx       = context.Background()
	k8sClient client.Client
	_         = testenv.Suite(func(e *testenv.Env) { k8sClient = e.Client })
)

func TestAPI(t *testing.T) { testenv.RunSpecs(t, "API validation") }
