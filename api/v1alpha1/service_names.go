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

// LaneServiceDNSName is the DNS name a client in the cluster calls a lane's Service by:
// <lane>.<namespace>.svc (kubernetes/dns docs/specification.md, "ClusterIP Services", the
// <service>.<ns>.svc form a pod's search path completes to the cluster's zone). A Mac's
// serving certificate names it for every lane placed on it, so that a call through the Service
// verifies. Only this form: the bare <lane> names a lane of any namespace; <lane>.<namespace>
// may be a public name (a lane "google" in namespace "dev"); and the qualified
// <lane>.<namespace>.svc.<zone> depends on a cluster domain the agent and the signer would
// have to agree on, or every request naming it is denied.
func LaneServiceDNSName(namespace, lane string) string {
	return lane + "." + namespace + ".svc"
}
