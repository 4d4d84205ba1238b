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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/ck-synapse/synapse-fleet/node-agent/artifact"
	"github.com/ck-synapse/synapse-fleet/node-agent/convert"
	"github.com/ck-synapse/synapse-fleet/node-agent/family"
	"github.com/ck-synapse/synapse-fleet/node-agent/importprobe"
	"github.com/ck-synapse/synapse-fleet/node-agent/workerhost"
)

// newArtifactsCommand is the artifacts group: convert (ane), build (sim), verify, list,
// import, fetch, prune.
func newArtifactsCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "artifacts",
		Short: "Build, verify, list, import, fetch and prune model artifacts",
		Long: `A model artifact is a directory holding what a worker loads and a manifest.json that says
exactly what it is: model, revision, checkpoint, conversion policy, rungs, fp16, CPU_AND_NE,
platform profile, the SHA-256 of every file, its placement path and the parity gate. Nothing
unverified loads; a corrupt artifact is moved to .quarantine beside it.`,
	}
	cmd.AddCommand(newConvertCommand(), newBuildCommand(), newVerifyCommand(), newListCommand(), newImportCommand(), newFetchCommand(), newPruneCommand())
	return cmd
}

// machineFlags are the registry and this machine's profile, for import, fetch and prune.
func machineFlags(cmd *cobra.Command, im *artifact.Importer) {
	f := cmd.Flags()
	f.StringVar(&im.Root, "root", "", "the artifact root (the agent's --artifact-root) (required)")
	f.StringVar(&im.Backend, "backend", "", "this machine's backend: ane or sim (required)")
	f.StringVar(&im.Machine.ChipFamily, "chip-family", "", "this machine's chip family (required)")
	f.StringVar(&im.Machine.MacOSBuild, "macos-build", "", "this machine's macOS build (required)")
	f.StringVar(&im.ConverterVersion, "converter-version", artifact.SimConverterVersion, "this machine's converter version")
	for _, name := range []string{"root", "backend", "chip-family", "macos-build"} {
		_ = cmd.MarkFlagRequired(name)
	}
}

func report(cmd *cobra.Command, res *artifact.ImportResult) {
	switch {
	case res.AlreadyRegistered:
		fmt.Fprintf(cmd.OutOrStdout(), "%s: already registered and verified; nothing changed\n", res.Dir)
	case res.Replaced:
		fmt.Fprintf(cmd.OutOrStdout(), "%s: replaced and published\n", res.Dir)
	default:
		fmt.Fprintf(cmd.OutOrStdout(), "%s: registered and published\n", res.Dir)
	}
	if p := res.Probe; p != nil {
		fmt.Fprintf(cmd.OutOrStdout(), "placement probe at the registered path: rung %d, %s on the Neural Engine, %s on the CPU reference, ratio %.2f (at most %.1f)\n",
			p.Rung, p.Device, p.CPU, p.Ratio(), artifact.ProbeRatioLimit)
	} else {
		fmt.Fprintf(cmd.OutOrStdout(), "not probed: %s\n", res.NotProbed)
	}
}

// probeFlags are what an import needs to probe the registered artifact on a Mac whose workers
// run the ane backend: the agent's state folder (its lane lock) and worker.
type probeFlags struct{ stateDir, lockPath, workerBinary, signingID string }

func (p *probeFlags) add(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&p.stateDir, "state-dir", "", "ane backend: the agent's state folder; with it the import probes the registered artifact on the Neural Engine")
	f.StringVar(&p.lockPath, "lock-path", "", "ane backend: the machine's lane lock (default <state-dir>/ane.lock); held by a running agent, the import does not probe")
	f.StringVar(&p.workerBinary, "worker-binary", "", "ane backend: the synapse-ane-worker executable (default: next to this binary)")
	f.StringVar(&p.signingID, "signing-identifier", "synapse-ane-worker", "ane backend: the worker's code-signing identifier")
}

