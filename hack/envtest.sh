#!/usr/bin/env bash
# Builds the control-plane binaries envtest and `make dev` run (etcd, kube-apiserver, kubectl)
# from the Go module proxy, because prebuilt envtest archives cannot be downloaded here.
#
# The binaries are cached outside the work tree, keyed by version, so a fresh clone on the same
# machine (CI clones afresh every run) reuses them; bin/k8s/<version> links to the cache.
# Nothing is rebuilt when the cached binaries already report the right version.
#
# usage: hack/envtest.sh <kubernetes version, e.g. 1.37.2> <link dir, e.g. bin/k8s>
set -euo pipefail

version=${1:?kubernetes version}
linkdir=${2:?link directory}
root=$(cd "$(dirname "$0")/.." && pwd)
tools="$root/hack/tools/envtest"
etcd_version=$(cd "$tools" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)

cache_root=${SYNAPSE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/synapse-fleet/tools}
cache="$cache_root/k8s/$version-etcd-${etcd_version#v}-$(go env GOOS)-$(go env GOARCH)"

# Each binary must report the wanted version. The output is captured before matching: under
# pipefail, a "grep -q" that stops reading early would fail the pipeline with SIGPIPE.
reports() { local out; out=$("$@" 2>/dev/null) && [[ $out == *"$want"* ]]; }
up_to_date() {
	[ -x "$cache/kube-apiserver" ] && [ -x "$cache/kubectl" ] && [ -x "$cache/etcd" ] || return 1
	want="Kubernetes v$version" reports "$cache/kube-apiserver" --version || return 1
	want="Client Version: v$version" reports "$cache/kubectl" version --client || return 1
	want="etcd Version: ${etcd_version#v}" reports "$cache/etcd" --version || return 1
}

if ! up_to_date; then
	echo "building kube-apiserver, kubectl and etcd (Kubernetes v$version, etcd $etcd_version); the first build takes about 11 minutes on 2 cores" >&2
	mkdir -p "$cache"
	tmp=$(mktemp -d "$cache_root/build.XXXXXX")
	trap 'rm -rf "$tmp"' EXIT
	vpkg=k8s.io/component-base/version
	kube_ldflags="-s -w -X $vpkg.gitVersion=v$version -X $vpkg.gitMajor=${version%%.*} -X $vpkg.gitMinor=$(echo "$version" | cut -d. -f2) -X $vpkg.gitTreeState=clean -X $vpkg.buildDate=1970-01-01T00:00:00Z"
	# One build at a time: on 2 cores a parallel build only thrashes.
	(
		cd "$tools"
		CGO_ENABLED=0 go build -trimpath -ldflags "$kube_ldflags" -o "$tmp/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver
		CGO_ENABLED=0 go build -trimpath -ldflags "$kube_ldflags" -o "$tmp/kubectl" k8s.io/kubernetes/cmd/kubectl
		CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3
	)
	# Publish each binary with a rename so a concurrent reader never sees a half-written file.
	for b in kube-apiserver kubectl etcd; do mv -f "$tmp/$b" "$cache/$b"; done
	up_to_date || { echo "built binaries do not report Kubernetes v$version / etcd $etcd_version" >&2; exit 1; }
fi

mkdir -p "$linkdir"
ln -sfn "$cache" "$linkdir/$version"
echo "$linkdir/$version"
