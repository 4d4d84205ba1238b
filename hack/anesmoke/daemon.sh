#!/bin/sh
# make ane-smoke-daemon: run the diagnostic ladder as a LaunchDaemon with UserName (the domain a
# headless Mac's agent runs in, no login needed), wait for its report, print it. Needs sudo.
#   hack/anesmoke/daemon.sh SIGNED-SMOKE-BINARY REPORT
set -eu
binary=${1:?usage: daemon.sh SIGNED-SMOKE-BINARY REPORT}
report=${2:?usage: daemon.sh SIGNED-SMOKE-BINARY REPORT}
user=${SUDO_USER:-$(id -un)}
label=dev.synapse-fleet.ane-smoke
plist=/Library/LaunchDaemons/$label.plist
# The job runs from the agent's state folder, which the user owns: a LaunchDaemon may not read
# a checkout under ~/Documents or ~/Desktop.
work=/usr/local/var/synapse/ane-smoke
sudo install -d -o "$user" "$work"
install -m 755 "$binary" "$work/synapse-ane-smoke"
rm -f "$work/report.json" "$work/smoke.log"
sed -e "s|@USER@|$user|" -e "s|@BINARY@|$work/synapse-ane-smoke|" -e "s|@REPORT@|$work/report.json|" -e "s|@LOG@|$work/smoke.log|" \
	"$(dirname "$0")/$label.plist" | sudo tee "$plist" >/dev/null
sudo chown root:wheel "$plist"
sudo chmod 644 "$plist"
sudo launchctl bootout "system/$label" 2>/dev/null || true
sudo launchctl bootstrap system "$plist"
# The ladder bounds every framework call; give the whole run 20 minutes.
i=0
while [ ! -f "$work/report.json" ] && [ "$i" -lt 1200 ]; do
	sleep 1
	i=$((i + 1))
done
sudo launchctl bootout "system/$label" 2>/dev/null || true
sudo rm -f "$plist"
if [ ! -f "$work/report.json" ]; then
	echo "the daemon wrote no report in 20 minutes; its output is in $work/smoke.log" >&2
	exit 1
fi
cp "$work/report.json" "$report"
echo "report: $report (the daemon's output: $work/smoke.log)"
exec "$binary" --print "$report"