// apply sets the importer's probe: on a Mac with the ane backend and a state folder, a worker
// probes the registered artifact; elsewhere the import says why it does not.
func (p probeFlags) apply(im *artifact.Importer) error {
	c := importprobe.Config{Backend: im.Backend, LockPath: p.lockPath}
	if im.Backend == "ane" && p.stateDir != "" {
		if c.LockPath == "" {
			c.LockPath = filepath.Join(p.stateDir, "ane.lock")
		}
		bin := p.workerBinary
		if bin == "" {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			bin = filepath.Join(filepath.Dir(self), "synapse-ane-worker")
		}
		digest, err := artifact.FileSHA256(bin)
		if err != nil {
			return fmt.Errorf("the worker binary: %w", err)
		}
		c.Host = workerhost.New(workerhost.Config{Binary: bin, Backend: im.Backend, SigningIdentifier: p.signingID, BinaryDigest: digest,
			StateDir: p.stateDir, Log: ctrl.Log.WithName("import-probe")})
	}
	im.Probe, im.NoProbe = importprobe.For(c)
	return nil
}

func newImportCommand() *cobra.Command {
	var im artifact.Importer
	var probe probeFlags
	var force bool
	var sha string
	cmd := &cobra.Command{
		Use:   "import ARCHIVE",
		Short: "Register an artifact archive (.tar.gz): verified staged, gated and probed in place, published atomically",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := probe.apply(&im); err != nil {
				return err
			}
			res, err := im.Import(args[0], sha, force)
			if err != nil {
				return err
			}
			report(cmd, res)
			return nil
		},
	}
	machineFlags(cmd, &im)
	probe.add(cmd)
	cmd.Flags().BoolVar(&force, "force", false, "replace a registered artifact (the previous one is put back if anything fails)")
	cmd.Flags().StringVar(&sha, "sha256", "", "the archive's expected sha256:<hex>")
	return cmd
}

func newFetchCommand() *cobra.Command {
	var im artifact.Importer
	var probe probeFlags
	var force, offline bool
	var repo, model, revision, policy string
	cmd := &cobra.Command{
		Use:   "fetch",
		Short: "Fetch an artifact for this machine from a repository and import it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if repo == "" {
				repo = os.Getenv(artifact.RepoEnv)
			}
			if err := probe.apply(&im); err != nil {
				return err
			}
			res, err := im.Fetch(cmd.Context(), repo, model, revision, policy, offline, force)
			if err != nil {
				return err
			}
			report(cmd, res)
			return nil
		},
	}
	machineFlags(cmd, &im)
	probe.add(cmd)
	f := cmd.Flags()
	f.StringVar(&repo, "repo", "", "the repository: an http(s) URL or a directory holding index.json (default $"+artifact.RepoEnv+"; there is no other default)")
	f.StringVar(&model, "model", "", "the model (required)")
	f.StringVar(&revision, "revision", "", "its revision (required)")
	f.StringVar(&policy, "conversion-policy", "", "its conversion policy (required)")
	f.BoolVar(&offline, "offline", false, "never touch the network: succeed only if the artifact is installed")
	f.BoolVar(&force, "force", false, "replace a registered artifact")
	for _, name := range []string{"model", "revision", "conversion-policy"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func newPruneCommand() *cobra.Command {
	var im artifact.Importer
	cmd := &cobra.Command{
		Use:   "prune",
		Short: "Remove what killed imports left (once they have exited and are an hour old), putting back replaced artifacts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			removed, err := im.Prune()
			for _, dir := range removed {
				fmt.Fprintf(cmd.OutOrStdout(), "removed %s\n", dir)
			}
			return err
		},
	}
	machineFlags(cmd, &im)
	return cmd
}

