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

package servingcert_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr/funcr"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	certwatchermetrics "sigs.k8s.io/controller-runtime/pkg/certwatcher/metrics"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/ck-synapse/synapse-fleet/controllers/agentcert"
	"github.com/ck-synapse/synapse-fleet/node-agent/servingcert"
)

// filesName is the name the administrator's certificates are for.
const filesName = "lane-a.team-a.svc"

// pair is a certificate and its key, as PEM files hold them.
type pair struct {
	serial   int64
	notAfter time.Time
	cert     []byte
	key      []byte
}

// leaf is a serving certificate for filesName signed by ca, with its own key; serial tells it
// apart, and its expiry (serial hours from now) too.
func leaf(ca *agentcert.CA, serial int64) pair {
	GinkgoHelper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	Expect(err).NotTo(HaveOccurred())
	now := time.Now().Truncate(time.Second)
	notAfter := now.Add(time.Duration(serial) * time.Hour)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(serial), DNSNames: []string{filesName},
		NotBefore: now.Add(-time.Minute), NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, ca.Cert, &key.PublicKey, ca.Key)
	Expect(err).NotTo(HaveOccurred())
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	Expect(err).NotTo(HaveOccurred())
	return pair{serial: serial, notAfter: notAfter, cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})}
}

// writeFile writes data to path in place, as a program rewriting the file does.
func writeFile(path string, data []byte) {
	GinkgoHelper()
	Expect(os.WriteFile(path, data, 0o600)).To(Succeed())
}

// renameFile writes data beside path and renames it over path, as an atomic writer does.
func renameFile(path string, data []byte) {
	GinkgoHelper()
	tmp := path + ".tmp"
	Expect(os.WriteFile(tmp, data, 0o600)).To(Succeed())
	Expect(os.Rename(tmp, path)).To(Succeed())
}

// secretVolume lays p out as the kubelet lays out a Secret volume: the files in a timestamped
// directory, a ..data symlink to it and tls.crt/tls.key symlinks through ..data
// (kubernetes/kubernetes, pkg/volume/util/atomic_writer.go). It returns the paths the agent is
// given and a swap that publishes the next pair as the kubelet does: a new directory, a
// ..data_tmp symlink to it renamed over ..data, and the old directory removed.
func secretVolume(dir string, p pair) (certFile, keyFile string, swap func(pair)) {
	GinkgoHelper()
	gen := 0
	publish := func(p pair) string {
		GinkgoHelper()
		gen++
		ts := filepath.Join(dir, fmt.Sprintf("..2026_12_01_00_00_%02d", gen))
		Expect(os.Mkdir(ts, 0o755)).To(Succeed())
		writeFile(filepath.Join(ts, "tls.crt"), p.cert)
		writeFile(filepath.Join(ts, "tls.key"), p.key)
		Expect(os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data_tmp"))).To(Succeed())
		Expect(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data"))).To(Succeed())
		return ts
	}
	current := publish(p)
	for _, name := range []string{"tls.crt", "tls.key"} {
		Expect(os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name))).To(Succeed())
	}
	return filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"), func(p pair) {
		GinkgoHelper()
		old := current
		current = publish(p)
		Expect(os.RemoveAll(old)).To(Succeed())
	}
}

// watching counts the goroutines of the files' watch: certwatcher's, fsnotify's and the
// source's own.
func watching() int {
	var buf bytes.Buffer
	Expect(pprof.Lookup("goroutine").WriteTo(&buf, 2)).To(Succeed())
	n := 0
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "controller-runtime/pkg/certwatcher") || strings.Contains(g, "fsnotify") ||
			strings.Contains(g, "servingcert.(*Files)") {
			n++
		}
	}
	return n
}

// runtimeLog holds the lines controller-runtime has logged (certwatcher logs through it, as the
// agent's does once synapse-agent sets its logger), and passes them on to the spec's output.
var runtimeLog struct {
	mu    sync.Mutex
	lines []string
}

// recordRuntimeLog sets controller-runtime's logger to record into runtimeLog.
func recordRuntimeLog() {
	ctrllog.SetLogger(funcr.New(func(prefix, args string) {
		runtimeLog.mu.Lock()
		defer runtimeLog.mu.Unlock()
		runtimeLog.lines = append(runtimeLog.lines, prefix+" "+args)
		fmt.Fprintln(GinkgoWriter, prefix, args)
	}, funcr.Options{}))
}

