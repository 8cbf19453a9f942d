#!/bin/sh
# Starts rsyslog as a peer of `cargo xtask load ... --peer rsyslog@tcp=xtask/peers/rsyslog/run.sh`.
# The harness sets LOAD_IN_PORT (rsyslog listens), LOAD_OUT_PORT (rsyslog
# connects) and LOAD_WORK_DIR; `cargo xtask load files` sets LOAD_IN_FILE
# and LOAD_OUT_FILE instead (with peer-file.conf). RSYSLOGD picks the binary (default: the one
# on PATH); RSYSLOG_MODULES a module folder, for an unpacked copy
# (`apt-get download rsyslog && dpkg -x rsyslog_*.deb DIR`); RSYSLOG_CONF
# another configuration (default: rsyslog.conf here, the reference
# pipeline's work; peer.conf does the like-for-like peer pipelines' work).
set -e
here=$(cd "$(dirname "$0")" && pwd)
work=${LOAD_WORK_DIR:-$(mktemp -d)}/rsyslog-$$
mkdir -p "$work"
sed -e "s|@IN_PORT@|${LOAD_IN_PORT:-}|" -e "s|@OUT_PORT@|${LOAD_OUT_PORT:-}|" \
    -e "s|@IN_FILE@|${LOAD_IN_FILE:-}|" -e "s|@OUT_FILE@|${LOAD_OUT_FILE:-}|" \
    -e "s|@WORK@|$work|" -e "s|@HERE@|$here|" \
    "${RSYSLOG_CONF:-$here/rsyslog.conf}" > "$work/rsyslog.conf"
if [ -n "${RSYSLOG_MODULES:-}" ]; then
  exec "${RSYSLOGD:-rsyslogd}" -n -M "$RSYSLOG_MODULES" -f "$work/rsyslog.conf" -i "$work/rsyslogd.pid"
fi
exec "${RSYSLOGD:-rsyslogd}" -n -f "$work/rsyslog.conf" -i "$work/rsyslogd.pid"
