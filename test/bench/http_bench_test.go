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

// Package bench measures a whole agent over HTTP: one simulated Mac with a zero-cost sim model,
// driven through its real API, beside a bare Go handler doing the same JSON work in the same
// run. Run with make bench (it needs the control-plane binaries, as the envtest suites do).
package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/localfleet"
	"github.com/ck-synapse/synapse-fleet/node-agent/tokenizer"
	"github.com/ck-synapse/synapse-fleet/node-agent/worker"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

const dims = 768

// startFleet runs one simulated Mac whose compiles and loads take (almost) no time, with
// lanes lanes of a one-layer model, and waits until they are Ready.
func startFleet(b *testing.B, lanes int) (*localfleet.Fleet, []string) {
	b.Helper()
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		b.Skip("KUBEBUILDER_ASSETS is not set; run make bench")
	}
	ctrllog.SetLogger(logr.Discard())
	bin := b.TempDir()
	if err := localfleet.Build(bin); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	f, err := localfleet.Start(ctx, localfleet.Options{Assets: assets, Config: testenv.ConfigDir(), Bin: bin, Dir: b.TempDir(),
		SimScale: 1e-6, Out: io.Discard, Macs: []localfleet.Mac{{Name: "mac-bench", MacOSBuild: "25B78"}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = f.Stop() })
	// The Macs authenticate and authorize every call: the benchmark's caller may call the
	// namespace's lanes, and its decisions are cached after the first call.
	if token, err = f.Caller(ctx, "default", "bench-client", true, false); err != nil {
		b.Fatal(err)
	}
	d := f.WorkerDigest
	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: v1.CertifiedIdentitySpec{
		Worker:           v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: d, ProtocolVersion: 3, Backend: v1.BackendSim},
		Model:            v1.ModelIdentity{Name: "bench", Revision: "1", CheckpointDigest: d, Layers: 1, HiddenSize: dims, EmbeddingDimensions: dims},
		ConversionPolicy: v1.ConversionPolicy{Name: "p", Digest: d}, MacOSBuild: "25B78", VectorSpaceID: "bench"}}
	if err := f.Client.Create(ctx, id); err != nil {
		b.Fatal(err)
	}
	if err := f.InstallArtifact(id); err != nil {
		b.Fatal(err)
	}
	var names []string
	for i := range lanes {
		name := fmt.Sprintf("bench-%d", i)
		names = append(names, "default/"+name)
		if err := f.Client.Create(ctx, &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: v1.CatalogLaneSpec{Model: "bench", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "bench"},
				Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: 30}}); err != nil {
			b.Fatal(err)
		}
	}
	gomega.NewWithT(b).Eventually(func(g gomega.Gomega) {
		var ps v1.LanePlacementList
		g.Expect(f.Client.List(ctx, &ps, client.InNamespace("default"))).To(gomega.Succeed())
		g.Expect(ps.Items).To(gomega.HaveLen(lanes))
		for _, p := range ps.Items {
			g.Expect(p.Status.Phase).To(gomega.Equal(v1.PhaseReady))
		}
	}).WithTimeout(2 * time.Minute).WithPolling(100 * time.Millisecond).Should(gomega.Succeed())
	return f, names
}

