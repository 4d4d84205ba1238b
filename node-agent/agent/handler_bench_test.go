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

package agent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
	"github.com/ck-synapse/synapse-fleet/node-agent/internal/workertest"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

var workerBinary string

func TestMain(m *testing.M) { os.Exit(workertest.Main(m, &workerBinary)) }

// BenchmarkServeInProcess runs the agent's serving path (HTTP API, serving, supervisor, a real
// sim worker process) without the cluster side, one request at a time, so a CPU profile of the
// agent's own work can be taken with -cpuprofile.
func BenchmarkServeInProcess(b *testing.B) {
	clk := clock.RealClock{}
	a := New(Config{NodeName: "mac-bench", Clock: clk, Log: logr.Discard(), Auth: apiauth.Anonymous{},
		Host: workerhost.New(workerhost.Config{Binary: workerBinary, Backend: "sim", StateDir: b.TempDir(), SimScale: 1e-6, Log: logr.Discard(), Clock: clk})})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = a.sup.Run(ctx) }()
	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: v1.CertifiedIdentitySpec{
		Model: v1.ModelIdentity{Name: "bench", Layers: 1, EmbeddingDimensions: 768}}}
	spec := v1.LanePlacementSpec{Lane: "bench", Node: "mac-bench", Identity: "bench", Task: v1.TaskEmbed, Device: v1.DeviceANE,
		Rungs: []v1.Rung{128}, Ceiling: 128, MaxResidentShapes: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}
	key := "default/bench"
	if err := a.sup.LoadModel(ctx, modelSpec(key, spec, id, "")); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = a.sup.Retire(context.Background(), key) }()
	a.serve.AddLane(servingLane(key, spec, id))
	a.lanes[types.NamespacedName{Namespace: "default", Name: "bench-mac-bench"}] = &lane{key: key, spec: spec, identity: id, loaded: true, state: laneReady,
		api: httpapi.Lane{Namespace: "default", Name: "bench", Key: key, Task: "embed", Device: "ane", Ceiling: 128, Dimensions: 768,
			Tokenizer: tokenizer.Sim{}, Deadline: 30 * time.Second}}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	for _, inputs := range []int{1, 32} {
		var in bytes.Buffer
		in.WriteString(`{"model": "default/bench", "input": [`)
		for i := range inputs {
			if i > 0 {
				in.WriteString(",")
			}
			fmt.Fprintf(&in, `"input %d: a short passage of about a dozen words to embed here"`, i)
		}
		in.WriteString(`]}`)
		payload := in.Bytes()
		b.Run(fmt.Sprintf("inputs=%d", inputs), func(b *testing.B) {
			for b.Loop() {
				resp, err := http.Post(srv.URL+"/v1/embeddings", "application/json", bytes.NewReader(payload))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
