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
	"crypto/tls"
	"net/http"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
)

var _ = Describe("Calls through a lane's Service", func() {
	It("should verify the Mac's certificate under each of the lane's Service names once the lane is Ready, through the official client, and not under a lane placed elsewhere", func() {
		l := newLane(v1.TaskEmbed, 1)
		nodes := readyOn(l)
		pool, err := fleet.TrustBundle(ctx)
		Expect(err).NotTo(HaveOccurred())
		params := openai.EmbeddingNewParams{Model: openai.EmbeddingModel(key(l)),
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"called by its Service name"}}}
		for _, host := range []string{v1.LaneServiceDNSName(l.Namespace, l.Name)} {
			// A client in the cluster resolves the name to the Service, which sends it to this
			// Mac; the test dials the Mac's loopback address and verifies the name as that
			// client does.
			hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}}}
			c := openai.NewClient(option.WithBaseURL(fleet.URL(nodes[0])+"/v1/"), option.WithAPIKey(token), option.WithMaxRetries(0), option.WithHTTPClient(hc))
			resp, err := c.Embeddings.New(ctx, params)
			Expect(err).NotTo(HaveOccurred(), "a call to %s", host)
			Expect(resp.Data).To(HaveLen(1))
		}
		_, err = handshake(nodes[0], "lane-placed-elsewhere.default.svc", pool)
		Expect(err).To(MatchError(ContainSubstring("certificate is valid for")))
	})
})
