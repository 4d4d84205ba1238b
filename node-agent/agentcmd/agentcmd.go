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

// Package agentcmd is the synapse-agent command line: flags into an agent.Config, and the
// agent's run. Subcommands (the artifacts group) hang off the same root.
package agentcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/node-agent/agent"
	"github.com/ck-synapse/synapse-fleet/node-agent/apiauth"
	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/convert"
	"github.com/ck-synapse/synapse-fleet/node-agent/httpapi"
	"github.com/ck-synapse/synapse-fleet/node-agent/servingcert"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

type options struct {
	nodeName, stateDir, lockPath, workerBinary, backend string
	advertise, macOSBuild, chip, signingID              string
	listen                                              []string
	artifactRoot, chipFamily, certifyObservation        string
	auth, authAudience, adminSocket                     string
	tls, tlsCertFile, tlsKeyFile, tlsDir                string
	tlsWait                                             time.Duration
	labels                                              map[string]string
	simScale                                            float64
	budget                                              int
	leaseDuration, statusInterval, progressInterval     time.Duration
	memoryLimit                                         string
}

// NewCommand returns the synapse-agent root command.
func NewCommand() *cobra.Command {
	o := options{}
	zapOpts := zap.Options{}
	cmd := &cobra.Command{
		Use:   "synapse-agent",
		Short: "The Synapse Fleet node agent: serves a Mac's lanes on its Neural Engine",
		Long: `synapse-agent runs on each Mac of the fleet. It registers the node's MacNode, renews its
Lease, loads the lanes of the LanePlacements bound to it into worker processes, serves
/v1/embeddings and /v1/rerank over HTTPS (a certificate from the cluster's signer), and reports everything back to the cluster.

The sim backend runs anywhere and stands in for the Neural Engine; it must be asked for
explicitly (--backend sim): an agent never switches to it on its own.`,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
			return run(cmd, o)
		},
	}
	f := cmd.Flags()
	host, _ := os.Hostname()
	f.StringVar(&o.nodeName, "node-name", host, "the MacNode this agent runs")
	f.StringToStringVar(&o.labels, "node-labels", nil, "labels set on the MacNode when the agent creates it (k=v,...)")
	f.StringVar(&o.stateDir, "state-dir", "", "where the agent keeps its state (the sim backend's aned cache); required")
	f.StringVar(&o.lockPath, "lock-path", "", "the machine's Neural Engine lane lock (default <state-dir>/ane.lock)")
	f.StringVar(&o.workerBinary, "worker-binary", "", "the synapse-ane-worker executable (default: next to this binary)")
	f.StringVar(&o.backend, "backend", "ane", "the workers' backend: ane (macOS on Apple silicon) or sim (the stand-in, any OS)")
	f.StringVar(&o.signingID, "signing-identifier", "synapse-ane-worker", "the worker's code-signing identifier")
	f.StringSliceVar(&o.listen, "listen", []string{":8080"}, "the HTTP API's listen addresses (repeat or comma-separate); a later one with port 0 takes the first one's port")
	f.StringVar(&o.advertise, "advertise-address", "", "the address the node advertises, which the lanes' EndpointSlices list (default: the first non-loopback IPv4 address)")
	f.StringVar(&o.macOSBuild, "macos-build", "", "sim: the macOS build the node reports (the ane backend reads the real one)")
	f.StringVar(&o.chip, "chip", "", "sim: the chip the node reports")
	f.StringVar(&o.chipFamily, "chip-family", "", "sim: the chip family artifacts are matched against (default M4); the ane backend reads it from the chip")
	f.StringVar(&o.artifactRoot, "artifact-root", "", "where the model artifacts are (default <state-dir>/artifacts); nothing loads unless its artifact there verifies")
	f.Float64Var(&o.simScale, "sim-scale", 1, "sim: multiplies every simulated compile and load time")
	f.IntVar(&o.budget, "budget", 0, "the machine's layer executables (default 100)")
	f.DurationVar(&o.leaseDuration, "lease-duration", 30*time.Second, "the node Lease's duration; it is renewed every third of it")
	f.DurationVar(&o.statusInterval, "status-interval", time.Second, "the least time between two status writes of one object")
	f.DurationVar(&o.progressInterval, "placement-progress-interval", agent.DefaultPlacementProgressInterval,
		"the least time between two writes of a placement's status that only report progress (the layers compiled): each is sent to every agent's placement watch")
	f.StringVar(&o.certifyObservation, "certify-observation", "", "backend certification only: record the workers' inventories and the independent admission count to this file every status interval, for synapse-certify")
	f.StringVar(&o.auth, "auth", "kubernetes", "how API calls are let in: kubernetes (a bearer token the API server accepts for --auth-audience, and RBAC on cataloglanes/embeddings or cataloglanes/rerank) or none (every caller, as anonymous: a development fleet only)")
	f.StringVar(&o.adminSocket, "admin-socket", "", "the Unix socket the admin API (POST /admin/pause, /admin/resume) is served on, to the agent's user only (default <state-dir>/admin.sock); never on --listen")
	f.StringVar(&o.authAudience, "auth-audience", apiauth.DefaultAudience, "the audience a caller's token must be issued for")
	f.StringVar(&o.tls, "tls", "auto", "how the HTTP API is encrypted: auto (a serving certificate for the node's name and --advertise-address from the cluster's signer "+
		servingcert.SignerName+", renewed before it expires), files (--tls-cert-file and --tls-key-file, read at start and again whenever they change) or none (plain HTTP: a development fleet only)")
	f.StringVar(&o.tlsCertFile, "tls-cert-file", "", "--tls=files: the serving certificate (PEM, the leaf first)")
	f.StringVar(&o.tlsKeyFile, "tls-key-file", "", "--tls=files: the serving certificate's key (PEM)")
	f.StringVar(&o.tlsDir, "tls-cert-dir", "", "--tls=auto: where the serving certificate and its key are kept across restarts (default <state-dir>/pki)")
	f.DurationVar(&o.tlsWait, "tls-wait-timeout", servingcert.DefaultWaitTimeout, "--tls=auto: how long the agent waits for its first serving certificate before it exits saying what became of its request (while the request waits for its answer, up to 15m in all)")
	f.StringVar(&o.memoryLimit, "memory-limit", DefaultMemoryLimit, "the agent's soft memory limit (a quantity: 512Mi, 1Gi; 0 for none): the Go runtime collects sooner as its memory nears it. GOMEMLIMIT, when set, takes the place of the default")
	gf := flag.NewFlagSet("", flag.ContinueOnError)
	zapOpts.BindFlags(gf)
	f.AddGoFlagSet(gf)
	// --kubeconfig is controller-runtime's own flag.
	f.AddGoFlag(flag.CommandLine.Lookup("kubeconfig"))
	cmd.AddCommand(newArtifactsCommand(), newJoinCommand())
	return cmd
}

