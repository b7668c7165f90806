#!/usr/bin/env bash
# Run a command beside a throw-away etcd (Debian's etcd-server) on loopback ports picked here,
# in a temporary data folder; the command finds it in RDMALANE_ETCD. etcd is stopped and its
# folder removed afterwards; the command's exit status is this script's.
#   scripts/with-etcd.sh COMMAND [ARG ...]
set -euo pipefail
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
dir=$(mktemp -d)
client=$(port)
peer=$(port)
etcd --name local --data-dir "$dir/data" \
  --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
  --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "local=http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 200); do
  curl -fsS "http://127.0.0.1:$client/health" 2>/dev/null | grep -q '"health":"true"' && break
  kill -0 $pid 2>/dev/null || { cat "$dir/etcd.log" >&2; exit 1; }
  sleep 0.1
done
export RDMALANE_ETCD="127.0.0.1:$client"
"$@"
