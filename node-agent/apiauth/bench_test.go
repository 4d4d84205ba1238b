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
	"net/http"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
)

// BenchmarkCachedDecision is what authentication and authorization add to a call once both
// decisions are cached: the token's hash and two cache lookups. The reviews themselves (one
// per token every 2 minutes, one per caller and lane every 5) are the API server's.
func BenchmarkCachedDecision(b *testing.B) {
	cs := fake.NewClientset()
	cs.PrependReactor("create", "tokenreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authenticationv1.TokenReview{Status: authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{apiauth.DefaultAudience},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:team:app", UID: "0b5c",
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:team", "system:authenticated"},
				Extra:  map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/credential-id": {"JTI=8a4b"}}}}}, nil
	})
	cs.PrependReactor("create", "subjectaccessreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authorizationv1.SubjectAccessReview{Status: authorizationv1.SubjectAccessReviewStatus{Allowed: true}}, nil
	})
	auth := apiauth.New(apiauth.Config{TokenReviews: cs.AuthenticationV1(), SubjectAccessReviews: cs.AuthorizationV1()})
	// A ServiceAccount token is a JWT of about 1 KB.
	token := make([]byte, 1000)
	for i := range token {
		token[i] = 'a' + byte(i%26)
	}
	r, _ := http.NewRequest(http.MethodPost, "http://mac/v1/embeddings", nil)
	r.Header.Set("Authorization", "Bearer "+string(token))
	access := apiauth.Access{Namespace: "team", Lane: "gte-search", Subresource: "embeddings"}
	call := func() {
		u, ok, _, err := auth.AuthenticateRequest(r)
		if err != nil || !ok {
			b.Fatalf("not authenticated: %v", err)
		}
		allowed, _, err := auth.Authorize(context.Background(), u, access)
		if err != nil || !allowed {
			b.Fatalf("not allowed: %v", err)
		}
	}
	call()
	if n := len(cs.Actions()); n != 2 {
		b.Fatalf("%d reviews for the first call, want 2", n)
	}
	b.ReportAllocs()
	b.ResetTimer() // the fake clientset's setup and the first call's reviews are not the figure
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			call()
		}
	})
	if n := len(cs.Actions()); n != 2 {
		b.Fatalf("%d reviews in all, want the first call's 2: the decisions were not cached", n)
	}
}
