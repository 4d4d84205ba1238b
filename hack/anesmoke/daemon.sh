#!/bin/sh
# make ane-smoke-daemon: run the diagnostic ladder as a LaunchDaemon with UserName (the domain a
# headless Mac's agent runs in, no login needed), wait for its report, print it. Needs sudo.
#   hack/anesmoke/daemon.sh SIGNED-SMOKE-BINARY REPORT
set -eu
binary=${1:?usage: daemon.sh SIGNED-SMOKE-BINARY REPORT}
report=${2:?usage: daemon.sh SIGNED-SMOKE-BINARY REPORT}
user=${SUDO_USER:-$(id -un)}
label=dev.synapse-fleet.ane-smoke
plist=${ANE_SMOKE_DAEMONS:-/Library/LaunchDaemons}/$label.plist
# The job runs from the agent's state folder, which the user owns: a LaunchDaemon may not read
# a checkout under ~/Documents or ~/Desktop. (Tests point both folders elsewhere.)
work=${ANE_SMOKE_WORK:-/usr/local/var/synapse/ane-smoke}
sudo install -d -o "$user" "$work"
install -m 755 "$binary" "$work/synapse-ane-smoke"
rm -f "$work/report.json" "$work/smoke.log"
sed -e "s|@USER@|$user|" -e "s|@BINARY@|$work/synapse-ane-smoke|" -e "s|@REPORT@|$work/report.json|" -e "s|@LOG@|$work/smoke.log|" \
	"$(dirname "$0")/$label.plist" | sudo tee "$plist" >/dev/null
sudo chown root:wheel "$plist"
sudo chmod 644 "$plist"
sudo launchctl bootout "system/$label" 2>/dev/null || true
sudo launchctl bootstrap system "$plist"
# The ladder bounds every framework call and its supervising process writes the report
# however the ladder ends, so wait for the job to exit (launchctl print says "state = running"
# while it runs), at most an hour, not for the report.
running() { sudo launchctl print "system/$label" 2>/dev/null | grep -q 'state = running'; }
i=0
while [ "$i" -lt 5 ] && ! running && [ ! -f "$work/report.json" ]; do
	sleep 1 # launchd starts the job right after bootstrap
	i=$((i + 1))
done
i=0
while running && [ "$i" -lt 3600 ]; do
	sleep 1
	i=$((i + 1))
done
status=$(sudo launchctl print "system/$label" 2>/dev/null | sed -n 's/^[[:space:]]*last exit code = //p' | head -n 1)
sudo launchctl bootout "system/$label" 2>/dev/null || true
sudo rm -f "$plist"
if [ ! -f "$work/report.json" ]; then
	echo "the daemon job ended (last exit code: ${status:-unknown}) without a report; its output is in $work/smoke.log" >&2
	exit 1
fi
cp "$work/report.json" "$report"
echo "report: $report (the daemon's output: $work/smoke.log)"
exec "$binary" --print "$report"
