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

// Package load drives one agent, listening on the loopback, at twice what it serves with valid
// calls mixed with oversize and malformed bodies and slow-loris connections, and checks that it
// stays up, bounded and honest: its memory stays under 256 MiB, no worker restarts, every valid
// call is answered once, with 200 or 429/503 and Retry-After, and the admitted calls finish
// within the lane's deadline. make load runs it for a minute (LOAD_DURATION); make test runs its
// short form (shortDuration: long enough for the server to cut the slow-loris connections off).
// Traffic goes to 127.0.0.1 only, bounded in count and time.
package load

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/onsi/gomega"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	vegeta "github.com/tsenart/vegeta/v12/lib"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/internal/localfleet"
	"github.com/ck-synapse/synapse-fleet/test/testenv"
)

const (
	mac  = "mac-load"
	dims = 256
	// The lane's bounds: calls running and waiting on the node, its deadline.
	maxConcurrent, maxQueued = 4, 32
	deadline                 = 5 * time.Second
	rssLimitKiB              = 256 << 10
	// shortDuration is the attack's length without LOAD_DURATION: past the server's 10 s bound
	// on a request's headers, so that the slow-loris connections are seen cut off.
	shortDuration = 15 * time.Second
)

// Kinds of call, named in each target's query so each result can be judged by what it was.
const (
	kindValid     = "valid"
	kindMalformed = "malformed"
	kindOverCeil  = "over-ceiling"
	kindOverBatch = "over-batch"
)

type report struct {
	Duration          string  `json:"duration"`
	CapacityPerSecond float64 `json:"capacity_per_second"`
	AttackPerSecond   int     `json:"attack_per_second"`
	// SentPerSecond is the attack the client delivered (the calls it sent over the duration).
	SentPerSecond float64        `json:"sent_per_second"`
	Sent          map[string]int `json:"sent"`
	ValidCodes    map[int]int    `json:"valid_codes"`
	// ValidRefusals are the valid calls refused 429, by what refused them.
	ValidRefusals   map[string]int `json:"valid_refusals"`
	AdmittedP50Ms   float64        `json:"admitted_p50_ms"`
	AdmittedP99Ms   float64        `json:"admitted_p99_ms"`
	AgentAdmitted   float64        `json:"agent_admitted"`
	AgentP99BoundMs float64        `json:"agent_admitted_p99_bound_ms"`
	OversizeSent    int64          `json:"oversize_sent"`
	// OversizeAnswered are the oversize bodies whose answer the client read, by how they were
	// sent and the answer: "announced 413" (a Content-Length over the bound is refused at once),
	// "chunked 413", or, for a chunked body (its size unknown until read, it waits for a bulk
	// slot first, which the over-ceiling calls hold under this load), "chunked 429" or
	// "chunked 503" with Retry-After; anything else is a failure.
	// each (the others' connections were closed before the client read an answer).
	OversizeAnswered   map[string]int `json:"oversize_answered"`
	SlowLorisCutOff    int64          `json:"slow_loris_cut_off"`
	AgentMaxRSSMiB     float64        `json:"agent_max_rss_mib"`
	WorkerRestarts     float64        `json:"worker_restarts"`
	AgentAnswered      float64        `json:"agent_answered"`
	AgentAnswerWanted  int            `json:"agent_answers_wanted"`
	TransportErrors    int            `json:"transport_errors"`
	UnreadBodiesReset  int            `json:"unread_bodies_reset"`
	RetryAfterMissing  int            `json:"retry_after_missing"`
	UnexpectedStatuses map[string]int `json:"unexpected_statuses"`
}

