#!/usr/bin/env bash
# The edgehop demo, in two parts. First the engine: an emulated edge network
# with three nodes and a client; services on different nodes reached from
# the client through the emulated links; live migrations under load;
# measured RTT and throughput; everything torn down. Then the reason edgehop
# exists: `edgehop demo`, where a user walks across three regions and the
# controller hands their connectivity between access points and migrates
# their redis after them, against two fixed placements (report in JSON and
# HTML with plots).
set -euo pipefail
cd "$(dirname "$0")/.."
EH=${EH:-$PWD/bin/edgehop}
TB=${EDGEHOP_TESTBED:-demo}
export EDGEHOP_TESTBED=$TB
step() { printf '\n== %s\n' "$*"; }

"$EH" testbed down >/dev/null 2>&1 || true
trap '"$EH" testbed down || true' EXIT

step "testbed up: 3 nodes (1 Gbit/s, 1 ms), 1 client (100 Mbit/s, 5 ms)"
"$EH" testbed up --nodes 3 --clients 1
step "probe on node0, redis on node1, memcached on node2"
"$EH" run --node node0 --name probe1 --image probe -- 7000
"$EH" run --node node1 --name redis1 --image services -- redis-server --bind 0.0.0.0 --protected-mode no --save "" --appendonly no
"$EH" run --node node2 --name mc1 --image services -- memcached -u nobody -l 0.0.0.0 -m 256
"$EH" ps
probe_ip=$("$EH" ps --json | python3 -c 'import json,sys; print([c["ip"] for c in json.load(sys.stdin) if c["name"]=="probe1"][0])')
redis_ip=$("$EH" ps --json | python3 -c 'import json,sys; print([c["ip"] for c in json.load(sys.stdin) if c["name"]=="redis1"][0])')
mc_ip=$("$EH" ps --json | python3 -c 'import json,sys; print([c["ip"] for c in json.load(sys.stdin) if c["name"]=="mc1"][0])')

step "client0 talks the probe protocol to $probe_ip:7000 for 3 s (every reply checked)"
"$EH" testbed exec client0 -- "$EH" probe client --duration 3s "$probe_ip:7000"
step "client0 -> redis at $redis_ip:6379"
"$EH" testbed exec client0 -- bash -c "exec 3<>/dev/tcp/$redis_ip/6379; printf 'SET demo edgehop\r\nGET demo\r\n' >&3; for i in 1 2 3; do read -t 3 -r l <&3; echo \"  redis: \${l%\$'\r'}\"; done"
step "client0 -> memcached at $mc_ip:11211"
"$EH" testbed exec client0 -- bash -c "exec 3<>/dev/tcp/$mc_ip/11211; printf 'version\r\n' >&3; read -t 3 -r l <&3; echo \"  memcached: \${l%\$'\r'}\""
step "live migration: probe1 node0 -> node1 (stop-and-copy) -> node0 (post-copy) while client0 keeps one connection busy"
"$EH" testbed exec client0 -- "$EH" probe client --duration 8s "$probe_ip:7000" > /tmp/edgehop-demo-probe.txt 2>&1 &
client=$!
sleep 1.5
"$EH" migrate probe1 --to node1 --strategy stop-and-copy
sleep 2
"$EH" migrate probe1 --to node0 --strategy post-copy
wait $client && echo "  the connection survived both migrations:" || echo "  continuity broken:"
sed 's/^/  /' /tmp/edgehop-demo-probe.txt
step "live migration of redis1 node1 -> node0 with its data (strategy chosen by the model)"
"$EH" migrate redis1 --to node0 --strategy auto
"$EH" testbed exec client0 -- bash -c "exec 3<>/dev/tcp/$redis_ip/6379; printf 'GET demo\r\n' >&3; for i in 1 2; do read -t 3 -r l <&3; echo \"  redis after migration: \${l%\$'\r'}\"; done"
"$EH" ps
step "measured RTT and throughput from client0 to every node (configured vs measured)"
"$EH" bench link --from client0
step "tear down"
"$EH" rm probe1 redis1 mc1
trap - EXIT
"$EH" testbed down
echo "demo complete: no namespace of testbed $TB is left ($(ls /run/netns 2>/dev/null | grep -c "^eh-$TB-" || true) found)"

step "services follow their user: a walk across 3 regions, the controller hands off and migrates (edgehop demo)"
"$EH" demo