func newConvertCommand() *cobra.Command {
	var o convert.Options
	var root, pooling string
	cmd := &cobra.Command{
		Use:   "convert CHECKPOINT",
		Short: "Convert a checkpoint (config.json, safetensors, tokenizer.json) into an ane artifact",
		Long: `Convert reads a ModernBERT or Qwen3 checkpoint directory and writes its ane artifact under
ROOT/MODEL/REVISION/` + convert.DefaultPolicy.Name + `: the fp16 weights, every layer's MIL program at every rung, the
tokenizer (its truncation and padding recorded and stripped), and goldens from the CPU
reference. The pooling is the checkpoint's sentence-transformers one. A weight fp16 cannot hold
is refused by name; the parity gate compares the fp16 programs, at the smallest rung, the
largest up to 2048 and a sampled one between, with the same layers in float32 on the
checkpoint's own weights; an artifact that fails it is not written.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Policy = convert.DefaultPolicy
			o.Policy.Pooling = family.Pooling(pooling)
			ck, err := convert.OpenCheckpoint(args[0], o.Policy)
			if err != nil {
				return err
			}
			defer ck.Close()
			dst, err := artifact.Path(root, o.Model, o.Revision, o.Policy.Name)
			if err != nil {
				return err
			}
			m, err := convert.Convert(dst, ck, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "converted %s: %s %s (%s, %d layers), rungs %v, checkpoint %s, policy %s; parity passed, largest difference %.5f\n",
				dst, m.Model, m.Revision, ck.Config.Kind, m.Layers, m.Rungs, m.CheckpointDigest, m.ConversionPolicy.Digest, m.Parity.MaxAbsError)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&root, "root", "", "the artifact root (the agent's --artifact-root) (required)")
	f.StringVar(&o.Model, "model", "", "the model's name (required)")
	f.StringVar(&o.Revision, "revision", "", "the checkpoint's revision (required)")
	f.IntSliceVar(&o.Rungs, "rungs", nil, "the rungs, ascending multiples of 64 (required)")
	f.StringVar(&o.Platform.ChipFamily, "chip-family", "", "the platform profile's chip family (required)")
	f.StringVar(&o.Platform.MacOSBuild, "macos-build", "", "the platform profile's macOS build (required)")
	f.StringVar(&pooling, "pooling", "", "cls, mean or last: must agree with the checkpoint's sentence-transformers pooling, and is required for a checkpoint that has none")
	for _, name := range []string{"root", "model", "revision", "rungs", "chip-family", "macos-build"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func newBuildCommand() *cobra.Command {
	var s artifact.SimSpec
	var rungs []int
	var policyName, policyDigest string
	cmd := &cobra.Command{
		Use:   "build DIR",
		Short: "Build a sim artifact from a seed (an ane artifact is converted: see convert)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s.Rungs, s.ConversionPolicy = rungs, artifact.ConversionPolicy{Name: policyName, Digest: policyDigest}
			m, err := artifact.BuildSim(args[0], s)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "built %s: %s %s, rungs %v, graph %s, parity %s\n", args[0], m.Model, m.Revision, m.Rungs, m.GraphDigest, m.Parity.Status)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&s.Model, "model", "", "the model's name (required)")
	f.StringVar(&s.Revision, "revision", "", "the model's revision (required)")
	f.StringVar(&s.CheckpointDigest, "checkpoint-digest", "", "the checkpoint's sha256:<hex> (required)")
	f.StringVar(&policyName, "conversion-policy", "", "the conversion policy's name (required)")
	f.StringVar(&policyDigest, "conversion-policy-digest", "", "the conversion policy's sha256:<hex> (required)")
	f.StringVar(&s.ConverterVersion, "converter-version", "sim-1", "the converter's version")
	f.StringVar(&s.Platform.ChipFamily, "chip-family", "", "the platform profile's chip family (required)")
	f.StringVar(&s.Platform.MacOSBuild, "macos-build", "", "the platform profile's macOS build (required)")
	f.IntSliceVar(&rungs, "rungs", nil, "the rungs, ascending (required)")
	f.IntVar(&s.Layers, "layers", 0, "the model's layers (required)")
	f.IntVar(&s.Dimensions, "dimensions", 0, "the output vectors' dimensions (required)")
	f.StringVar(&s.Seed, "seed", "", "the seed the sim model's outputs follow from (default: model/revision)")
	for _, name := range []string{"model", "revision", "checkpoint-digest", "conversion-policy", "conversion-policy-digest", "chip-family", "macos-build", "rungs", "layers", "dimensions"} {
		_ = cmd.MarkFlagRequired(name)
	}
	cmd.PreRun = func(*cobra.Command, []string) {
		if s.Seed == "" {
			s.Seed = s.Model + "/" + s.Revision
		}
	}
	return cmd
}

func newVerifyCommand() *cobra.Command {
	var w artifact.Want
	var policyName, policyDigest string
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Verify an artifact as a load would (a corrupt one is quarantined)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			w.ConversionPolicy = artifact.ConversionPolicy{Name: policyName, Digest: policyDigest}
			v, err := artifact.Verifier{}.Verify(args[0], w)
			if err != nil {
				return err
			}
			how := "every file hashed"
			if v.FromStamp {
				how = "unchanged since its last verification (stamp)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: verified: %s %s, rungs %v; %s\n", args[0], v.Manifest.Model, v.Manifest.Revision, v.Manifest.Rungs, how)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&w.Model, "model", "", "the model it must be (required)")
	f.StringVar(&w.Revision, "revision", "", "the revision it must be (required)")
	f.StringVar(&w.CheckpointDigest, "checkpoint-digest", "", "the checkpoint it must come from (required)")
	f.StringVar(&policyName, "conversion-policy", "", "the conversion policy it must come from (required)")
	f.StringVar(&policyDigest, "conversion-policy-digest", "", "that policy's digest (required)")
	f.StringVar(&w.ConverterVersion, "converter-version", "sim-1", "this machine's converter version")
	f.StringVar(&w.Backend, "backend", "", "the backend it must be for: ane or sim (required)")
	f.StringVar(&w.Platform.ChipFamily, "chip-family", "", "this machine's chip family (required)")
	f.StringVar(&w.Platform.MacOSBuild, "macos-build", "", "this machine's macOS build (required)")
	f.IntSliceVar(&w.Rungs, "rungs", nil, "rungs it must hold")
	for _, name := range []string{"model", "revision", "checkpoint-digest", "conversion-policy", "conversion-policy-digest", "backend", "chip-family", "macos-build"} {
		_ = cmd.MarkFlagRequired(name)
	}
	return cmd
}

func newListCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "list ROOT",
		Short: "List the artifacts under ROOT: published, pending imports and quarantined ones",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			entries, err := os.ReadDir(args[0])
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ARTIFACT\tSTATE\tMODEL\tREVISION\tBACKEND\tRUNGS\tMACOS")
			for _, e := range entries {
				if !e.IsDir() {
					continue
				}
				dir := filepath.Join(args[0], e.Name())
				if e.Name() == artifact.QuarantineDir {
					qs, _ := os.ReadDir(dir)
					for _, q := range qs {
						fmt.Fprintf(tw, "%s\tquarantined\t\t\t\t\t\n", filepath.Join(e.Name(), q.Name()))
					}
					continue
				}
				state, m := describe(dir)
				if m == nil {
					fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\n", e.Name(), state)
					continue
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%s\n", e.Name(), state, m.Model, m.Revision, m.Backend,
					strings.Trim(fmt.Sprint(m.Rungs), "[]"), m.Platform.MacOSBuild)
			}
			return tw.Flush()
		},
	}
}

// describe reads an artifact's manifest without verifying it (list is not a load).
func describe(dir string) (string, *artifact.Manifest) {
	data, err := os.ReadFile(filepath.Join(dir, artifact.ManifestFile))
	if errors.Is(err, os.ErrNotExist) {
		if _, perr := os.Stat(filepath.Join(dir, artifact.PendingManifestFile)); perr == nil {
			return "pending", nil
		}
		return "no-manifest", nil
	}
	if err != nil {
		return "unreadable", nil
	}
	m, err := artifact.Parse(data)
	if err != nil {
		return "invalid", nil
	}
	return "published", m
}