func TestAgentUnderLoad(t *testing.T) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		t.Skip("KUBEBUILDER_ASSETS is not set; run make load or make test")
	}
	duration := shortDuration
	if d := os.Getenv("LOAD_DURATION"); d != "" {
		var err error
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatal(err)
		}
	}
	if raceDetector {
		// The agent is a process of its own, built without the race detector; only this test's
		// client would be instrumented, and vegeta and TLS under -race fall far behind the attack
		// (on two cores, 447 to 582 calls/s sent of the 2,440 to 2,498 asked): the agent was not
		// loaded, and the client's own queueing past its time-out was reported as unanswered
		// calls. make test runs this package on its own, without -race.
		t.Skip("run without -race: under it this test's client, not the agent, is the bottleneck (make test runs it so)")
	}
	ctrllog.SetLogger(logr.Discard())
	base := startAgent(t)
	pid := fleetPID
	restarts0, answered0 := metric(t, base, "synapse_agent_worker_restarts_total"), metric(t, base, "synapse_agent_requests_total")

	capacity := measureCapacity(t, base+"/v1/embeddings", 3*time.Second)
	rate := max(20, int(2*capacity))
	t.Logf("the agent serves %.0f calls/s; attacking at %d/s for %s", capacity, rate, duration)
	answered0 = metric(t, base, "synapse_agent_requests_total") // after the capacity probe
	latency0 := histogram(t, base, "synapse_agent_request_duration_seconds")

	ctx, stop := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	var (
		maxRSS    atomic.Int64
		rssFailed atomic.Pointer[error]
	)
	bg.Go(func() { sampleRSS(ctx, pid, &maxRSS, &rssFailed) })
	var oversize, cutOff atomic.Int64
	oversizeAnswered := &statusCounts{m: map[string]int{}}
	bg.Go(func() { sendOversize(ctx, base+"/v1/embeddings", &oversize, oversizeAnswered) })
	for range 64 {
		bg.Go(func() { slowLoris(ctx, strings.TrimPrefix(base, "https://"), &cutOff) })
	}

	rep := report{Duration: duration.String(), CapacityPerSecond: capacity, AttackPerSecond: rate, Sent: map[string]int{},
		ValidCodes: map[int]int{}, ValidRefusals: map[string]int{}, UnexpectedStatuses: map[string]int{}}
	var admitted []time.Duration
	attacker := vegeta.NewAttacker(vegeta.Timeout(2*deadline), vegeta.KeepAlive(true), vegeta.Connections(256), vegeta.MaxWorkers(512),
		vegeta.TLSConfig(clientTLS))
	for res := range attacker.Attack(targeter(base), vegeta.Rate{Freq: rate, Per: time.Second}, duration, "load") {
		u, _ := url.Parse(res.URL)
		kind := u.Query().Get("kind")
		rep.Sent[kind]++
		if res.Code == 0 {
			if kind == kindOverCeil && (strings.Contains(res.Error, "connection reset by peer") || strings.Contains(res.Error, "broken pipe")) {
				// Refused overloaded before its 600 KB body was read (the bulk share was taken),
				// the connection closes with the body unread; a client that has not read the
				// answer within the server's half-close linger (half a second, under this
				// machine's load) sees the reset instead. The agent counted its answer.
				rep.UnreadBodiesReset++
				continue
			}
			rep.TransportErrors++
			rep.UnexpectedStatuses[kind+" "+res.Error]++
			continue
		}
		code := int(res.Code)
		// Any call may be refused overloaded before its body is parsed (the agent's work slots are
		// all taken); otherwise each kind gets its own answer.
		want := map[string][]int{kindValid: {200, 429, 503}, kindMalformed: {400, 429}, kindOverCeil: {422, 429}, kindOverBatch: {413, 429}}[kind]
		if !slices.Contains(want, code) {
			rep.UnexpectedStatuses[fmt.Sprintf("%s %d %.200s", kind, code, res.Body)]++
		}
		if (code == 429 || code == 503) && res.Headers.Get("Retry-After") == "" {
			rep.RetryAfterMissing++
		}
		if kind != kindValid {
			continue
		}
		rep.ValidCodes[code]++
		if code == 429 {
			rep.ValidRefusals[refusedBy(res.Body)]++
		}
		if code == 200 {
			admitted = append(admitted, res.Latency)
		}
	}
	stop()
	bg.Wait()

	slices.Sort(admitted)
	if len(admitted) > 0 {
		rep.AdmittedP50Ms = float64(admitted[len(admitted)/2].Microseconds()) / 1000
		rep.AdmittedP99Ms = float64(admitted[len(admitted)*99/100].Microseconds()) / 1000
	}
	rep.OversizeSent, rep.SlowLorisCutOff, rep.OversizeAnswered = oversize.Load(), cutOff.Load(), oversizeAnswered.snapshot()
	rep.AgentMaxRSSMiB = float64(maxRSS.Load()) / 1024
	rep.WorkerRestarts = metric(t, base, "synapse_agent_worker_restarts_total") - restarts0
	for _, n := range rep.Sent {
		rep.AgentAnswerWanted += n
	}
	rep.SentPerSecond = float64(rep.AgentAnswerWanted) / duration.Seconds()
	rep.AgentAnswerWanted += int(rep.OversizeSent)
	// The agent counts a call once its answer is written, so the client may hold the last
	// answers a moment before they are counted: the count is read until it reaches the calls
	// sent (or a bound passes). A call counted twice would pass it and never equal it.
	// The same holds for its latency histogram, observed just after the count.
	if err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		rep.AgentAnswered = metric(t, base, "synapse_agent_requests_total") - answered0
		rep.AgentAdmitted, rep.AgentP99BoundMs = p99Bound(latency0, histogram(t, base, "synapse_agent_request_duration_seconds"))
		return rep.AgentAnswered >= float64(rep.AgentAnswerWanted) && rep.AgentAdmitted >= float64(rep.ValidCodes[200]), nil
	}); err != nil {
		t.Logf("the agent's counts did not reach the calls sent within 5 s: %v", err)
	}
	out, _ := json.MarshalIndent(rep, "", "  ")
	t.Logf("load report:\n%s", out)
	if path := os.Getenv("LOAD_REPORT"); path != "" {
		_ = os.WriteFile(path, out, 0o644)
	}

	g := gomega.NewWithT(t)
	g.Expect(rep.TransportErrors).To(gomega.BeZero(), "calls without an answer: %v", rep.UnexpectedStatuses)
	g.Expect(rep.UnexpectedStatuses).To(gomega.BeEmpty(), "calls answered otherwise than their kind must be")
	g.Expect(rep.RetryAfterMissing).To(gomega.BeZero(), "429 or 503 without Retry-After")
	for answer, n := range rep.OversizeAnswered {
		g.Expect(answer).To(gomega.BeElementOf("announced 413", "chunked 413", "chunked 429", "chunked 503"), "%d oversize bodies answered %s", n, answer)
	}
	g.Expect(rep.ValidCodes[200]).To(gomega.BeNumerically(">", 0), "no valid call was served")
	g.Expect(rep.ValidCodes[429]).To(gomega.BeNumerically(">", 0), "at twice its capacity the agent never said overloaded")
	// The lane's deadline runs from a call's arrival at the agent, so the agent's own latency
	// histogram, from arrival to answer, is what it is held to: the smallest of its bucket
	// bounds under which 99 % of the admitted calls were answered must lie within the deadline
	// (stricter than the p99 itself). The client's figures include its own queueing on a machine
	// it shares with the agent (vegeta's workers, TLS), so they are reported only.
	g.Expect(rep.AgentAdmitted).To(gomega.BeNumerically("==", rep.ValidCodes[200]), "admitted calls the agent timed against those the client saw answered 200")
	g.Expect(time.Duration(rep.AgentP99BoundMs*float64(time.Millisecond))).To(gomega.BeNumerically("<=", deadline), "p99 of admitted calls, timed by the agent from arrival")
	if err := rssFailed.Load(); err != nil {
		t.Fatalf("the agent's resident memory could not be read: %v", *err)
	}
	g.Expect(rep.AgentMaxRSSMiB).To(gomega.BeNumerically(">", 0), "the agent's resident memory was never read")
	g.Expect(rep.AgentMaxRSSMiB).To(gomega.BeNumerically("<", rssLimitKiB/1024), "the agent's resident memory")
	g.Expect(rep.WorkerRestarts).To(gomega.BeZero(), "a worker restarted under load")
	// Each call the agent saw is counted once, with the code it was answered: as many answers
	// as calls means none was answered twice (and none lost).
	g.Expect(rep.AgentAnswered).To(gomega.BeNumerically("==", rep.AgentAnswerWanted), "answers counted by the agent against calls sent")
	g.Expect(rep.SlowLorisCutOff).To(gomega.BeNumerically(">", 0), "no slow-loris connection was cut off")
	// The attack is what the client sent, not what it was asked: a client that cannot keep up
	// within the attack's duration sends fewer calls, and the agent is then loaded less than
	// the test says. At least half again its capacity, or the client, not the agent, was the
	// bottleneck. Checked last, so that the agent's own figures are judged first.
	g.Expect(rep.SentPerSecond).To(gomega.BeNumerically(">=", 1.5*capacity),
		"calls sent a second, against the agent's capacity of %.0f/s and the attack's %d/s", capacity, rate)
}

