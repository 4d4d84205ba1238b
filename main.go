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

// Command synapse-controller is the Synapse Fleet controller manager: it places catalog lanes
// onto Mac nodes and keeps their status, endpoints and identities in order. Its reconcilers are
// listed in controllers.NewControllers.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	fleetv1alpha1 "github.com/ck-synapse/synapse-fleet/api/v1alpha1"
	"github.com/ck-synapse/synapse-fleet/controllers"
	"github.com/ck-synapse/synapse-fleet/controllers/lane/endpoints"
	"github.com/ck-synapse/synapse-fleet/controllers/macnode/lifecycle"
	"github.com/ck-synapse/synapse-fleet/internal/memlimit"
)

func main() {
	var (
		metricsAddr      string
		probeAddr        string
		pprofAddr        string
		leaderElect      bool
		leaderElectionNS string
		secureMetrics    bool
		allowed, denied  string
		leaseDuration    time.Duration
		renewDeadline    time.Duration
		retryPeriod      time.Duration
		opts             controllers.Options
		memoryLimit      string
		memoryRatio      float64
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "address the Prometheus metrics endpoint binds to; 0 disables it")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address the /healthz and /readyz probes bind to")
	flag.StringVar(&pprofAddr, "pprof-bind-address", "", "address Go's pprof endpoints bind to, for profiling; empty disables them")
	flag.BoolVar(&leaderElect, "leader-elect", true, "elect a leader so that only one replica reconciles at a time")
	flag.StringVar(&leaderElectionNS, "leader-election-namespace", "", "namespace of the leader-election Lease; defaults to the pod's namespace")
	flag.BoolVar(&secureMetrics, "metrics-secure", true, "serve metrics over HTTPS to callers authenticated by TokenReview and authorised by SubjectAccessReview (get /metrics)")
	flag.StringVar(&allowed, "endpoint-cidrs", "", "comma-separated CIDRs the Macs' addresses may be in; only those are published in the lanes' EndpointSlices (none: no address is)")
	flag.StringVar(&denied, "denied-endpoint-cidrs", "", "comma-separated CIDRs never published, beside the cluster's own service, pod and node addresses (read from the API)")
	flag.DurationVar(&leaseDuration, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits after the leader's last renewal before it takes over")
	flag.DurationVar(&renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "how long the leader keeps retrying a renewal before it gives up leading (and exits): raise it where the API server is slow to answer")
	flag.DurationVar(&retryPeriod, "leader-elect-retry-period", 2*time.Second, "how often leader election is tried and the lease renewed")
	flag.DurationVar(&opts.NodeGracePeriod, "node-grace-period", lifecycle.DefaultGracePeriod, "how old a node's Lease may get before the node is Unknown")
	flag.DurationVar(&opts.NodeEvictionTimeout, "node-eviction-timeout", lifecycle.DefaultEvictionTimeout, "how long a node may stay Unknown before its placements are re-placed")
	flag.Float64Var(&opts.NodeEvictionRate, "node-eviction-rate", lifecycle.DefaultEvictionRate, "how many lost nodes a second may have their placements re-placed")
	flag.Float64Var(&opts.UnhealthyThreshold, "unhealthy-threshold", lifecycle.DefaultUnhealthyThreshold,
		"share of unreachable nodes (at least 3, or all of them) from which evictions stop until the fleet is reachable again")
	flag.Float64Var(&memoryRatio, "memory-limit-ratio", memlimit.DefaultRatio,
		"share of the memory limit the Go runtime's memory (heap, stacks) is kept under, collecting garbage harder as it nears it (the runtime's soft limit; GOMEMLIMIT, when set, stands instead); 0 leaves the runtime's default")
	flag.StringVar(&memoryLimit, "memory-limit", "", "the memory limit to take that share of (a quantity of at least 16Mi: 256Mi; 0 for none); empty reads the container's (its cgroup's, or the least of those above it)")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))
	log := ctrl.Log.WithName("setup")

	if err := limitMemory(memoryLimit, memoryRatio); err != nil {
		log.Error(err, "the memory limit")
		os.Exit(2)
	}
	var err error
	if opts.Addresses.Allowed, err = endpoints.ParsePrefixes(strings.Split(allowed, ",")); err != nil {
		log.Error(err, "--endpoint-cidrs")
		os.Exit(2)
	}
	if opts.Addresses.Denied, err = endpoints.ParsePrefixes(strings.Split(denied, ",")); err != nil {
		log.Error(err, "--denied-endpoint-cidrs")
		os.Exit(2)
	}
	if len(opts.Addresses.Allowed) == 0 {
		log.Info("no --endpoint-cidrs: no Mac address is published in the lanes' EndpointSlices until it is set")
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(fleetv1alpha1.AddToScheme(scheme))

	restConfig := ctrl.GetConfigOrDie()
	metricsOpts := metricsserver.Options{BindAddress: metricsAddr, SecureServing: secureMetrics}
	if secureMetrics {
		// controller-runtime's filter: TokenReview for who calls, SubjectAccessReview for
		// whether RBAC lets them get /metrics (config/rbac/metrics_reader_role.yaml).
		metricsOpts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(),
		Metrics:                 metricsOpts,
		HealthProbeBindAddress:  probeAddr,
		PprofBindAddress:        pprofAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "synapse-controller.fleet.synapse.dev",
		LeaderElectionNamespace: leaderElectionNS,
		LeaseDuration:           &leaseDuration,
		RenewDeadline:           &renewDeadline,
		RetryPeriod:             &retryPeriod,
		// The process exits right after the manager stops, so the lease can be given up at once
		// and a standby takes over without waiting for it to expire.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		log.Error(err, "unable to create the manager")
		os.Exit(1)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		log.Error(err, "unable to add the health check")
		os.Exit(1)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		log.Error(err, "unable to add the readiness check")
		os.Exit(1)
	}

	opts.Namespace, opts.Reader = ownNamespace(leaderElectionNS), mgr.GetAPIReader()
	ctx := ctrl.SetupSignalHandler()
	if err := controllers.IndexFields(ctx, mgr.GetFieldIndexer()); err != nil {
		log.Error(err, "unable to index the cache")
		os.Exit(1)
	}
	for _, c := range controllers.NewControllers(clock.RealClock{}, mgr.GetClient(), mgr.GetEventRecorder("synapse-controller"), opts) {
		if err := c.Register(ctx, mgr); err != nil {
			log.Error(err, "unable to register a controller", "controller", c.Name())
			os.Exit(1)
		}
	}

	log.Info("starting the manager")
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "the manager stopped with an error")
		os.Exit(1)
	}
}

