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

package agentcmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	"github.com/ck-synapse/synapse-fleet/node-agent/servingcert"
)

// TestTLSIsOnUnlessTurnedOff: the API is encrypted by default, with a certificate from the
// cluster's signer kept in the state directory; plain HTTP only when asked for by name.
func TestTLSIsOnUnlessTurnedOff(t *testing.T) {
	state := t.TempDir()
	base := options{nodeName: "mac-a", stateDir: state, advertise: "192.0.2.1", tls: "auto", tlsWait: servingcert.DefaultWaitTimeout}
	cfg := &rest.Config{Host: "https://127.0.0.1:6443"}

	cert, err := servingCertificate(base, cfg, clock.RealClock{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cert.(*servingcert.Auto); !ok {
		t.Fatalf("--tls=auto gave %T", cert)
	}
	if fi, err := os.Stat(filepath.Join(state, "pki")); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the certificate's directory: %v %v", fi, err)
	}

	none := base
	none.tls = "none"
	if cert, err := servingCertificate(none, cfg, clock.RealClock{}, logr.Discard()); err != nil || cert != nil {
		t.Fatalf("--tls=none gave %v, %v; want plain HTTP", cert, err)
	}

	for _, c := range []struct {
		name string
		edit func(*options)
		want string
	}{
		{"an unknown mode", func(o *options) { o.tls = "sometimes" }, "--tls must be auto, files or none"},
		{"files without files", func(o *options) { o.tls = "files" }, "--tls=files needs --tls-cert-file and --tls-key-file"},
		{"files that are not there", func(o *options) {
			o.tls, o.tlsCertFile, o.tlsKeyFile = "files", "/nonexistent/tls.crt", "/nonexistent/tls.key"
		}, "the serving certificate files"},
		{"files with auto", func(o *options) { o.tlsCertFile = "tls.crt" }, "are for --tls=files"},
		{"an advertised address that is no IP", func(o *options) { o.advertise = "mac-a.local" }, "is not an IP address"},
	} {
		o := base
		c.edit(&o)
		_, err := servingCertificate(o, cfg, clock.RealClock{}, logr.Discard())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
}
