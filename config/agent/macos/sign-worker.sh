#!/bin/sh
# Sign the Neural Engine worker with a stable identifier. aned partitions its compiled-program
# cache by the process's code-signing identifier; the Go linker signs every binary ad hoc as
# "a.out", so unsigned workers would share one partition with every other Go program and lose
# their cache on every rebuild. Keep the identifier the same across upgrades, and use the same
# value for the agent's --signing-identifier. Run it on the Mac, after every install.
set -eu
worker=${1:?usage: sign-worker.sh PATH-TO-synapse-ane-worker [IDENTIFIER]}
identifier=${2:-synapse-ane-worker}
codesign -f -s - -i "$identifier" "$worker"
# Show what aned will see; the agent reports the worker's SHA-256 in its MacNode status, and a
# CertifiedIdentity must name that digest (re-signing changes it).
codesign -dv "$worker" 2>&1 | grep -E '^(Identifier|Signature)='
shasum -a 256 "$worker"
