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

// Package nodeidentity gives each Mac an identity of its own, as kubelets have theirs: a
// ServiceAccount synapse-node-<node> in namespace synapse-nodes, authenticated by a bound,
// expiring token from the TokenRequest API. Join (an administrator's act) creates the
// ServiceAccount and the Role that lets it renew its own token, and writes the Mac's
// kubeconfig and token; the agent's Renewer requests a fresh token before the current one
// expires and writes it atomically in place. Deleting the ServiceAccount revokes the Mac: the
// API server refuses its tokens from then on.
//
// What the identity may do is the agents' RBAC (config/agent) narrowed to its own MacNode,
// placements, Lease and token by the node-restriction policies (config/policies).
package nodeidentity

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	// Namespace holds the Macs' ServiceAccounts, their token Roles and the API server's
	// audiences (AudiencesConfigMap), nothing else.
	Namespace = "synapse-nodes"
	// Prefix starts each Mac's ServiceAccount name; the rest is its node's name.
	Prefix = "synapse-node-"
	// DefaultLifetime is how long a token lives: hours, so that a stolen one is soon useless
	// and a Mac renews it several times a day.
	DefaultLifetime = 24 * time.Hour
	// MaxLifetime is the longest token the node-restriction policy lets an agent request.
	MaxLifetime = 48 * time.Hour
	// MinLifetime is the shortest the TokenRequest API issues.
	MinLifetime = 10 * time.Minute
	// TokenFile and KubeconfigFile are the names Join writes in a Mac's state directory.
	TokenFile      = "token"
	KubeconfigFile = "kubeconfig"
)

// ServiceAccountName is the ServiceAccount of node.
func ServiceAccountName(node string) string { return Prefix + node }

// ValidateNode refuses a node name that cannot name both a MacNode and its ServiceAccount.
func ValidateNode(node string) error {
	errs := append(validation.IsDNS1123Subdomain(node), validation.IsDNS1123Subdomain(ServiceAccountName(node))...)
	if len(errs) > 0 {
		return fmt.Errorf("node name %q: must be a lowercase DNS subdomain of at most %d characters: %s",
			node, validation.DNS1123SubdomainMaxLength-len(Prefix), strings.Join(errs, "; "))
	}
	return nil
}

// Claims are what the agent reads from its own token: who it is and when the token expires.
// The token is not verified here (the API server does that); the claims only drive renewal
// and the check that the agent runs as the node it says it is.
type Claims struct {
	// Namespace and ServiceAccount are the token's subject.
	Namespace, ServiceAccount string
	IssuedAt, Expiry          time.Time
}

// Node is the node the claims' ServiceAccount is for, or "" if it is not a node identity.
func (c Claims) Node() string {
	if c.Namespace != Namespace || !strings.HasPrefix(c.ServiceAccount, Prefix) {
		return ""
	}
	return strings.TrimPrefix(c.ServiceAccount, Prefix)
}

// Lifetime is how long the token was issued for.
func (c Claims) Lifetime() time.Duration { return c.Expiry.Sub(c.IssuedAt) }

// RenewAt is when a token should be replaced: after 80% of its lifetime, as the kubelet renews
// its projected tokens, so a renewal that fails has a fifth of the lifetime to be retried.
func (c Claims) RenewAt() time.Time { return c.IssuedAt.Add(c.Lifetime() * 8 / 10) }

// ErrNotServiceAccountToken is returned for a token that is not a ServiceAccount's JWT.
var ErrNotServiceAccountToken = errors.New("not a ServiceAccount token")

// ParseClaims reads a ServiceAccount token's subject and times, without verifying it.
func ParseClaims(token string) (Claims, error) {
	parts := strings.Split(strings.TrimSpace(token), ".")
	if len(parts) != 3 {
		return Claims{}, fmt.Errorf("%w: not a JWT", ErrNotServiceAccountToken)
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return Claims{}, fmt.Errorf("%w: payload: %w", ErrNotServiceAccountToken, err)
	}
	var raw struct {
		Sub string `json:"sub"`
		Iat int64  `json:"iat"`
		Exp int64  `json:"exp"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return Claims{}, fmt.Errorf("%w: payload: %w", ErrNotServiceAccountToken, err)
	}
	// system:serviceaccount:<namespace>:<name>
	sub := strings.Split(raw.Sub, ":")
	if len(sub) != 4 || sub[0] != "system" || sub[1] != "serviceaccount" || raw.Exp == 0 || raw.Iat == 0 || raw.Exp <= raw.Iat {
		return Claims{}, fmt.Errorf("%w: subject %q, issued %d, expires %d", ErrNotServiceAccountToken, raw.Sub, raw.Iat, raw.Exp)
	}
	return Claims{Namespace: sub[2], ServiceAccount: sub[3], IssuedAt: time.Unix(raw.Iat, 0), Expiry: time.Unix(raw.Exp, 0)}, nil
}
