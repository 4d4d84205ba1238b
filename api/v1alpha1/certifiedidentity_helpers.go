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

// Matches reports whether node runs this identity exactly: the same worker signing identifier,
// binary digest, protocol version and backend, on the same macOS build. An approval is never
// matched loosely: a node that reports no backend matches no identity.
func (c *CertifiedIdentity) Matches(node *MacNode) bool {
	w, p := node.Status.Worker, node.Status.Platform
	return w.SigningIdentifier == c.Spec.Worker.SigningIdentifier &&
		w.BinaryDigest == c.Spec.Worker.BinaryDigest &&
		w.ProtocolVersion == c.Spec.Worker.ProtocolVersion &&
		w.Backend != "" && w.Backend == c.Spec.Worker.Backend &&
		p.MacOSBuild == c.Spec.MacOSBuild
}

// FinalizerInUse keeps a CertifiedIdentity while a CatalogLane references it.
const FinalizerInUse = "fleet.synapse.dev/in-use"

// IdentityReasonInUse: deletion waits until no lane references the identity.
const IdentityReasonInUse = "InUse"