var (
	fleetPID int
	// bearer is the Authorization header of every call.
	bearer string
	// clientTLS trusts the fleet's CA bundle and expects the Mac's name; httpClient uses it.
	clientTLS  *tls.Config
	httpClient *http.Client
)

// post is an authenticated POST of body to u.
func post(ctx context.Context, c *http.Client, u string, body io.Reader, length int64) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, body)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", bearer)
	if length > 0 {
		req.ContentLength = length
	}
	return c.Do(req)
}

// startAgent runs one simulated Mac with one Ready embed lane, bounded as the constants say,
// and returns its API's loopback URL.
func startAgent(t *testing.T) string {
	t.Helper()
	bin := t.TempDir()
	if err := localfleet.Build(bin); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f, err := localfleet.Start(ctx, localfleet.Options{Assets: os.Getenv("KUBEBUILDER_ASSETS"), Config: testenv.ConfigDir(), Bin: bin, Dir: t.TempDir(),
		SimScale: 1e-6, Out: io.Discard, Macs: []localfleet.Mac{{Name: mac, MacOSBuild: "25B78"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Stop() })
	d := f.WorkerDigest
	id := &v1.CertifiedIdentity{ObjectMeta: metav1.ObjectMeta{Name: "load"}, Spec: v1.CertifiedIdentitySpec{
		Worker:           v1.WorkerIdentity{SigningIdentifier: "synapse-ane-worker", BinaryDigest: d, ProtocolVersion: 3, Backend: v1.BackendSim},
		Model:            v1.ModelIdentity{Name: "load", Revision: "1", CheckpointDigest: d, Layers: 1, HiddenSize: dims, EmbeddingDimensions: dims},
		ConversionPolicy: v1.ConversionPolicy{Name: "p", Digest: d}, MacOSBuild: "25B78", VectorSpaceID: "load"}}
	if err := f.Client.Create(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := f.InstallArtifact(id); err != nil {
		t.Fatal(err)
	}
	if err := f.Client.Create(ctx, &v1.CatalogLane{ObjectMeta: metav1.ObjectMeta{Name: "load", Namespace: "default"},
		Spec: v1.CatalogLaneSpec{Model: "load", Task: v1.TaskEmbed, Device: v1.DeviceANE, IdentityRef: v1.LocalObjectReference{Name: "load"},
			Rungs: []v1.Rung{128}, Replicas: 1, AdmissionBoundSeconds: 600, RequestDeadlineSeconds: int32(deadline / time.Second),
			MaxBatchTokens: ptr.To(int32(1024)), MaxConcurrentRequests: ptr.To(int32(maxConcurrent)), MaxQueuedRequests: ptr.To(int32(maxQueued))}}); err != nil {
		t.Fatal(err)
	}
	gomega.NewWithT(t).Eventually(func(g gomega.Gomega) {
		var ps v1.LanePlacementList
		g.Expect(f.Client.List(ctx, &ps, client.InNamespace("default"))).To(gomega.Succeed())
		g.Expect(ps.Items).To(gomega.HaveLen(1))
		g.Expect(ps.Items[0].Status.Phase).To(gomega.Equal(v1.PhaseReady))
	}).WithTimeout(2 * time.Minute).WithPolling(100 * time.Millisecond).Should(gomega.Succeed())
	// The calls are authenticated and authorized as a client of the lane's namespace is, so the
	// figures include the (cached) TokenReview and SubjectAccessReview decisions.
	tok, err := f.Caller(ctx, "default", "load-client", true, true)
	if err != nil {
		t.Fatal(err)
	}
	bearer = "Bearer " + tok
	// Over TLS, as every client of a fleet calls: the Mac's certificate from the fleet's signer,
	// verified against the published CA bundle.
	if clientTLS, err = f.TLSConfig(ctx, mac); err != nil {
		t.Fatal(err)
	}
	httpClient = &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS, MaxIdleConnsPerHost: 2 * maxConcurrent}}
	fleetPID = f.PID(mac)
	return f.URL(mac)
}

// validBody is a call of 1 to 8 short texts.
func validBody(i int) []byte {
	in := make([]string, 1+i%8)
	for j := range in {
		in[j] = fmt.Sprintf("call %d input %d: a short passage of about a dozen words to embed", i, j)
	}
	b, _ := json.Marshal(map[string]any{"model": "default/load", "input": in})
	return b
}

// refusedBy names what refused a call overloaded, from its answer's message: the agent's work
// gate (its waiting calls at their bound, or no slot within its wait) or the lane (its running
// and waiting calls at their bounds, or a predicted wait past the deadline).
func refusedBy(body []byte) string {
	for _, c := range []struct{ says, name string }{
		{"too many calls wait for a work slot", "work gate: waiting calls at their bound"},
		{"no work slot came free", "work gate: no slot within its wait"},
		{"calls are running and", "lane: running and waiting calls at their bounds"},
		{"past the request's deadline", "lane: predicted wait past the deadline"},
	} {
		if bytes.Contains(body, []byte(c.says)) {
			return c.name
		}
	}
	return "other"
}

func idsJSON(n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(1 + i%1000))
	}
	b.WriteByte(']')
	return b.String()
}

