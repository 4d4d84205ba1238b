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

package servingcert

import (
	"context"
	"crypto/tls"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	certwatchermetrics "sigs.k8s.io/controller-runtime/pkg/certwatcher/metrics"
)

// Files is a certificate an administrator provides (--tls=files): read when the agent starts,
// and read again whenever its files change (cert-manager rewriting them in place, a Secret
// volume swapping its symlink), so that a renewed certificate is served without a restart.
// Renewing it is the administrator's business.
//
// The watching is controller-runtime's certwatcher (kubernetes-sigs/controller-runtime,
// pkg/certwatcher/certwatcher.go), which the webhook and metrics servers of every
// controller-runtime manager use: an fsnotify watch on both files, re-added when a file is
// removed or replaced (an atomic rename, the old target of a swapped symlink deleted), and a
// poll of both files every PollInterval as the backstop for changes no event reports. Each read
// takes both files as a pair: a pair that does not parse or whose key does not match (garbage,
// or a rotation half-written, the certificate new and the key not yet) is refused, logged as an
// error through controller-runtime's logger and counted in certwatcher_read_certificate_errors_total,
// and the last good certificate is served until a read finds a good pair again.
type Files struct {
	watcher *certwatcher.CertWatcher
	log     logr.Logger
	// changed is signalled (by the watcher's callback) when the watcher holds a certificate
	// it did not hold before; report then says which one is served.
	changed chan struct{}
	expiry  prometheus.Gauge
}

// FilesConfig is where an administrator's certificate is.
type FilesConfig struct {
	// CertFile is the certificate (PEM, the leaf first), KeyFile its key (PEM).
	CertFile, KeyFile string
	// PollInterval is how often both files are read even when no change was reported
	// (certwatcher's own default, 10 s, if zero).
	PollInterval time.Duration
	Log          logr.Logger
}

// LoadFiles reads the certificate and its key, and fails if they are missing or are not a pair.
// Obtain then watches them until its context ends, which also releases the watch.
func LoadFiles(cfg FilesConfig) (*Files, error) {
	// certwatcher.New reads the pair before it returns and fails as tls.X509KeyPair does
	// (kubernetes-sigs/controller-runtime, pkg/certwatcher/certwatcher.go: New, ReadCertificate).
	w, err := certwatcher.New(cfg.CertFile, cfg.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("the serving certificate files: %w", err)
	}
	if cfg.PollInterval > 0 {
		w = w.WithWatchInterval(cfg.PollInterval)
	}
	f := &Files{watcher: w, log: cfg.Log, changed: make(chan struct{}, 1),
		expiry: prometheus.NewGauge(prometheus.GaugeOpts{Name: "synapse_agent_serving_certificate_expiration_timestamp_seconds",
			Help: "When the HTTP API's current serving certificate expires (Unix time)."}),
	}
	// The callback runs at once for the certificate New read, under the watcher's lock, and
	// later in a goroutine of its own per change, in no set order (certwatcher.go:
	// RegisterCallback, ReadCertificate): it only signals, and report asks the watcher for the
	// certificate it holds then, so that the last one reported is the one served.
	w.RegisterCallback(func(tls.Certificate) {
		select {
		case f.changed <- struct{}{}:
		default: // a report is already due, and it reads the latest certificate
		}
	})
	return f, nil
}

// Obtain starts watching the files, until ctx ends; the first certificate was read by
// LoadFiles, so it returns at once.
func (f *Files) Obtain(ctx context.Context, _ func() bool) error {
	go func() {
		// Start returns when ctx ends, or if the files cannot be watched within its own 10 s
		// (then neither events nor the poll are read again: certwatcher.go, Start).
		if err := f.watcher.Start(ctx); err != nil && ctx.Err() == nil {
			f.log.Error(err, "the serving certificate files are not watched: a certificate written to them now is served only after the agent restarts")
		}
	}()
	go f.report(ctx)
	return nil
}

// report says, in the log and the expiry gauge, which certificate is served, each time that
// changes.
func (f *Files) report(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.changed:
		}
		c, _ := f.watcher.GetCertificate(nil) // never fails: it returns what the watcher holds
		if c == nil || c.Leaf == nil {
			continue // not held before New's first read; tls.X509KeyPair sets Leaf
		}
		f.expiry.Set(float64(c.Leaf.NotAfter.Unix()))
		f.log.Info("serving the certificate of the files", "serial", c.Leaf.SerialNumber.String(),
			"subject", c.Leaf.Subject.String(), "notAfter", c.Leaf.NotAfter.UTC())
	}
}

// ServeLanes does nothing: the administrator's certificate names what it names (for calls
// through the lanes' Services, their names: see docs/trust-model.md).
func (f *Files) ServeLanes([]types.NamespacedName) {}

// NamesLane is true: whether the administrator's certificate names the lane's Service is the
// administrator's business, and a placement is not held back for it.
func (f *Files) NamesLane(types.NamespacedName) bool { return true }

// OnIssued does nothing: NamesLane is true whatever certificate the files hold, so no
// placement waits for a new one.
func (f *Files) OnIssued(func()) {}

// GetCertificate is the TLS server's: every new connection gets the certificate the watcher
// holds then.
func (f *Files) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	return f.watcher.GetCertificate(hello)
}

// Describe and Collect make the source's metrics part of the agent's: the served
// certificate's expiry, and certwatcher's own counts of reads and of refused reads (kept by
// controller-runtime for the whole process: certwatcher/metrics/metrics.go).
func (f *Files) Describe(ch chan<- *prometheus.Desc) {
	f.expiry.Describe(ch)
	certwatchermetrics.ReadCertificateTotal.Describe(ch)
	certwatchermetrics.ReadCertificateErrors.Describe(ch)
}

// Collect implements prometheus.Collector.
func (f *Files) Collect(ch chan<- prometheus.Metric) {
	f.expiry.Collect(ch)
	certwatchermetrics.ReadCertificateTotal.Collect(ch)
	certwatchermetrics.ReadCertificateErrors.Collect(ch)
}