// loggedError is whether controller-runtime logged an error msg with the pair of files certFile.
func loggedError(msg, certFile string) func() bool {
	return func() bool {
		runtimeLog.mu.Lock()
		defer runtimeLog.mu.Unlock()
		for _, l := range runtimeLog.lines {
			if strings.Contains(l, `"msg"="`+msg+`"`) && strings.Contains(l, `"error"=`) && strings.Contains(l, `"cert"="`+certFile+`"`) {
				return true
			}
		}
		return false
	}
}

// expiry is the served certificate's expiry as reg's gauge says it.
func expiry(reg *prometheus.Registry) func() float64 {
	return func() float64 {
		mfs, err := reg.Gather()
		Expect(err).NotTo(HaveOccurred())
		for _, mf := range mfs {
			if mf.GetName() == "synapse_agent_serving_certificate_expiration_timestamp_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return 0
	}
}

var _ = Describe("An administrator's serving certificate (--tls=files)", func() {
	var (
		ca   *agentcert.CA
		pool *x509.CertPool
		dir  string
	)
	BeforeEach(func() {
		ca = testCA()
		pool = x509.NewCertPool()
		pool.AddCert(ca.Cert)
		dir = GinkgoT().TempDir()
		// Every spec's watch ends with it: none is left running.
		Expect(watching()).To(BeZero())
	})

	// start loads the files, watches them until the spec ends (and then checks that the watch
	// stopped), and serves them on a loopback listener; poll is the watcher's poll interval.
	start := func(certFile, keyFile string, poll time.Duration) (*servingcert.Files, string) {
		GinkgoHelper()
		f, err := servingcert.LoadFiles(servingcert.FilesConfig{CertFile: certFile, KeyFile: keyFile, PollInterval: poll, Log: GinkgoLogr})
		Expect(err).NotTo(HaveOccurred())
		wctx, cancel := context.WithCancel(ctx)
		DeferCleanup(func() {
			cancel()
			Eventually(watching).WithTimeout(5 * time.Second).Should(BeZero())
		})
		Expect(f.Obtain(wctx, nil)).To(Succeed())
		return f, serveTLS(f)
	}
	serial := func(addr string) func() (int64, error) {
		return func() (int64, error) {
			c, err := served(addr, filesName, pool)
			if err != nil {
				return 0, err
			}
			return c.SerialNumber.Int64(), nil
		}
	}
	// An hour's poll: within a spec, only the watch's events can bring a new certificate.
	const eventsOnly = time.Hour

	DescribeTable("should refuse at start files that are missing or not a pair, saying why",
		func(edit func(certFile, keyFile string), want string) {
			certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
			p := leaf(ca, 1)
			writeFile(certFile, p.cert)
			writeFile(keyFile, p.key)
			edit(certFile, keyFile)
			_, err := servingcert.LoadFiles(servingcert.FilesConfig{CertFile: certFile, KeyFile: keyFile, Log: GinkgoLogr})
			Expect(err).To(MatchError(And(ContainSubstring("the serving certificate files"), ContainSubstring(want))))
			Expect(watching()).To(BeZero())
		},
		Entry("no certificate", func(c, _ string) { Expect(os.Remove(c)).To(Succeed()) }, "no such file or directory"),
		Entry("no key", func(_, k string) { Expect(os.Remove(k)).To(Succeed()) }, "no such file or directory"),
		Entry("a certificate that is not PEM", func(c, _ string) { writeFile(c, []byte("not a certificate")) }, "failed to find any PEM data in certificate input"),
		Entry("the key of another certificate", func(_, k string) { writeFile(k, leaf(ca, 2).key) }, "private key does not match public key"),
	)

	It("should serve the certificate rewritten in place at the next handshake, and say which it serves", func() {
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		first, second := leaf(ca, 1), leaf(ca, 2)
		writeFile(certFile, first.cert)
		writeFile(keyFile, first.key)
		f, addr := start(certFile, keyFile, eventsOnly)
		reg := prometheus.NewRegistry()
		reg.MustRegister(f)
		Expect(serial(addr)()).To(Equal(first.serial))
		Eventually(expiry(reg)).WithTimeout(5 * time.Second).Should(Equal(float64(first.notAfter.Unix())))

		// The certificate first, then its key: between the two the pair does not match, and
		// the first certificate is served until the key is there.
		writeFile(certFile, second.cert)
		writeFile(keyFile, second.key)
		Eventually(serial(addr)).WithTimeout(10 * time.Second).Should(Equal(second.serial))
		Eventually(expiry(reg)).WithTimeout(5 * time.Second).Should(Equal(float64(second.notAfter.Unix())))
	})

	It("should serve the certificate renamed over the files at the next handshake", func() {
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		first := leaf(ca, 1)
		writeFile(certFile, first.cert)
		writeFile(keyFile, first.key)
		_, addr := start(certFile, keyFile, eventsOnly)
		Expect(serial(addr)()).To(Equal(first.serial))

		for _, next := range []pair{leaf(ca, 2), leaf(ca, 3)} {
			renameFile(certFile, next.cert)
			renameFile(keyFile, next.key)
			Eventually(serial(addr)).WithTimeout(10 * time.Second).Should(Equal(next.serial))
		}
	})

	It("should serve the certificate a Secret volume's symlink swap publishes at the next handshake", func() {
		first := leaf(ca, 1)
		certFile, keyFile, swap := secretVolume(dir, first)
		_, addr := start(certFile, keyFile, eventsOnly)
		Expect(serial(addr)()).To(Equal(first.serial))

		// Twice: the watch follows the swap to the new files, and again from there.
		for _, next := range []pair{leaf(ca, 2), leaf(ca, 3)} {
			swap(next)
			Eventually(serial(addr)).WithTimeout(10 * time.Second).Should(Equal(next.serial))
		}
	})

	It("should find by its poll a swap that no event reports", func() {
		first, second := leaf(ca, 1), leaf(ca, 2)
		// The files are symlinks to the pair's own; repointing them changes neither file the
		// watch is on, so only a read of both paths finds the new pair.
		for _, p := range []pair{first, second} {
			writeFile(filepath.Join(dir, "crt"+p.String()), p.cert)
			writeFile(filepath.Join(dir, "key"+p.String()), p.key)
		}
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		Expect(os.Symlink("crt"+first.String(), certFile)).To(Succeed())
		Expect(os.Symlink("key"+first.String(), keyFile)).To(Succeed())
		_, addr := start(certFile, keyFile, 100*time.Millisecond)
		Expect(serial(addr)()).To(Equal(first.serial))

		for _, name := range []string{"crt", "key"} {
			link := filepath.Join(dir, name+".next")
			Expect(os.Symlink(name+second.String(), link)).To(Succeed())
			Expect(os.Rename(link, filepath.Join(dir, "tls."+name))).To(Succeed())
		}
		Eventually(serial(addr)).WithTimeout(10 * time.Second).Should(Equal(second.serial))
	})

	DescribeTable("should keep serving the last good certificate when the files are rewritten with a bad pair, and serve the next good one",
		func(bad func(certFile, keyFile string)) {
			certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
			first, next := leaf(ca, 1), leaf(ca, 3)
			writeFile(certFile, first.cert)
			writeFile(keyFile, first.key)
			_, addr := start(certFile, keyFile, eventsOnly)
			Expect(serial(addr)()).To(Equal(first.serial))

			refused := testutil.ToFloat64(certwatchermetrics.ReadCertificateErrors)
			bad(certFile, keyFile)
			// The watcher read the bad pair and refused it, counted and logged as an error ...
			Eventually(func() float64 { return testutil.ToFloat64(certwatchermetrics.ReadCertificateErrors) }).
				WithTimeout(10 * time.Second).Should(BeNumerically(">", refused))
			Eventually(loggedError("error re-reading certificate", certFile)).WithTimeout(5 * time.Second).Should(BeTrue())
			// ... and the first certificate is still served.
			Expect(serial(addr)()).To(Equal(first.serial))

			writeFile(certFile, next.cert)
			writeFile(keyFile, next.key)
			Eventually(serial(addr)).WithTimeout(10 * time.Second).Should(Equal(next.serial))
		},
		Entry("garbage in the certificate's file", func(c, _ string) { writeFile(c, []byte("-----BEGIN GARBAGE-----\n")) }),
		Entry("a certificate whose key is not the one beside it", func(c, _ string) { writeFile(c, leaf(ca, 2).cert) }),
	)
})

// String names the pair's files in a spec's directory.
func (p pair) String() string { return fmt.Sprint(p.serial) }
