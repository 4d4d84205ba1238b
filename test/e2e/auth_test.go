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

package e2e

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

// openAI is the official OpenAI client for a Mac, with token as its API key, over TLS with the
// fleet's CA bundle.
func openAI(node, token string) *openai.Client {
	GinkgoHelper()
	c := openai.NewClient(option.WithBaseURL(fleet.URL(node)+"/v1/"), option.WithAPIKey(token), option.WithMaxRetries(0),
		option.WithHTTPClient(httpClient(node)))
	return &c
}

// statusOf is the HTTP status and error code of an OpenAI client's error.
func statusOf(err error) (int, string) {
	GinkgoHelper()
	var apiErr *openai.Error
	Expect(errors.As(err, &apiErr)).To(BeTrue(), "not an API error: %v", err)
	return apiErr.StatusCode, apiErr.Code
}

// get is a GET of a Mac's path with token (none if empty): its status and body.
func get(node, path, token string) (int, string) {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fleet.URL(node)+path, nil)
	Expect(err).NotTo(HaveOccurred())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient(node).Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}

var _ = Describe("Calling a lane", func() {
	It("should answer the official OpenAI client with a token RBAC allows, and refuse every other caller", func() {
		l := newLane(v1.TaskEmbed, 1)
		node := readyOn(l)[0]
		params := openai.EmbeddingNewParams{Model: openai.EmbeddingModel(key(l)),
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"hello", "world"}}}

		got, err := openAI(node, token).Embeddings.New(ctx, params)
		Expect(err).NotTo(HaveOccurred())
		Expect(got.Data).To(HaveLen(2))
		Expect(got.Data[0].Embedding).To(HaveLen(dims))

		By("refusing a call without a token, 401")
		status, body := rawPost(node, "/v1/embeddings", "")
		Expect(status).To(Equal(http.StatusUnauthorized), body)
		Expect(body).To(ContainSubstring(`"code":"unauthorized"`))

		By("refusing a token the API server never issued, 401")
		_, err = openAI(node, "not-a-token").Embeddings.New(ctx, params)
		code, reason := statusOf(err)
		Expect(code).To(Equal(http.StatusUnauthorized), reason)

		By("refusing a token for the API server's own audience, 401: the Mac could replay it")
		apiServerToken, err := fleet.Token(ctx, "default", "e2e-client", "")
		Expect(err).NotTo(HaveOccurred())
		_, err = openAI(node, apiServerToken).Embeddings.New(ctx, params)
		code, reason = statusOf(err)
		Expect(code).To(Equal(http.StatusUnauthorized), reason)

		By("refusing another namespace's caller, 403: it may call its own namespace's lanes only")
		Expect(kube.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "other-team"}})).To(Succeed())
		otherToken, err := fleet.Caller(ctx, "other-team", "app", true, false)
		Expect(err).NotTo(HaveOccurred())
		_, err = openAI(node, otherToken).Embeddings.New(ctx, params)
		code, reason = statusOf(err)
		Expect(code).To(Equal(http.StatusForbidden))
		Expect(reason).To(Equal("forbidden"))

		By("serving the metrics to a reader only, and the probes to anyone")
		status, _ = get(node, "/metrics", "")
		Expect(status).To(Equal(http.StatusUnauthorized))
		status, _ = get(node, "/metrics", otherToken)
		Expect(status).To(Equal(http.StatusForbidden))
		status, body = get(node, "/metrics", token)
		Expect(status).To(Equal(http.StatusOK))
		Expect(body).To(ContainSubstring(`synapse_agent_auth_reviews_total{result="ok",review="TokenReview"}`))
		status, _ = get(node, "/healthz", "")
		Expect(status).To(Equal(http.StatusOK))
	})

	It("should serve no admin call on the API's port, and pause and resume over the local admin socket", func() {
		l := newLane(v1.TaskEmbed, 1)
		node := readyOn(l)[0]
		for _, path := range []string{"/admin/pause", "/admin/resume"} {
			status, body := rawPost(node, path, token)
			Expect(status).To(Equal(http.StatusNotFound), body)
		}
		admin := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", fleet.AdminSocket(node))
		}}}
		post := func(path string) {
			GinkgoHelper()
			resp, err := admin.Post("http://agent"+path, "application/json", strings.NewReader("{}"))
			Expect(err).NotTo(HaveOccurred())
			Expect(resp.Body.Close()).To(Succeed())
			Expect(resp.StatusCode).To(Equal(http.StatusOK))
		}
		post("/admin/pause")
		DeferCleanup(post, "/admin/resume")
		status, _, body := call(node, "/v1/embeddings", map[string]any{"model": key(l), "input": "x"})
		Expect(status).To(Equal(http.StatusServiceUnavailable))
		Expect(errorCode(body)).To(Equal("node_paused"))
		post("/admin/resume")
		readyOn(l)
	})
})

// rawPost posts an embeddings call to a Mac's path with token (none if empty): its status and
// raw body.
func rawPost(node, path, token string) (int, string) {
	GinkgoHelper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fleet.URL(node)+path, strings.NewReader(`{"model": "default/x", "input": "x"}`))
	Expect(err).NotTo(HaveOccurred())
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient(node).Do(req)
	Expect(err).NotTo(HaveOccurred())
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}
