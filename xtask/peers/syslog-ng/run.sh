#!/bin/sh
# Starts syslog-ng as a peer of `cargo xtask load ... --peer syslog-ng=xtask/peers/syslog-ng/run.sh`
# (stdin in, stdout out). SYSLOG_NG_ROOT names an unpacked package tree, since
# the syslog-ng and rsyslog packages conflict (docs/load-testing.md):
#   apt-get download syslog-ng-core libivykis0 libnet1 libpcre3 libwrap0
#   for d in *.deb; do dpkg -x "$d" root; done; export SYSLOG_NG_ROOT=$PWD/root
# Without it, the syslog-ng on PATH is used.
set -e
here=$(cd "$(dirname "$0")" && pwd)
work=${LOAD_WORK_DIR:-$(mktemp -d)}/syslog-ng-$$
mkdir -p "$work"
if [ -n "${SYSLOG_NG_ROOT:-}" ]; then
  r=$SYSLOG_NG_ROOT
  export LD_LIBRARY_PATH="$r/usr/lib/syslog-ng:$r/usr/lib/x86_64-linux-gnu:$r/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  exec "$r/usr/sbin/syslog-ng" -F --no-caps -f "$here/syslog-ng.conf" \
    --module-path "$r/usr/lib/syslog-ng/3.38" -R "$work/persist" -p "$work/pid" -c "$work/ctl"
fi
exec syslog-ng -F --no-caps -f "$here/syslog-ng.conf" -R "$work/persist" -p "$work/pid" -c "$work/ctl"