func run(cmd *cobra.Command, o options) error {
	log := ctrl.Log.WithName("agent")
	if o.stateDir == "" {
		return errors.New("--state-dir is required")
	}
	if _, err := memoryLimit(o.memoryLimit, cmd.Flags().Changed("memory-limit"), log); err != nil {
		return err
	}
	if o.nodeName == "" {
		return errors.New("--node-name is required")
	}
	if err := os.MkdirAll(o.stateDir, 0o755); err != nil {
		return err
	}
	if o.lockPath == "" {
		o.lockPath = filepath.Join(o.stateDir, "ane.lock")
	}
	if o.artifactRoot == "" {
		o.artifactRoot = filepath.Join(o.stateDir, "artifacts")
	}
	if o.adminSocket == "" {
		o.adminSocket = filepath.Join(o.stateDir, "admin.sock")
	}
	if o.workerBinary == "" {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		o.workerBinary = filepath.Join(filepath.Dir(self), "synapse-ane-worker")
	}
	digest, err := artifact.FileSHA256(o.workerBinary)
	if err != nil {
		return fmt.Errorf("the worker binary: %w", err)
	}
	platform, err := platformOf(o)
	if err != nil {
		return err
	}
	family, converter := o.chipFamily, ""
	switch o.backend {
	case "sim":
		converter = artifact.SimConverterVersion
		if family == "" {
			family = "M4"
		}
	case "ane":
		converter = convert.ConverterVersion
		if family != "" {
			return errors.New("--chip-family is for the sim backend; the ane backend reads the machine's own")
		}
		if family = chipFamily(platform.Chip); family == "" {
			return fmt.Errorf("cannot tell the chip family of %q", platform.Chip)
		}
	}
	if o.advertise == "" {
		if o.advertise, err = firstIPv4(); err != nil {
			return err
		}
	}
	// The Mac's own identity: the kubeconfig join wrote into the state directory, unless
	// --kubeconfig or $KUBECONFIG names another.
	if kc := flag.CommandLine.Lookup("kubeconfig"); kc != nil {
		if p := identityKubeconfig(kc.Value.String(), o.stateDir); p != kc.Value.String() {
			if err := kc.Value.Set(p); err != nil {
				return err
			}
		}
	}
	restConfig, err := ctrl.GetConfig()
	if err != nil {
		return err
	}
	renewer, err := identityRenewer(restConfig, o.nodeName, log)
	if err != nil {
		return err
	}
	scheme := k8sruntime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(v1.AddToScheme(scheme))

	clk := clock.RealClock{}
	auth, err := apiAuth(o, restConfig, clk, log)
	if err != nil {
		return err
	}
	cert, err := servingCertificate(o, restConfig, clk, log)
	if err != nil {
		return err
	}
	host := workerhost.New(workerhost.Config{Binary: o.workerBinary, Backend: o.backend, SigningIdentifier: o.signingID, BinaryDigest: digest, StateDir: o.stateDir, SimScale: o.simScale,
		Log: log.WithName("worker"), Clock: clk})
	a := agent.New(agent.Config{
		NodeName: o.nodeName, Labels: o.labels, Platform: platform,
		Worker:       v1.NodeWorker{SigningIdentifier: o.signingID, BinaryDigest: v1.Sha256Digest(digest), ProtocolVersion: 3, Backend: v1.WorkerBackend(o.backend)},
		ArtifactRoot: o.artifactRoot, ChipFamily: family, ConverterVersion: converter,
		Budget: o.budget, LeaseDuration: o.leaseDuration, StatusInterval: o.statusInterval, PlacementProgressInterval: o.progressInterval, Address: o.advertise, Listen: o.listen, Host: host, LockPath: o.lockPath, Clock: clk, Log: log,
		CertifyObservation: o.certifyObservation,
		Auth:               auth, AdminSocket: o.adminSocket, TLS: cert,
	})
	ctx, cancel := context.WithCancel(ctrl.SetupSignalHandler())
	defer cancel()
	renewing := runRenewer(ctx, renewer)
	err = a.Run(ctx, restConfig, scheme)
	cancel() // the renewer stops with the agent
	return errors.Join(err, <-renewing)
}