// ownNamespace is the controller's namespace, where its leader-election Lease and the fleet
// CA's Secret are: the leader-election namespace when one is given, else the pod's, else
// synapse-system (config/default's).
func ownNamespace(leaderElectionNS string) string {
	if leaderElectionNS != "" {
		return leaderElectionNS
	}
	if ns, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && len(ns) > 0 {
		return strings.TrimSpace(string(ns))
	}
	return "synapse-system"
}

// limitMemory keeps the Go runtime's memory under ratio of the memory limit: the one given,
// else the container's. Without it the runtime lets the heap reach twice what is live before
// collecting, and a controller at a thousand Macs passed its Deployment's 256Mi.
func limitMemory(given string, ratio float64) error {
	log := ctrl.Log.WithName("setup")
	if !(ratio >= 0 && ratio <= 1) {
		return fmt.Errorf("--memory-limit-ratio %g is not a share from 0 to 1", ratio)
	}
	var limit int64
	source := "--memory-limit"
	if given != "" {
		var err error
		if limit, err = memlimit.Parse("--memory-limit", given); err != nil {
			return err
		}
	} else {
		source = "the container's cgroup"
		self, _ := os.ReadFile("/proc/self/cgroup") // none: the cgroup filesystem's root is read
		var err error
		if limit, err = memlimit.FromCgroup(os.DirFS("/sys/fs/cgroup"), string(self)); err != nil {
			log.Error(err, "the container's memory limit cannot be read; the Go runtime's memory is left to its default")
		}
	}
	soft, set := memlimit.Apply(memlimit.Soft(limit, ratio))
	switch {
	case set:
		log.Info("the Go runtime's memory is kept under its share of the memory limit", "limit", limit, "from", source, "ratio", ratio, "soft", soft)
	case memlimit.FromEnv():
		log.Info("the Go runtime's memory limit is GOMEMLIMIT's", "GOMEMLIMIT", os.Getenv("GOMEMLIMIT"), "soft", soft)
	default:
		log.Info("no memory limit found or none asked for: the Go runtime's memory is left to its default", "limit", limit, "ratio", ratio)
	}
	return nil
}