// bareHandler does the agent's JSON work in process: decode, tokenise, embed, encode.
func bareHandler(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model string   `json:"model"`
		Input []string `json:"input"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	type emb struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	out := struct {
		Object string `json:"object"`
		Data   []emb  `json:"data"`
		Model  string `json:"model"`
	}{Object: "list", Model: req.Model}
	for i, in := range req.Input {
		ids, _ := tokenizer.Sim{}.Encode(in) // the sim tokenizer encodes every text
		out.Data = append(out.Data, emb{Object: "embedding", Index: i, Embedding: worker.Embed(req.Model, dims, ids)})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func body(model string, inputs int) []byte {
	in := make([]string, inputs)
	for i := range in {
		in[i] = fmt.Sprintf("input %d: a short passage of about a dozen words to embed here", i)
	}
	data, _ := json.Marshal(map[string]any{"model": model, "input": in})
	return data
}

// token is the benchmark's caller's (startFleet).
var token string

// drive sends b.N requests from conc goroutines and reports requests/s, p50 and p99. Every
// answer is checked before a figure is reported: the first is decoded and must hold one vector
// of the model's dimensions per input, in order, finite and distinct; every other must be the
// same bytes (the same payload, the same worker: the same answer), so each request was answered,
// once, and right.
func drive(b *testing.B, url string, tlsConfig *tls.Config, payload []byte, inputs, conc int) (p50 time.Duration) {
	b.Helper()
	tr := &http.Transport{MaxIdleConnsPerHost: conc, MaxConnsPerHost: conc, TLSClientConfig: tlsConfig}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	lat := make([]time.Duration, b.N)
	var (
		next, answered int
		mu             sync.Mutex
		wg             sync.WaitGroup
		failed         error
		want           []byte
	)
	b.ResetTimer()
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var got bytes.Buffer
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= b.N {
					return
				}
				t0 := time.Now()
				got.Reset()
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(payload))
				var resp *http.Response
				if err == nil {
					req.Header.Set("Content-Type", "application/json")
					// Sent to the bare handler too, which ignores it, so both read the same bytes.
					req.Header.Set("Authorization", "Bearer "+token)
					resp, err = c.Do(req)
				}
				if err == nil {
					_, err = got.ReadFrom(resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d: %.300s", resp.StatusCode, got.Bytes())
					}
				}
				lat[i] = time.Since(t0)
				mu.Lock()
				if err == nil {
					if want == nil {
						want = slices.Clone(got.Bytes())
						err = checkAnswer(want, inputs)
					} else if !bytes.Equal(got.Bytes(), want) {
						err = fmt.Errorf("answer %d differs from the first for the same payload: %.300s", i, got.Bytes())
					}
				}
				if err == nil {
					answered++
				} else {
					failed = err
				}
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	if answered != b.N {
		b.Fatalf("%d answers for %d requests", answered, b.N)
	}
	slices.Sort(lat)
	p50, p99 := lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
	return p50
}

// checkAnswer checks an embeddings answer: one vector of dims finite floats per input, indexed
// in input order, no two the same (each input is a different text).
func checkAnswer(body []byte, inputs int) error {
	var out struct {
		Data []struct {
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return fmt.Errorf("the answer is not an embeddings list: %w", err)
	}
	if len(out.Data) != inputs {
		return fmt.Errorf("%d vectors for %d inputs", len(out.Data), inputs)
	}
	for i, d := range out.Data {
		if d.Index != i || len(d.Embedding) != dims {
			return fmt.Errorf("vector %d: index %d, %d dimensions; want index %d, %d", i, d.Index, len(d.Embedding), i, dims)
		}
		for _, x := range d.Embedding {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return fmt.Errorf("vector %d holds %v", i, x)
			}
		}
		if i > 0 && slices.Equal(d.Embedding, out.Data[i-1].Embedding) {
			return fmt.Errorf("vectors %d and %d are the same for different texts", i-1, i)
		}
	}
	return nil
}

// bareEnv set makes the test binary serve the bare handler instead of running (TestMain).
const bareEnv = "SYNAPSE_BENCH_BARE"

func TestMain(m *testing.M) {
	if os.Getenv(bareEnv) != "" {
		serveBare()
		return
	}
	os.Exit(m.Run())
}

// serveBare serves bareHandler over TLS on a loopback port, writes its URL and certificate to
// stdout, and serves until stdin closes.
func serveBare() {
	s := httptest.NewUnstartedServer(http.HandlerFunc(bareHandler))
	// A client's transport closing its idle connections mid-handshake is no news.
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.StartTLS()
	defer s.Close()
	fmt.Printf("%s\n%s", s.URL, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw}))
	_, _ = io.Copy(io.Discard, os.Stdin)
}

// startBare runs the bare handler in a process of its own, as the agent runs in its own, and
// returns its URL and a TLS config that trusts it. In the benchmark's own process, the bare
// handler's goroutines woke the client's on the same scheduler, while every agent call pays two
// wake-ups of another process; the ratio is meant to be the agent's own cost, not the process
// boundary's, as it is not TLS's.
func startBare(b *testing.B) (string, *tls.Config) {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), bareEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	r := bufio.NewReader(stdout)
	url, err := r.ReadString('\n')
	if err != nil {
		b.Fatalf("the bare handler's process said no URL: %v", err)
	}
	var cert bytes.Buffer
	for !bytes.HasSuffix(cert.Bytes(), []byte("-----END CERTIFICATE-----\n")) {
		line, err := r.ReadBytes('\n')
		if err != nil {
			b.Fatalf("the bare handler's process said no certificate: %v", err)
		}
		cert.Write(line)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(cert.Bytes()) {
		b.Fatal("the bare handler's certificate does not parse")
	}
	return strings.TrimSpace(url), &tls.Config{RootCAs: pool}
}

// BenchmarkEmbeddingsOverHTTP: the agent and the bare handler side by side, each in a process
// of its own, at concurrency 1, 8 and 64, for single inputs and 32-input batches.
func BenchmarkEmbeddingsOverHTTP(b *testing.B) {
	f, lanes := startFleet(b, 1)
	// The agent serves TLS with its certificate from the fleet's signer, which the client
	// verifies against the published CA bundle; the bare handler serves TLS too, so that the
	// ratio is the agent's own cost, not TLS's.
	agentTLS, err := f.TLSConfig(context.Background(), "mac-bench")
	if err != nil {
		b.Fatal(err)
	}
	bareURL, bareTLS := startBare(b)
	for _, inputs := range []int{1, 32} {
		payload := body(lanes[0], inputs)
		for _, conc := range []int{1, 8, 64} {
			name := fmt.Sprintf("inputs=%d/conc=%d", inputs, conc)
			var agent, baseline time.Duration
			b.Run(name+"/agent", func(b *testing.B) {
				agent = drive(b, f.URL("mac-bench")+"/v1/embeddings", agentTLS, payload, inputs, conc)
			})
			b.Run(name+"/bare", func(b *testing.B) { baseline = drive(b, bareURL, bareTLS, payload, inputs, conc) })
			if baseline > 0 {
				b.Logf("%s: agent p50 %s, bare p50 %s, overhead ratio %.2f", name, agent, baseline, float64(agent)/float64(baseline))
			}
		}
	}
}

// BenchmarkAgentRSSWith10Lanes reports the resident memory of an agent serving 10 Ready lanes,
// at rest, and of its 10 worker processes.
func BenchmarkAgentRSSWith10Lanes(b *testing.B) {
	f, _ := startFleet(b, 10)
	pid := f.PID("mac-bench")
	var agent, workers int64
	n := 0
	for b.Loop() { // once per iteration: b.Loop runs the fleet's setup only once
		agent, workers, n = rssKiB(b, pid), 0, 0
		tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "children"))
		for _, t := range tasks {
			data, _ := os.ReadFile(t)
			for _, field := range strings.Fields(string(data)) {
				child, _ := strconv.Atoi(field)
				workers += rssKiB(b, child)
				n++
			}
		}
	}
	b.ReportMetric(float64(agent), "agent-RSS-KiB")
	if n != 10 {
		b.Fatalf("%d worker processes, want 10", n)
	}
	b.ReportMetric(float64(workers)/float64(n), "worker-RSS-KiB")
}

// rssKiB reads VmRSS from /proc.
func rssKiB(b *testing.B, pid int) int64 {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.Fields(rest)[0], 10, 64)
			return n
		}
	}
	b.Fatalf("no VmRSS for %d", pid)
	return 0
}
