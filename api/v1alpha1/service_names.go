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

// DefaultClusterDomain is the cluster's DNS domain when none is configured, as the kubelet's
// --cluster-domain default.
const DefaultClusterDomain = "cluster.local"

// LaneServiceDNSNames are the DNS names a client in the cluster calls a lane's Service by
// (kubernetes/dns docs/specification.md, "ClusterIP Services": <service>.<ns>.svc.<zone>, and
// the shorter forms a pod's DNS search path completes), each bound to the lane's namespace:
// <lane>.<ns>, <lane>.<ns>.svc and <lane>.<ns>.svc.<domain>. A Mac's serving certificate
// names them for every lane placed on it, so that a call through the Service verifies. The
// bare <lane> is not among them: it names a lane of any namespace.
func LaneServiceDNSNames(namespace, lane, clusterDomain string) []string {
	names := []string{lane + "." + namespace, lane + "." + namespace + ".svc"}
	if clusterDomain != "" {
		names = append(names, names[1]+"."+clusterDomain)
	}
	return names
}
