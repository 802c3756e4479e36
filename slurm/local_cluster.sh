#!/usr/bin/env bash
# A real SLURM cluster on one machine for tests and CI: munge + MariaDB + slurmdbd (accounting, so that
# submitit reads job states) + slurmctld + slurmd, all state under one directory.
#
#   bash slurm/local_cluster.sh start    # install missing Debian packages, write configs, start, wait
#   bash slurm/local_cluster.sh start --nodes 2   # two compute nodes, each in a network namespace of its own
#   bash slurm/local_cluster.sh status   # which daemons run, sinfo
#   bash slurm/local_cluster.sh stop     # cancel jobs, stop only the daemons this script started
#
# State directory: $ACER_SLURM_DIR (default /tmp/acer-slurm). Delete it (after `stop`) to start afresh.
# The client commands (sinfo, sbatch, sacct, submitit) find the cluster through the symlink
# /etc/slurm/slurm.conf -> $ACER_SLURM_DIR/etc/slurm.conf, made by `start` when that path is free
# and removed by `stop`; otherwise `export SLURM_CONF=$ACER_SLURM_DIR/etc/slurm.conf`.
# Needs root (Debian 12 packages, daemons run as root and munge). Tested with Slurm 22.05, MariaDB 10.11.
#
# One node (the default): slurmd is this machine, on loopback. With --nodes N > 1 each node acer-node<i> is a
# slurmd in a network namespace and a UTS namespace of its own (its own hostname and address 10.77.0.<10+i>,
# a veth pair on the bridge acer-br0 whose host side, 10.77.0.1, is where slurmctld is reached): jobs on two
# nodes talk over a real IP network, but the machine's disk, cores and memory are shared (no real latency or
# bandwidth limit). `stop` removes the namespaces and the bridge it made.
set -euo pipefail

D=${ACER_SLURM_DIR:-/tmp/acer-slurm}
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
CLUSTER=acer
PARTITION=local
DB_PORT=3307
DBD_PORT=6819
LINK=/etc/slurm/slurm.conf
export SLURM_CONF=$D/etc/slurm.conf
MUNGE_SOCKET=$D/munge/munge.socket.2
DB_SOCKET=$D/mysql/mysqld.sock
DB_PASS=acer-slurm-local
BRIDGE=acer-br0
SUBNET=10.77.0
NODES_FILE=$D/etc/nodes  # the node count of the running cluster, for stop and status
HOSTS_MARK="# acer-local-cluster"  # the /etc/hosts lines naming the nodes (as a cluster's DNS would) end so

die() { echo "local_cluster.sh: $*" >&2; exit 1; }
log() { echo "[local_cluster] $*"; }