// apiAuth is how the HTTP API lets calls in: by the API server's word (TokenReview and
// SubjectAccessReview, asked as the node's own identity), or, only when asked for, anyone.
func apiAuth(o options, restConfig *rest.Config, clk clock.PassiveClock, log logr.Logger) (httpapi.Auth, error) {
	switch o.auth {
	case "kubernetes":
		if o.authAudience == "" {
			return nil, errors.New("--auth-audience must not be empty: a token for the API server's own audience is one an agent could replay as its caller")
		}
		cs, err := kubernetes.NewForConfig(restConfig)
		if err != nil {
			return nil, err
		}
		return apiauth.New(apiauth.Config{TokenReviews: cs.AuthenticationV1(), SubjectAccessReviews: cs.AuthorizationV1(),
			Audience: o.authAudience, Clock: clk, Log: log.WithName("auth")}), nil
	case "none":
		log.Info("the HTTP API lets every caller in as anonymous (--auth=none): use this for a development fleet only")
		return apiauth.Anonymous{}, nil
	}
	return nil, fmt.Errorf("--auth must be kubernetes or none, got %q", o.auth)
}

// servingCertificate is where the HTTP API's certificate comes from: the cluster's signer
// (asked as the node's own identity), files, or, only when asked for, nowhere (plain HTTP).
func servingCertificate(o options, restConfig *rest.Config, clk clock.WithTicker, log logr.Logger) (agent.ServingCertificate, error) {
	if o.tls != "files" && (o.tlsCertFile != "" || o.tlsKeyFile != "") {
		return nil, errors.New("--tls-cert-file and --tls-key-file are for --tls=files")
	}
	switch o.tls {
	case "auto":
		cs, err := kubernetes.NewForConfig(restConfig)
		if err != nil {
			return nil, err
		}
		dir := o.tlsDir
		if dir == "" {
			dir = filepath.Join(o.stateDir, "pki")
		}
		return servingcert.New(servingcert.Config{Node: o.nodeName, Addresses: []string{o.advertise}, Client: cs, Dir: dir,
			WaitTimeout: o.tlsWait, Clock: clk, Log: log.WithName("tls")})
	case "files":
		if o.tlsCertFile == "" || o.tlsKeyFile == "" {
			return nil, errors.New("--tls=files needs --tls-cert-file and --tls-key-file")
		}
		return servingcert.LoadFiles(servingcert.FilesConfig{CertFile: o.tlsCertFile, KeyFile: o.tlsKeyFile, Log: log.WithName("tls")})
	case "none":
		log.Info("the HTTP API is served as plain HTTP (--tls=none): callers' tokens and data cross the network unencrypted; use this for a development fleet only")
		return nil, nil
	}
	return nil, fmt.Errorf("--tls must be auto, files or none, got %q", o.tls)
}