// targeter mixes the calls: mostly valid, one in twenty malformed, over the ceiling (a flat array
// of 100000 token ids) or over the lane's batch bound.
func targeter(base string) vegeta.Targeter {
	overCeil := []byte(`{"model": "default/load", "input": ` + idsJSON(100_000) + `}`)
	batch := make([]string, 12)
	for i := range batch {
		batch[i] = idsJSON(100)
	}
	overBatch := []byte(`{"model": "default/load", "input": [` + strings.Join(batch, ",") + `]}`)
	var n atomic.Int64
	header := http.Header{"Content-Type": {"application/json"}, "Authorization": {bearer}}
	return func(tgt *vegeta.Target) error {
		i := int(n.Add(1))
		kind, body := kindValid, validBody(i)
		switch i % 20 {
		case 1:
			kind, body = kindMalformed, []byte(`{"model": "default/load", "input": ["unterminated`)
		case 2:
			kind, body = kindOverCeil, overCeil
		case 3:
			kind, body = kindOverBatch, overBatch
		}
		*tgt = vegeta.Target{Method: http.MethodPost, URL: base + "/v1/embeddings?kind=" + kind, Body: body, Header: header}
		return nil
	}
}

// measureCapacity runs valid calls back to back from twice the lane's concurrency for d and
// returns the calls served per second.
func measureCapacity(t *testing.T, u string, d time.Duration) float64 {
	var served atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for w := range 2 * maxConcurrent {
		wg.Go(func() {
			for i := w; time.Now().Before(end); i += 2 * maxConcurrent {
				body := validBody(i)
				resp, err := post(context.Background(), httpClient, u, bytes.NewReader(body), int64(len(body)))
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					served.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if served.Load() == 0 {
		t.Fatal("the agent served nothing while its capacity was measured")
	}
	return float64(served.Load()) / d.Seconds()
}

// statusCounts counts answers by what they were, from several goroutines.
type statusCounts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *statusCounts) add(answer string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m[answer]++
}

func (c *statusCounts) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.m)
}

// sendOversize sends a body of 33 MiB every 2 s until ctx ends, half of them announced by
// Content-Length and half chunked, each to be answered 413 (see report.OversizeAnswered);
// sent counts the calls whose headers were written, answered the answers read.
func sendOversize(ctx context.Context, u string, sent *atomic.Int64, answered *statusCounts) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: clientTLS}}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Second):
		}
		body := io.MultiReader(strings.NewReader(`{"model": "default/load", "input": "`), io.LimitReader(zeros{}, 33<<20))
		var length int64
		if i%2 == 0 {
			length = 33<<20 + 37
		}
		// Counted once its headers are written, whether or not the answer is read: the server may
		// close a connection it refused before the client finished sending, but its handler has
		// seen and answered the call. The call is not cut off when ctx ends (the client's own
		// time-out bounds it): one cut off before the agent read its headers would be counted
		// here and never by the agent.
		trace := &httptrace.ClientTrace{WroteHeaders: func() { sent.Add(1) }}
		resp, err := post(httptrace.WithClientTrace(context.Background(), trace), c, u+"?kind=oversize", body, length)
		if err != nil {
			continue
		}
		answer := fmt.Sprintf("%s %d", map[bool]string{true: "announced", false: "chunked"}[length > 0], resp.StatusCode)
		if (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) && resp.Header.Get("Retry-After") == "" {
			answer += " without Retry-After"
		}
		answered.add(answer)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'a'
	}
	return len(p), nil
}

