#!/usr/bin/env bash
# A 3-node siftmq cluster on this machine (docs/cluster.md): MQTT on 1883, 1884, 1885; the
# nodes' links and Kademlia overlay on 7946, 7947, 7948; data under siftmq-data/cluster/.
# Ctrl-C stops all three. Run through `make cluster`.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-127.0.0.1}
BASE=siftmq-data/cluster
mkdir -p "$BASE"
SECRET="$BASE/secret"
if [ ! -s "$SECRET" ]; then
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$SECRET")
fi
trap 'kill 0' INT TERM EXIT
for i in 0 1 2; do
  join=()
  if [ "$i" != 0 ]; then join=(--join "$HOST:7946"); fi
  .venv/bin/siftmq serve --host "$HOST" --port $((1883 + i)) --data-dir "$BASE/node$i" --no-bridge \
    --cluster-listen "$HOST:$((7946 + i))" --cluster-secret-file "$SECRET" "${join[@]}" &
  sleep 1
done
echo "cluster up: mqtt://$HOST:1883, :1884, :1885 (Ctrl-C stops it)"
wait
