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

package v1alpha1

import (
	"strings"
	"testing"
)

// The worker backend is part of the identity: a sim approval never matches a node whose
// workers run ane and the reverse, and a node that reports no backend matches nothing.
func TestAnIdentityMatchesOnlyANodeOfItsOwnBackend(t *testing.T) {
	digest := Sha256Digest("sha256:" + strings.Repeat("ab", 32))
	identity := func(b WorkerBackend) *CertifiedIdentity {
		return &CertifiedIdentity{Spec: CertifiedIdentitySpec{MacOSBuild: "25B78",
			Worker: WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: b}}}
	}
	node := func(b WorkerBackend) *MacNode {
		return &MacNode{Status: MacNodeStatus{Platform: Platform{MacOSBuild: "25B78"},
			Worker: NodeWorker{SigningIdentifier: "synapse-ane-worker", BinaryDigest: digest, ProtocolVersion: 3, Backend: b}}}
	}
	for _, c := range []struct {
		identity, node WorkerBackend
		match          bool
	}{
		{BackendANE, BackendANE, true}, {BackendSim, BackendSim, true},
		{BackendSim, BackendANE, false}, {BackendANE, BackendSim, false},
		{BackendANE, "", false}, {"", "", false},
	} {
		if got := identity(c.identity).Matches(node(c.node)); got != c.match {
			t.Errorf("an identity for %q on a node running %q: matches %v, want %v", c.identity, c.node, got, c.match)
		}
	}
}