# pid_of NAME [COMM]: the PID recorded in run/NAME.pid if that process is alive and is COMM (default NAME).
pid_of() {
    local f=$D/run/$1.pid pid
    [[ -s $f ]] || return 0
    pid=$(tr -dc '0-9' <"$f")
    [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm") == "${2:-$1}" ]] && echo "$pid"
    return 0
}

node_count() { if [[ -s $NODES_FILE ]]; then cat "$NODES_FILE"; else echo 1; fi; }

# net_up N: the bridge and, per node i, its namespace acer-node<i> with address $SUBNET.<10+i>.
net_up() {
    local i ns
    ip link show "$BRIDGE" >/dev/null 2>&1 || {
        ip link add "$BRIDGE" type bridge
        ip addr add "$SUBNET.1/24" dev "$BRIDGE"
    }
    ip link set "$BRIDGE" up
    for ((i = 1; i <= $1; i++)); do
        ns=acer-node$i
        ip netns list | grep -qw "$ns" && continue
        ip netns add "$ns"
        ip link add "acer-veth$i" type veth peer name eth0 netns "$ns"
        ip link set "acer-veth$i" master "$BRIDGE" up
        ip -n "$ns" addr add "$SUBNET.$((10 + i))/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        ip -n "$ns" route add default via "$SUBNET.1"
    done
    # the node names resolve (jobs find their peers by SLURM_JOB_NODELIST, e.g. torch.distributed's master)
    for ((i = 1; i <= $1; i++)); do
        grep -q "^$SUBNET.$((10 + i)) acer-node$i $HOSTS_MARK\$" /etc/hosts ||
            echo "$SUBNET.$((10 + i)) acer-node$i $HOSTS_MARK" >>/etc/hosts
    done
}

# net_down: remove every namespace acer-node<i> (their veth pairs go with them) and the bridge.
net_down() {
    local ns
    for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^acer-node[0-9]+$/ {print $1}'); do
        ip netns del "$ns" && log "removed network namespace $ns"
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link del "$BRIDGE" && log "removed bridge $BRIDGE"; fi
    if grep -q "$HOSTS_MARK\$" /etc/hosts; then
        # rewritten in place: /etc/hosts may be a mount point, which a rename (sed -i) cannot replace
        local kept
        kept=$(grep -v "$HOSTS_MARK\$" /etc/hosts || true)
        printf '%s\n' "$kept" >/etc/hosts
        log "removed the node names from /etc/hosts"
    fi
}

# wait_for SECONDS WHAT CMD...: retry CMD every 0.5 s until it succeeds, or fail naming the log dir.
wait_for() {
    local secs=$1 what=$2 end=$((SECONDS + $1))
    shift 2
    while ((SECONDS < end)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    die "$what not ready after ${secs}s; see logs in $D/log"
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    ((${#missing[@]} == 0)) && return 0
    [[ $(id -u) == 0 ]] || die "missing packages ${missing[*]}; run as root to install them"
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=300 update -qq
    apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >"$D/log/apt.log" 2>&1 ||
        die "apt-get install failed; see $D/log/apt.log"
}

write_configs() {
    local n=$1 node mem host nodes="" ctld_addr=127.0.0.1 d_files="" i
    # First line of `slurmd -C` describes this machine; leave ~1 GiB of memory to the daemons.
    node=$(slurmd -C | head -n1)
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    [[ -n $mem ]] || die "cannot read RealMemory from 'slurmd -C': $node"
    node="${node/RealMemory=$mem/RealMemory=$((mem > 2048 ? mem - 1024 : mem))}"
    if ((n == 1)); then
        nodes="$node NodeAddr=127.0.0.1 State=UNKNOWN"
        d_files="SlurmdSpoolDir=$D/spool/d
SlurmdPidFile=$D/run/slurmd.pid
SlurmdLogFile=$D/log/slurmd.log"
    else
        # every node is described as this machine (they share its cores and memory)
        host=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<<"$node")
        for ((i = 1; i <= n; i++)); do
            nodes+="${node/NodeName=$host/NodeName=acer-node$i} NodeAddr=$SUBNET.$((10 + i)) State=UNKNOWN"$'\n'
        done
        ctld_addr=$SUBNET.1
        d_files="SlurmdSpoolDir=$D/spool/d-%n
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmdLogFile=$D/log/slurmd-%n.log"
    fi
    cat >"$D/etc/slurm.conf.new" <<EOF
# Written by slurm/local_cluster.sh: $n node(s).
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)($ctld_addr)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$D/spool/ctld
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmctldLogFile=$D/log/slurmctld.log
$d_files
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
ReturnToService=2
# A killed or requeued job gets SIGKILL 2 s after SIGTERM (default 30 s; submitit ignores SIGTERM).
KillWait=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/none
$nodes
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    if cmp -s "$D/etc/slurm.conf.new" "$SLURM_CONF"; then
        rm "$D/etc/slurm.conf.new"
    else
        mv "$D/etc/slurm.conf.new" "$SLURM_CONF"
        # a running cluster picks up the new settings now
        if [[ -n $(pid_of slurmctld) ]]; then scontrol reconfigure; fi
    fi
    cat >"$D/etc/slurmdbd.conf" <<EOF
# Written by slurm/local_cluster.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chmod 600 "$D/etc/slurmdbd.conf"
}

start_munge() {
    [[ -n $(pid_of munged) ]] && return 0
    if [[ ! -s $D/munge/munge.key ]]; then
        dd if=/dev/urandom of="$D/munge/munge.key" bs=1024 count=1 status=none
    fi
    chown -R munge:munge "$D/munge"
    chmod 711 "$D/munge"
    chmod 400 "$D/munge/munge.key"
    # munged runs as the munge user, so its pid and log files live in its own directory.
    runuser -u munge -- munged --key-file="$D/munge/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$D/munge/munged.pid" --log-file="$D/munge/munged.log" --seed-file="$D/munge/munged.seed" ||
        die "munged failed to start; see $D/munge/munged.log"
    ln -sf "$D/munge/munged.pid" "$D/run/munged.pid"
    wait_for 10 munged munge --socket="$MUNGE_SOCKET" -n
}

start_mariadb() {
    [[ -n $(pid_of mariadbd) ]] && return 0
    local fresh=0
    if [[ ! -d $D/mysql/data/mysql ]]; then
        mariadb-install-db --no-defaults --datadir="$D/mysql/data" --user=root --skip-test-db \
            >"$D/log/mariadb-install.log" 2>&1 || die "mariadb-install-db failed; see $D/log/mariadb-install.log"
        fresh=1
    fi
    setsid mariadbd --no-defaults --datadir="$D/mysql/data" --user=root --socket="$DB_SOCKET" \
        --port=$DB_PORT --bind-address=127.0.0.1 --skip-name-resolve --pid-file="$D/run/mariadbd.pid" \
        --log-error="$D/log/mariadb.log" --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
        </dev/null >/dev/null 2>&1 &
    wait_for 60 mariadb mariadb-admin --no-defaults --socket="$DB_SOCKET" -u root ping
    wait_for 10 "mariadb pid file" test -n "$(pid_of mariadbd)"
    if ((fresh)); then
        mariadb --no-defaults --socket="$DB_SOCKET" -u root -e "
            CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    fi
}

start_slurmdbd() {
    [[ -z $(pid_of slurmdbd) ]] && slurmdbd  # reads slurmdbd.conf beside $SLURM_CONF
    wait_for 60 slurmdbd timeout 10 sacctmgr -n list cluster
    if [[ -z $(sacctmgr -n -P list cluster format=cluster "cluster=$CLUSTER") ]]; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null
    fi
}

# nodes_idle N: sinfo lists N nodes, all idle
nodes_idle() { [[ $(timeout 10 sinfo -h -N -o '%t' | grep -cx 'idle') == "$1" ]]; }

# cancel_stale_jobs: a new slurmctld recovers the jobs of a cluster that was killed rather than stopped (its
# saved state says they still run); their processes died with it, but they would hold the nodes for good.
cancel_stale_jobs() {
    local jobs
    mapfile -t jobs < <(timeout 10 squeue -h -o %i)
    ((${#jobs[@]})) || return 0
    log "cancelling jobs left by a cluster that was killed, not stopped: ${jobs[*]}"
    scancel "${jobs[@]}"
}

# start_slurmd N: one slurmd on this machine, or one per node namespace (its hostname set in a UTS namespace)
start_slurmd() {
    local i
    if (($1 == 1)); then
        [[ -z $(pid_of slurmd) ]] && slurmd -f "$SLURM_CONF"
        return 0
    fi
    for ((i = 1; i <= $1; i++)); do
        mkdir -p "$D/spool/d-acer-node$i"
        [[ -n $(pid_of "slurmd-acer-node$i" slurmd) ]] && continue
        # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup mounts slurmd initialises from
        nsenter --net="/run/netns/acer-node$i" unshare --uts sh -c "hostname acer-node$i && exec slurmd -f '$SLURM_CONF'"
    done
}

start() {
    local n=1
    while (($#)); do
        case $1 in
        --nodes) n=${2:-}; shift 2 || die "--nodes needs a count" ;;
        *) die "start: unknown option $1 (only --nodes N)" ;;
        esac
    done
    [[ $n =~ ^[1-9][0-9]?$ ]] || die "--nodes must be a count from 1 to 99, got '$n'"
    mkdir -p "$D"/{etc,run,log,munge,mysql,spool/ctld,spool/d}
    if [[ -n $(pid_of slurmctld) && $(node_count) != "$n" ]]; then
        die "a $(node_count)-node cluster is running; stop it first"
    fi
    install_packages
    if ((n > 1)); then net_up "$n"; fi
    write_configs "$n"
    echo "$n" >"$NODES_FILE"
    start_munge
    start_mariadb
    start_slurmdbd
    local fresh=0
    if [[ -z $(pid_of slurmctld) ]]; then fresh=1; slurmctld -f "$SLURM_CONF"; fi
    wait_for 30 slurmctld timeout 10 scontrol ping
    if ((fresh)); then cancel_stale_jobs; fi
    start_slurmd "$n"
    wait_for 60 "$n node(s) (sinfo idle)" nodes_idle "$n"
    wait_for 30 sacct timeout 10 sacct -n -X
    if [[ ! -e $LINK || $(readlink "$LINK") == "$SLURM_CONF" ]]; then
        mkdir -p "$(dirname "$LINK")"
        ln -sfn "$SLURM_CONF" "$LINK"
    else
        log "$LINK belongs to another cluster; use: export SLURM_CONF=$SLURM_CONF"
    fi
    log "cluster '$CLUSTER' up: $n node(s), partition '$PARTITION', state in $D"
    sinfo
}

# stop_daemon NAME [COMM]: TERM the PID recorded in run/NAME.pid, KILL it after 20 s.
stop_daemon() {
    local pid i
    pid=$(pid_of "$1" "${2:-$1}")
    [[ -z $pid ]] && { rm -f "$D/run/$1.pid"; return 0; }
    kill -TERM "$pid"
    for ((i = 0; i < 100; i++)); do
        [[ -d /proc/$pid ]] || break
        sleep 0.2
    done
    [[ -d /proc/$pid ]] && kill -KILL "$pid"
    rm -f "$D/run/$1.pid"
    log "stopped $1 ($pid)"
}

stop() {
    local jobs i
    if [[ -n $(pid_of slurmctld) ]]; then
        mapfile -t jobs < <(squeue -h -o %i 2>/dev/null || true)
        if ((${#jobs[@]})); then
            log "cancelling jobs: ${jobs[*]}"
            scancel "${jobs[@]}" || true
            for ((i = 0; i < 30; i++)); do
                [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.5
            done
        fi
    fi
    local f
    for f in "$D"/run/slurmd-acer-node*.pid; do [[ -e $f ]] && stop_daemon "$(basename "$f" .pid)" slurmd; done
    for d in slurmd slurmctld slurmdbd mariadbd munged; do stop_daemon "$d"; done
    net_down
    rm -f "$NODES_FILE"
    if [[ -L $LINK && $(readlink "$LINK") == "$SLURM_CONF" ]]; then rm -f "$LINK"; fi
}

status() {
    local d pid rc=0
    local daemons=(munged mariadbd slurmdbd slurmctld) i
    if (($(node_count) == 1)); then daemons+=(slurmd); else
        for ((i = 1; i <= $(node_count); i++)); do daemons+=("slurmd-acer-node$i"); done
    fi
    for d in "${daemons[@]}"; do
        pid=$(pid_of "$d" "${d%%-*}")
        if [[ -n $pid ]]; then echo "$d: running ($pid)"; else echo "$d: stopped"; rc=1; fi
    done
    if ((rc == 0)); then sinfo; fi
    return $rc
}

case ${1:-} in
start) shift; start "$@" ;;
stop) stop ;;
status) status ;;
*) die "usage: bash slurm/local_cluster.sh start [--nodes N]|stop|status (state dir: \$ACER_SLURM_DIR, default /tmp/acer-slurm)" ;;
esac
