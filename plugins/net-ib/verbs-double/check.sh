#!/usr/bin/env bash
# Builds the verbs double and checks it against programs written for real verbs:
#   ibv_devinfo (ibverbs-utils)       the device, port and GID table as a tool sees them
#   ibv_rc_pingpong (ibverbs-utils)   SEND/RECV between two processes, polled and with events
#   ib_write_bw, ib_read_bw (perftest) RDMA write and read between two processes
#   the same pingpong and ib_write_bw across two network namespaces joined by a veth pair, each
#                                     side's double on its namespace's address (IBV_DOUBLE_IP):
#                                     the links follow the GID's IPv4 (needs root and iproute2,
#                                     as the two-node tests do; RUSTCCL_SKIP_NETNS=1 skips it)
#   double_test (here)                write-with-imm, read, send-with-imm inline, unsignaled WRs,
#                                     bad rkey / out of bounds -> REM_ACCESS_ERR, peer killed ->
#                                     WR_FLUSH_ERR, RNR, the FAIL_AFTER, DELAY_US, REORDER and RNR
#                                     knobs, dma-buf registration of a memfd, async events
#                                     (ASYNC_EVENT/ASYNC_TRIGGER), two dual-port devices
#                                     (devices mode)
# and that no program warns "no version information available" (the symbol versions).
# Exit 0 if all pass, 1 otherwise. Every program runs under `timeout`; the whole takes seconds.
# Needs: cc, make, libibverbs-dev, ibverbs-utils, perftest (.ci/ib-packages.txt).
set -u
here=$(cd "$(dirname "$0")" && pwd)
BUILD=${BUILD:-$here/build}
T=${CHECK_TIMEOUT:-20}
log=$(mktemp -d)
ns=()
cleanup() {
    for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null; done
    rm -rf "$log"
}
trap cleanup EXIT
fails=0

pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; fails=$((fails + 1)); }

for tool in ibv_devinfo ibv_rc_pingpong ib_write_bw ib_read_bw; do
    command -v "$tool" >/dev/null || { echo "check.sh: $tool missing: apt-get install ibverbs-utils perftest"; exit 1; }
done
make -s -C "$here" BUILD="$BUILD" || { echo "check.sh: building the double failed"; exit 1; }
export LD_LIBRARY_PATH="$BUILD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Each run gets its own range of listener ports for the double (it tries 256 from the base).
export IBV_DOUBLE_PORT=$((20000 + (RANDOM % 80) * 256))

# Waits until a TCP port is listening (read from /proc: a probe connection would be taken by
# the tools' one-shot accept).
# wait_listen PORT [NETNS]
wait_listen() {
    local hex; hex=$(printf ':%04X' "$1")
    local in=(); [ -n "${2:-}" ] && in=(ip netns exec "$2")
    for _ in $(seq 100); do
        "${in[@]}" cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q "$hex [0-9A-F]*:0000 0A" && return 0
        sleep 0.1
    done
    return 1
}

# A TCP port for a tool's own handshake: below the kernel's ephemeral range (so no outgoing
# connection holds it) and not in use now (listening, connected or in TIME_WAIT).
free_port() {
    local p hex
    for _ in $(seq 50); do
        p=$((12000 + RANDOM % 8000)); hex=$(printf ':%04X ' "$p")
        cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | grep -q "$hex" || { echo "$p"; return; }
    done
    echo $((12000 + RANDOM % 8000))
}

# pair NAME SERVER-CMD... -- CLIENT-CMD...: the two sides of a tool, both must exit 0; `@PORT@`
# in either command is the tool's handshake port, a free one each attempt (a server that
# cannot listen on it is tried again on another, up to 3 times).
# SERVER_NS: the namespace the server runs in (for wait_listen), if any.
pair() {
    local name=$1; shift
    local server=() client=()
    while [ "$1" != "--" ]; do server+=("$1"); shift; done
    shift; client=("$@")
    local attempt port spid
    for attempt in 1 2 3; do
        port=$(free_port)
        timeout "$T" "${server[@]//@PORT@/$port}" >"$log/$name.server" 2>&1 &
        spid=$!
        wait_listen "$port" "${SERVER_NS:-}" && break
        kill "$spid" 2>/dev/null; wait "$spid"
        if [ $attempt = 3 ]; then
            fail "$name: the server side never listened (3 ports tried, the last $port)"
            cat "$log/$name.server"; return
        fi
    done
    timeout "$T" "${client[@]//@PORT@/$port}" >"$log/$name.client" 2>&1
    local crc=$?
    wait "$spid"
    local src=$?
    if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
        pass "$name"
    else
        fail "$name (client rc $crc, server rc $src)"
        sed 's/^/  client: /' "$log/$name.client"; sed 's/^/  server: /' "$log/$name.server"
    fi
}


