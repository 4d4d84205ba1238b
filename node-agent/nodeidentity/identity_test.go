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

package nodeidentity

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// jwt is an unsigned token with the given subject and times (the agent never verifies its own
// token; the API server does).
func jwt(sub string, iat, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." +
		enc([]byte(fmt.Sprintf(`{"sub":%q,"iat":%d,"exp":%d}`, sub, iat.Unix(), exp.Unix()))) + ".sig"
}

func TestParseClaimsReadsTheNodeAndTheRenewalTime(t *testing.T) {
	iat := time.Unix(1_800_000_000, 0)
	c, err := ParseClaims(jwt("system:serviceaccount:synapse-nodes:synapse-node-mac-a", iat, iat.Add(10*time.Hour)) + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Node() != "mac-a" || c.Lifetime() != 10*time.Hour || !c.RenewAt().Equal(iat.Add(8*time.Hour)) {
		t.Fatalf("claims %+v: node %q, lifetime %s, renew at %s", c, c.Node(), c.Lifetime(), c.RenewAt())
	}
	for sub, node := range map[string]string{
		"system:serviceaccount:other:synapse-node-mac-a":         "", // another namespace
		"system:serviceaccount:synapse-nodes:default":            "", // no node's name
		"system:serviceaccount:synapse-nodes:synapse-node-mac-b": "mac-b",
	} {
		c, err := ParseClaims(jwt(sub, iat, iat.Add(time.Hour)))
		if err != nil || c.Node() != node {
			t.Errorf("%s: node %q, err %v; want %q", sub, c.Node(), err, node)
		}
	}
}

func TestParseClaimsRefusesWhatIsNoServiceAccountToken(t *testing.T) {
	iat := time.Unix(1_800_000_000, 0)
	for name, token := range map[string]string{
		"not a JWT":          "abc",
		"a user's subject":   jwt("alice", iat, iat.Add(time.Hour)),
		"no expiry":          jwt("system:serviceaccount:synapse-nodes:synapse-node-a", iat, time.Unix(0, 0)),
		"expires before iat": jwt("system:serviceaccount:synapse-nodes:synapse-node-a", iat, iat.Add(-time.Hour)),
		"payload not base64": "a.!!!.c",
	} {
		if _, err := ParseClaims(token); !errors.Is(err, ErrNotServiceAccountToken) {
			t.Errorf("%s: err %v, want ErrNotServiceAccountToken", name, err)
		}
	}
}

func TestValidateNodeRefusesNamesThatCannotNameAServiceAccount(t *testing.T) {
	for _, bad := range []string{"", "Mac-A", "mac_a", "-mac", strings.Repeat("a", 241)} {
		if err := ValidateNode(bad); err == nil {
			t.Errorf("node %q was accepted", bad)
		}
	}
	for _, good := range []string{"mac-a", "mac-a.lab", strings.Repeat("a", 240)} {
		if err := ValidateNode(good); err != nil {
			t.Errorf("node %q: %v", good, err)
		}
	}
}