// slowLoris holds a connection (TLS: the handshake done, then the request's headers) sending a
// request's headers a byte every 500 ms, and opens another whenever the server cuts one off.
func slowLoris(ctx context.Context, addr string, cutOff *atomic.Int64) {
	head := "POST /v1/embeddings HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\nX-Slow: " + strings.Repeat("x", 4096)
	for ctx.Err() == nil {
		c, err := (&tls.Dialer{Config: clientTLS}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		for i := 0; i < len(head) && ctx.Err() == nil; i++ {
			if _, err := c.Write([]byte{head[i]}); err != nil {
				cutOff.Add(1)
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
		stop()
		c.Close()
	}
}

// families reads the agent's /metrics.
func families(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", bearer)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// metric sums a counter's series on the agent's /metrics.
func metric(t *testing.T, base, name string) float64 {
	t.Helper()
	var sum float64
	for _, m := range families(t, base)[name].GetMetric() {
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// histogram sums a histogram's cumulative bucket counts over its series on the agent's
// /metrics, by upper bound (+Inf: every observation).
func histogram(t *testing.T, base, name string) map[float64]float64 {
	t.Helper()
	counts := map[float64]float64{}
	for _, m := range families(t, base)[name].GetMetric() {
		h := m.GetHistogram()
		for _, b := range h.GetBucket() {
			if !math.IsInf(b.GetUpperBound(), 1) { // the text holds the +Inf bucket, the sample count
				counts[b.GetUpperBound()] += float64(b.GetCumulativeCount())
			}
		}
		counts[math.Inf(1)] += float64(h.GetSampleCount())
	}
	return counts
}

// p99Bound returns the calls observed between two readings of a histogram and the smallest
// bucket bound, in milliseconds, under which at least 99 % of them fall.
func p99Bound(before, after map[float64]float64) (total, boundMs float64) {
	bounds := slices.Sorted(maps.Keys(after))
	total = after[math.Inf(1)] - before[math.Inf(1)]
	for _, b := range bounds {
		if after[b]-before[b] >= 0.99*total {
			return total, b * 1000
		}
	}
	return total, math.Inf(1)
}

// sampleRSS keeps the largest resident set of pid seen, in KiB, every 200 ms. A reading that
// fails is kept in failed (the first one), so a memory that was never read fails the run
// rather than passing it as 0.
func sampleRSS(ctx context.Context, pid int, maxKiB *atomic.Int64, failed *atomic.Pointer[error]) {
	for {
		kib, err := rssKiB(pid)
		switch {
		case err != nil && ctx.Err() == nil:
			failed.CompareAndSwap(nil, &err)
		case kib > maxKiB.Load():
			maxKiB.Store(kib)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func rssKiB(pid int) (int64, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}
