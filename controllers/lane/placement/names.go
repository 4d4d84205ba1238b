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

package placement

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/validation"
)

// nameHashLen is the length of the hash that ends a placement's name, as long as a
// ReplicaSet's pod-template-hash.
const nameHashLen = 10

// placementName is <lane>-<node>-<hash>: the lane and node for a person to read (the node cut
// short when the name would pass a name's 253 characters), and a hash of the pair that tells
// apart what joining two names cannot (lane ca-b on node m and lane ca on node b-m were both
// ca-b-m). The hash is encoded as Kubernetes encodes the hashes in its generated names
// (rand.SafeEncodeString: no vowels, no look-alike digits).
//
// Placements made under the former <lane>-<node> keep their names: the controller finds a
// lane's placements by its label, never by name, and a node holds one placement of a lane, so
// a placement of the former name on a node leaves no room for one of the new.
func placementName(lane, node string) string {
	// A "/" is in neither a lane's nor a node's name, so the pair hashed is the pair named.
	sum := sha256.Sum256([]byte(lane + "/" + node))
	hash := rand.SafeEncodeString(hex.EncodeToString(sum[:])[:nameHashLen])
	room := validation.DNS1123SubdomainMaxLength - len(lane) - len(hash) - 2
	// A subdomain's labels end in a letter or digit: a node's name cut after a "." or "-"
	// loses it.
	node = strings.TrimRight(node[:min(len(node), room)], ".-")
	return lane + "-" + node + "-" + hash
}
