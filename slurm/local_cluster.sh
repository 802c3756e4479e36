#!/usr/bin/env bash
# A real one-node SLURM cluster for tests and CI: munge + MariaDB + slurmdbd (accounting, so that
# submitit reads job states) + slurmctld + slurmd, all on loopback, all state under one directory.
#
#   bash slurm/local_cluster.sh start    # install missing Debian packages, write configs, start, wait
#   bash slurm/local_cluster.sh status   # which daemons run, sinfo
#   bash slurm/local_cluster.sh stop     # cancel jobs, stop only the daemons this script started
#
# State directory: $ACER_SLURM_DIR (default /tmp/acer-slurm). Delete it (after `stop`) to start afresh.
# The client commands (sinfo, sbatch, sacct, submitit) find the cluster through the symlink
# /etc/slurm/slurm.conf -> $ACER_SLURM_DIR/etc/slurm.conf, made by `start` when that path is free
# and removed by `stop`; otherwise `export SLURM_CONF=$ACER_SLURM_DIR/etc/slurm.conf`.
# Needs root (Debian 12 packages, daemons run as root and munge). Tested with Slurm 22.05, MariaDB 10.11.
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

die() { echo "local_cluster.sh: $*" >&2; exit 1; }
log() { echo "[local_cluster] $*"; }

# pid_of NAME: the PID recorded for daemon NAME if that process is alive and is NAME, else nothing.
pid_of() {
    local f=$D/run/$1.pid pid
    [[ -s $f ]] || return 0
    pid=$(tr -dc '0-9' <"$f")
    [[ -n $pid && -r /proc/$pid/comm && $(cat "/proc/$pid/comm") == "$1" ]] && echo "$pid"
    return 0
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
    local node mem
    # First line of `slurmd -C` describes this machine; leave ~1 GiB of memory to the daemons.
    node=$(slurmd -C | head -n1)
    mem=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node")
    [[ -n $mem ]] || die "cannot read RealMemory from 'slurmd -C': $node"
    node="${node/RealMemory=$mem/RealMemory=$((mem > 2048 ? mem - 1024 : mem))} NodeAddr=127.0.0.1 State=UNKNOWN"
    cat >"$D/etc/slurm.conf.new" <<EOF
# Written by slurm/local_cluster.sh: one-node cluster on loopback.
ClusterName=$CLUSTER
SlurmctldHost=$(hostname -s)(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$D/spool/ctld
SlurmdSpoolDir=$D/spool/d
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
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
$node
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

node_idle() { timeout 10 sinfo -h -N -o '%t' | grep -qx 'idle'; }

start() {
    mkdir -p "$D"/{etc,run,log,munge,mysql,spool/ctld,spool/d}
    install_packages
    write_configs
    start_munge
    start_mariadb
    start_slurmdbd
    [[ -z $(pid_of slurmctld) ]] && slurmctld -f "$SLURM_CONF"
    wait_for 30 slurmctld timeout 10 scontrol ping
    [[ -z $(pid_of slurmd) ]] && slurmd -f "$SLURM_CONF"
    wait_for 60 "node (sinfo idle)" node_idle
    wait_for 30 sacct timeout 10 sacct -n -X
    if [[ ! -e $LINK || $(readlink "$LINK") == "$SLURM_CONF" ]]; then
        mkdir -p "$(dirname "$LINK")"
        ln -sfn "$SLURM_CONF" "$LINK"
    else
        log "$LINK belongs to another cluster; use: export SLURM_CONF=$SLURM_CONF"
    fi
    log "cluster '$CLUSTER' up: partition '$PARTITION', state in $D"
    sinfo
}

# stop_daemon NAME: TERM the recorded PID, KILL it after 20 s.
stop_daemon() {
    local pid i
    pid=$(pid_of "$1")
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
    for d in slurmd slurmctld slurmdbd mariadbd munged; do stop_daemon "$d"; done
    if [[ -L $LINK && $(readlink "$LINK") == "$SLURM_CONF" ]]; then rm -f "$LINK"; fi
}

status() {
    local d pid rc=0
    for d in munged mariadbd slurmdbd slurmctld slurmd; do
        pid=$(pid_of "$d")
        if [[ -n $pid ]]; then echo "$d: running ($pid)"; else echo "$d: stopped"; rc=1; fi
    done
    if ((rc == 0)); then sinfo; fi
    return $rc
}

case ${1:-} in
start) start ;;
stop) stop ;;
status) status ;;
*) die "usage: bash slurm/local_cluster.sh start|stop|status (state dir: \$ACER_SLURM_DIR, default /tmp/acer-slurm)" ;;
esac
