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
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/kubernetes/fake"
	authenticationv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
)

// A flood of distinct tokens (none cached, each its own review) gets at most the unknown
// tokens' share of MaxReviews in flight (3 of 4); the rest are answered ErrBusy at once, not
// queued, and nothing busy is cached. The slot left is an authenticated caller's.
func TestReviewsInFlightAreBounded(t *testing.T) {
	const maxReviews, limit, flood = 4, 3, 20
	started, unblock := make(chan struct{}, flood), make(chan struct{})
	reviews := &blockingReviews{started: started, unblock: unblock}
	sars := fake.NewClientset()
	sars.PrependReactor("create", "subjectaccessreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authorizationv1.SubjectAccessReview{Status: authorizationv1.SubjectAccessReviewStatus{Allowed: true}}, nil
	})
	auth := apiauth.New(apiauth.Config{TokenReviews: reviews, SubjectAccessReviews: sars.AuthorizationV1(), MaxReviews: maxReviews})
	request := func(token string) *http.Request {
		r, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://mac/metrics", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		return r
	}
	var wg sync.WaitGroup
	results := make(chan error, flood)
	for i := range limit {
		wg.Go(func() {
			_, _, _, err := auth.AuthenticateRequest(request(fmt.Sprintf("held-%d", i)))
			results <- err
		})
	}
	for range limit {
		<-started
	}
	// Every slot is taken: the flood is refused at once.
	for i := range flood - limit {
		_, ok, _, err := auth.AuthenticateRequest(request(fmt.Sprintf("flood-%d", i)))
		if !errors.Is(err, apiauth.ErrBusy) || ok {
			t.Fatalf("flood call %d: ok %v, err %v, want ErrBusy", i, ok, err)
		}
	}
	// The flood does not hold the last slot: a caller's access is still reviewed.
	if allowed, _, err := auth.Authorize(context.Background(), &user.DefaultInfo{Name: "alice"}, apiauth.Access{Path: "/metrics"}); err != nil || !allowed {
		t.Fatalf("an access review while the flood holds its share: allowed %v, err %v", allowed, err)
	}
	close(unblock)
	wg.Wait()
	close(results)
	for err := range results {
		if err != nil {
			t.Fatalf("a held review failed: %v", err)
		}
	}
	// A refused token was not cached as refused: with slots free it is reviewed and let in.
	if _, ok, _, err := auth.AuthenticateRequest(request("flood-0")); err != nil || !ok {
		t.Fatalf("after the flood: ok %v, err %v", ok, err)
	}
}

// blockingReviews answers every TokenReview authenticated, once unblock is closed, saying on
// started when each begins (client-go's fake clientset runs its reactors under one lock, so
// it cannot hold several reviews in flight).
type blockingReviews struct {
	started chan<- struct{}
	unblock <-chan struct{}
}

func (b *blockingReviews) TokenReviews() authenticationv1client.TokenReviewInterface { return b }

func (b *blockingReviews) Create(context.Context, *authenticationv1.TokenReview, metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	b.started <- struct{}{}
	<-b.unblock
	return &authenticationv1.TokenReview{Status: authenticationv1.TokenReviewStatus{Authenticated: true,
		User: authenticationv1.UserInfo{Username: "alice"}}}, nil
}