// platformOf is the machine the node reports. The ane backend reads the real macOS build; the
// sim backend reports what it is told, so a dev fleet can show identity matching.
func platformOf(o options) (v1.Platform, error) {
	switch o.backend {
	case "sim":
		p := v1.Platform{Chip: o.chip, MacOSBuild: v1.MacOSBuild(o.macOSBuild), HardwareModel: "sim"}
		if p.Chip == "" {
			p.Chip = "sim"
		}
		if p.MacOSBuild == "" {
			return p, errors.New("--macos-build is required with --backend sim: the node reports it, and identities match it exactly")
		}
		return p, nil
	case "ane":
		if runtime.GOOS != "darwin" || runtime.GOARCH != "arm64" {
			return v1.Platform{}, fmt.Errorf("--backend ane requires macOS on Apple silicon, not %s/%s; the sim backend must be asked for with --backend sim", runtime.GOOS, runtime.GOARCH)
		}
		if o.macOSBuild != "" || o.chip != "" {
			return v1.Platform{}, errors.New("--macos-build and --chip are for the sim backend; the ane backend reports the machine's own")
		}
		build, err := exec.Command("sysctl", "-n", "kern.osversion").Output()
		if err != nil {
			return v1.Platform{}, fmt.Errorf("reading the macOS build: %w", err)
		}
		chip, err := exec.Command("sysctl", "-n", "machdep.cpu.brand_string").Output()
		if err != nil {
			return v1.Platform{}, fmt.Errorf("reading the chip: %w", err)
		}
		model, _ := exec.Command("sysctl", "-n", "hw.model").Output()
		return v1.Platform{Chip: strings.TrimSpace(string(chip)), MacOSBuild: v1.MacOSBuild(strings.TrimSpace(string(build))),
			HardwareModel: strings.TrimSpace(string(model))}, nil
	}
	return v1.Platform{}, fmt.Errorf("--backend must be ane or sim, got %q", o.backend)
}

// chipFamily is the family of an Apple silicon chip's name ("Apple M4 Pro" is M4), or "".
func chipFamily(chip string) string {
	for _, word := range strings.Fields(chip) {
		if len(word) >= 2 && word[0] == 'M' && strings.Trim(word[1:], "0123456789") == "" {
			return word
		}
	}
	return ""
}

func firstIPv4() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() && ip.IP.To4() != nil {
			return ip.IP.String(), nil
		}
	}
	return "", errors.New("no non-loopback IPv4 address; pass --advertise-address")
}