if timeout "$T" ibv_devinfo -v >"$log/devinfo" 2>&1 &&
   grep -q "hca_id:.*dbl_0" "$log/devinfo" && grep -q "state:.*PORT_ACTIVE" "$log/devinfo" &&
   grep -q "link_layer:.*Ethernet" "$log/devinfo" &&
   grep -q "GID\[  3\]:.*::ffff:127.0.0.1, RoCE v2" "$log/devinfo"; then
    pass "ibv_devinfo: dbl_0, port ACTIVE, Ethernet, GID 3 = ::ffff:127.0.0.1 RoCE v2"
else
    fail "ibv_devinfo"; cat "$log/devinfo"
fi

pair rc_pingpong ibv_rc_pingpong -g 3 -n 500 -p @PORT@ -- ibv_rc_pingpong -g 3 -n 500 -p @PORT@ 127.0.0.1
pair rc_pingpong_events ibv_rc_pingpong -e -g 3 -n 500 -p @PORT@ -- \
    ibv_rc_pingpong -e -g 3 -n 500 -p @PORT@ 127.0.0.1
pair ib_write_bw ib_write_bw -d dbl_0 -x 3 -n 1000 -p @PORT@ -- \
    ib_write_bw -d dbl_0 -x 3 -n 1000 -p @PORT@ 127.0.0.1
pair ib_read_bw ib_read_bw -d dbl_0 -x 3 -n 1000 -p @PORT@ -- \
    ib_read_bw -d dbl_0 -x 3 -n 1000 -p @PORT@ 127.0.0.1

# Two "hosts": namespaces joined by a veth pair, as tests/src/lib.rs's Nodes makes them.
if [ "${RUSTCCL_SKIP_NETNS:-0}" = 1 ]; then
    echo "SKIP namespaces: RUSTCCL_SKIP_NETNS=1"
else
    tag=$(( $$ % 100000 )); sub=$(( 100 + tag % 100 ))
    a="vd${tag}a"; b="vd${tag}b"; ipa="10.77.$sub.1"; ipb="10.77.$sub.2"
    if ip netns add "$a" 2>"$log/netns" && ns+=("$a") && ip netns add "$b" 2>>"$log/netns" &&
       ns+=("$b") && ip link add "$a" type veth peer name "$b" 2>>"$log/netns" &&
       ip link set "$a" netns "$a" && ip link set "$b" netns "$b" &&
       ip -n "$a" addr add "$ipa/24" dev "$a" && ip -n "$b" addr add "$ipb/24" dev "$b" &&
       ip -n "$a" link set "$a" up && ip -n "$b" link set "$b" up &&
       ip -n "$a" link set lo up && ip -n "$b" link set lo up; then
        for _ in $(seq 200); do # the veth carries traffic once both ends have carrier
            ip -n "$a" link show dev "$a" | grep -q "state UP" &&
                ip -n "$b" link show dev "$b" | grep -q "state UP" && break
            sleep 0.02
        done
        SERVER_NS=$a pair rc_pingpong_netns \
            ip netns exec "$a" env IBV_DOUBLE_IP=$ipa ibv_rc_pingpong -g 3 -n 200 -p @PORT@ -- \
            ip netns exec "$b" env IBV_DOUBLE_IP=$ipb ibv_rc_pingpong -g 3 -n 200 -p @PORT@ $ipa
        SERVER_NS=$a pair ib_write_bw_netns \
            ip netns exec "$a" env IBV_DOUBLE_IP=$ipa ib_write_bw -d dbl_0 -x 3 -n 500 -p @PORT@ -- \
            ip netns exec "$b" env IBV_DOUBLE_IP=$ipb ib_write_bw -d dbl_0 -x 3 -n 500 -p @PORT@ $ipa
        if grep -q "GID ::ffff:$ipa" "$log/rc_pingpong_netns.client"; then
            pass "namespaces: the client connected to the GID ::ffff:$ipa"
        else
            fail "namespaces: the client did not see the server's GID ::ffff:$ipa"
        fi
    else
        fail "namespaces: cannot make them (run as root with iproute2, or RUSTCCL_SKIP_NETNS=1)"
        cat "$log/netns"
    fi
fi

for mode in basic fail-after delay rnr reorder dmabuf async devices; do
    if timeout "$T" "$BUILD/double_test" "$mode" >"$log/double_test.$mode" 2>&1; then
        pass "double_test $mode ($(grep -c '^PASS' "$log/double_test.$mode") checks)"
    else
        fail "double_test $mode"; cat "$log/double_test.$mode"
    fi
done

if grep -l "no version information" "$log"/* >/dev/null 2>&1; then
    fail "symbol versions: a program warned 'no version information available'"
    grep -h "no version information" "$log"/* | sort -u
else
    pass "symbol versions: no 'no version information' warning"
fi

if [ $fails -eq 0 ]; then echo "verbs double: all checks passed"; exit 0; fi
echo "verbs double: $fails check(s) failed"
exit 1
