#!/usr/bin/env bash
# Local single-node SLURM cluster with accounting, for tests and CI.
#
#   bash .ci/slurm.sh start    # install packages if missing, start munge, MariaDB,
#                              # slurmdbd, slurmctld, slurmd; wait for an idle node + sacct
#   bash .ci/slurm.sh stop     # scancel everything, stop every daemon by pid file
#   bash .ci/slurm.sh status   # sinfo (exit 0) or "not running" (exit 1)
#   bash .ci/slurm.sh restart
#
# Debian 12 (bookworm) packages, no systemd needed, runs as root (re-executes itself
# through sudo otherwise). Every step is idempotent: `start` on a running cluster is a
# no-op, `start` after `stop` brings everything back in a few seconds.
# Background and traps: docs/slurm-local.md (shared docs).
#
# Environment knobs:
#   RW_SLURM_TIMEOUT   seconds to wait for the node / sacct (default 60)
#   RW_SLURM_STATE     state dir (default /var/lib/rw-slurm)
#   RW_SLURM_LOGS      log dir   (default /var/log/rw-slurm)
set -euo pipefail

if [[ ${EUID} -ne 0 ]]; then
    exec sudo -E bash "$0" "$@"
fi

export PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH}"
export DEBIAN_FRONTEND=noninteractive
unset SLURM_CONF  # clients and daemons must all read /etc/slurm/slurm.conf

STATE=${RW_SLURM_STATE:-/var/lib/rw-slurm}
LOGS=${RW_SLURM_LOGS:-/var/log/rw-slurm}
TIMEOUT=${RW_SLURM_TIMEOUT:-60}
CONF_DIR=/etc/slurm
SLURM_CONF_FILE=${CONF_DIR}/slurm.conf
DBD_CONF_FILE=${CONF_DIR}/slurmdbd.conf
CLUSTER=rwsweeps
PARTITION=debug
SLURM_USER=slurm
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=rw-slurm-local   # local-only MariaDB reachable through its unix socket only

MUNGE_PID=/run/munge/munged.pid
MYSQL_PID=/run/mysqld/mysqld.pid
MYSQL_SOCK=/run/mysqld/mysqld.sock
DBD_PID=/run/slurmdbd.pid
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid

T0=$(date +%s.%N)
log() { printf '[slurm.sh %5.1fs] %s\n' "$(awk -v a="$(date +%s.%N)" -v b="${T0}" 'BEGIN{print a-b}')" "$*"; }
die() { log "ERROR: $*"; dump_logs; exit 1; }

dump_logs() {
    local f n
    for f in /var/log/munge/munged.log "${LOGS}"/mariadb.log \
             "${LOGS}"/slurmdbd.log "${LOGS}"/slurmctld.log "${LOGS}"/slurmd.log; do
        [[ -s ${f} ]] || continue
        case ${f} in *slurm*) n=40 ;; *) n=15 ;; esac
        echo "----- tail -n ${n} ${f} -----"
        tail -n "${n}" "${f}" || true
    done
    echo "----- logs: ${LOGS}/{apt,mariadb,slurmdbd,slurmctld,slurmd}.log /var/log/munge/munged.log;" \
         "configs: ${SLURM_CONF_FILE} ${DBD_CONF_FILE} -----"
}

# ---------------------------------------------------------------- process helpers
# A pid is alive if /proc/PID exists and is not a zombie. PID 1 here may reap
# orphans slowly, so a stopped daemon lingers as Z for a second or two.
pid_alive() {
    local pid=$1 st
    [[ -n ${pid} && -r /proc/${pid}/stat ]] || return 1
    st=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/${pid}/stat" 2>/dev/null) || return 1
    [[ -n ${st} && ${st} != Z && ${st} != X ]]
}

# pidfile_alive PIDFILE COMM: the pid file names a live process called COMM.
pidfile_alive() {
    local pidfile=$1 comm=$2 pid
    [[ -r ${pidfile} ]] || return 1
    pid=$(tr -dc '0-9' <"${pidfile}" 2>/dev/null)
    pid_alive "${pid}" || return 1
    [[ $(cat "/proc/${pid}/comm" 2>/dev/null) == "${comm}" ]]
}

# stop_pidfile PIDFILE COMM: SIGTERM, wait up to 10 s, then SIGKILL.
stop_pidfile() {
    local pidfile=$1 comm=$2 pid i
    if ! pidfile_alive "${pidfile}" "${comm}"; then
        rm -f "${pidfile}"
        return 0
    fi
    pid=$(tr -dc '0-9' <"${pidfile}")
    kill -TERM "${pid}" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        pid_alive "${pid}" || break
        sleep 0.1
    done
    if pid_alive "${pid}"; then
        log "${comm} (pid ${pid}) ignored SIGTERM for 10 s: SIGKILL"
        kill -KILL "${pid}" 2>/dev/null || true
        for ((i = 0; i < 30; i++)); do
            pid_alive "${pid}" || break
            sleep 0.1
        done
    fi
    rm -f "${pidfile}"
    log "stopped ${comm} (pid ${pid})"
}

# wait_for SECONDS DESCRIPTION CMD...: poll CMD every 0.2 s.
wait_for() {
    local secs=$1 what=$2 deadline
    shift 2
    deadline=$(($(date +%s) + secs))
    until "$@" >/dev/null 2>&1; do
        if (($(date +%s) >= deadline)); then
            die "timed out after ${secs}s waiting for ${what}"
        fi
        sleep 0.2
    done
}

tcp_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# ---------------------------------------------------------------- install
REQUIRED_BINS=(slurmctld slurmd slurmdbd sinfo sbatch sacct scontrol munged munge unmunge mariadbd mysql)

missing_bins() {
    local b out=()
    for b in "${REQUIRED_BINS[@]}"; do
        command -v "${b}" >/dev/null 2>&1 || out+=("${b}")
    done
    echo "${out[*]}"
}

install_packages() {
    local missing
    missing=$(missing_bins)
    if [[ -z ${missing} ]]; then
        log "packages already installed"
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 || die "missing ${missing} and no apt-get to install them"
    log "missing: ${missing} -> apt-get update"
    # Wait for a dpkg lock held by another apt (unattended-upgrades, a parallel job).
    apt-get -o DPkg::Lock::Timeout=300 update -qq || die "apt-get update failed"
    log "apt-get install slurmctld slurmd slurm-client munge slurmdbd mariadb-server"
    apt-get install -y -qq --no-install-recommends -o DPkg::Lock::Timeout=300 \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
        slurmctld slurmd slurm-client munge slurmdbd mariadb-server >"${LOGS}/apt.log" 2>&1 ||
        { tail -n 40 "${LOGS}/apt.log"; die "apt-get install failed (full log ${LOGS}/apt.log)"; }
    missing=$(missing_bins)
    [[ -z ${missing} ]] || die "still missing after install: ${missing}"
    log "packages installed"
}

ensure_users_and_dirs() {
    if ! id -u "${SLURM_USER}" >/dev/null 2>&1; then
        useradd --system --user-group --no-create-home --home-dir /nonexistent \
            --shell /usr/sbin/nologin "${SLURM_USER}"
    fi
    mkdir -p "${STATE}/slurmctld" "${STATE}/slurmd" "${LOGS}" "${CONF_DIR}"
    chown "${SLURM_USER}:${SLURM_USER}" "${STATE}/slurmctld" "${LOGS}"
    chmod 0755 "${STATE}" "${LOGS}"
}

# ---------------------------------------------------------------- munge
munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
    if munge_works; then
        log "munged already running"
        return 0
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge 2>/dev/null || true
    if [[ ! -s /etc/munge/munge.key ]]; then
        log "creating /etc/munge/munge.key"
        if command -v mungekey >/dev/null 2>&1; then
            runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key --force
        else
            dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
        fi
        chown munge:munge /etc/munge/munge.key
        chmod 0400 /etc/munge/munge.key
    fi
    rm -f "${MUNGE_PID}"
    # munged daemonizes itself; the key is owned by munge, so run it as munge.
    runuser -u munge -- /usr/sbin/munged ||
        die "munged failed to start (log /var/log/munge/munged.log)"
    wait_for 10 "munge -n | unmunge" munge_works
    log "munged started"
}

# ---------------------------------------------------------------- MariaDB
mysql_root() { mysql --protocol=socket --socket="${MYSQL_SOCK}" -u root "$@"; }
mysql_up() { mysqladmin --protocol=socket --socket="${MYSQL_SOCK}" -u root --connect-timeout=2 ping; }

start_mariadb() {
    if mysql_up >/dev/null 2>&1; then
        log "mariadbd already running"
    else
        install -d -o mysql -g mysql -m 0755 /run/mysqld
        if [[ ! -d /var/lib/mysql/mysql ]]; then
            log "initialising /var/lib/mysql"
            mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"${LOGS}/mariadb-install.log" 2>&1 ||
                die "mariadb-install-db failed (log ${LOGS}/mariadb-install.log)"
        fi
        rm -f "${MYSQL_PID}"
        # mariadbd does not daemonize: detach it with setsid. No TCP listener, so it
        # cannot clash with another MySQL on port 3306; slurmdbd uses the socket.
        setsid mariadbd --user=mysql --skip-networking \
            --socket="${MYSQL_SOCK}" --pid-file="${MYSQL_PID}" \
            --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 \
            </dev/null >>"${LOGS}/mariadb.log" 2>&1 &
        wait_for 30 "mariadbd (socket ${MYSQL_SOCK})" mysql_up
        log "mariadbd started"
    fi
    mysql_root <<SQL || die "could not create the ${DB_USER} database user"
CREATE USER IF NOT EXISTS '${DB_USER}'@'localhost' IDENTIFIED BY '${DB_PASS}';
ALTER USER '${DB_USER}'@'localhost' IDENTIFIED BY '${DB_PASS}';
GRANT ALL PRIVILEGES ON \`${DB_NAME}\`.* TO '${DB_USER}'@'localhost';
FLUSH PRIVILEGES;
SQL
}

# ---------------------------------------------------------------- config files
HOST=$(hostname -s)
NODE=${HOST}

# write_if_changed FILE MODE OWNER: content on stdin. Returns 0 when FILE changed.
write_if_changed() {
    local file=$1 mode=$2 owner=$3 tmp
    tmp=$(mktemp "${file}.XXXXXX")
    cat >"${tmp}"
    chmod "${mode}" "${tmp}"
    chown "${owner}" "${tmp}"
    if [[ -f ${file} ]] && cmp -s "${tmp}" "${file}" &&
        [[ $(stat -c '%a %U' "${file}") == "$(stat -c '%a %U' "${tmp}")" ]]; then
        rm -f "${tmp}"
        return 1
    fi
    mv -f "${tmp}" "${file}"
    return 0
}

write_slurmdbd_conf() {
    write_if_changed "${DBD_CONF_FILE}" 600 "${SLURM_USER}:${SLURM_USER}" <<EOF
# Written by .ci/slurm.sh: do not edit, it is rewritten on every start.
AuthType=auth/munge
DbdHost=${HOST}
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=${SLURM_USER}
DebugLevel=info
LogFile=${LOGS}/slurmdbd.log
PidFile=${DBD_PID}
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=${DB_USER}
StoragePass=${DB_PASS}
StorageLoc=${DB_NAME}
EOF
}

write_slurm_conf() {
    local cpus mem_kb real_mem
    cpus=$(nproc)
    mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
    real_mem=$((mem_kb * 9 / 10 / 1024))
    write_if_changed "${SLURM_CONF_FILE}" 644 root:root <<EOF
# Written by .ci/slurm.sh: do not edit, it is rewritten on every start.
ClusterName=${CLUSTER}
SlurmctldHost=${HOST}(127.0.0.1)
SlurmUser=${SLURM_USER}
AuthType=auth/munge
# credential lifetime; also the delay before a requeued job may start again (default 120 s)
AuthInfo=cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=${STATE}/slurmctld
SlurmdSpoolDir=${STATE}/slurmd
SlurmctldPidFile=${CTLD_PID}
SlurmdPidFile=${SLURMD_PID}
SlurmctldLogFile=${LOGS}/slurmctld.log
SlurmdLogFile=${LOGS}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups: plain process tracking, no task binding, no accounting sampling
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
MailProg=/bin/true
# accounting (sacct) through slurmdbd + MariaDB; submitit needs it to see cancelled jobs
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
JobCompType=jobcomp/none
# scheduling: cores are the only consumable (no --mem accounting), short test jobs start fast
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2,batch_sched_delay=1
MaxArraySize=1001
JobRequeue=1
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${cpus} RealMemory=${real_mem} State=UNKNOWN
PartitionName=${PARTITION} Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP
EOF
}

# ---------------------------------------------------------------- slurm daemons
start_slurmdbd() {
    if pidfile_alive "${DBD_PID}" slurmdbd; then
        log "slurmdbd already running"
    else
        rm -f "${DBD_PID}"
        slurmdbd || die "slurmdbd failed to start"
        log "slurmdbd launched"
    fi
    wait_for 30 "slurmdbd on 127.0.0.1:6819" tcp_open 127.0.0.1 6819
    pidfile_alive "${DBD_PID}" slurmdbd || die "slurmdbd exited"
    log "slurmdbd listening on 6819"
}

start_slurmctld() {
    # A StateSaveLocation from another ClusterName makes slurmctld refuse to start.
    local cn="${STATE}/slurmctld/clustername"
    if [[ -f ${cn} && $(cat "${cn}") != "${CLUSTER}" ]]; then
        log "clearing state of old cluster '$(cat "${cn}")'"
        find "${STATE}/slurmctld" -mindepth 1 -delete
    fi
    if pidfile_alive "${CTLD_PID}" slurmctld; then
        log "slurmctld already running"
        return 0
    fi
    rm -f "${CTLD_PID}"
    slurmctld -i || die "slurmctld failed to start"
    log "slurmctld launched"
}

start_slurmd() {
    if pidfile_alive "${SLURMD_PID}" slurmd; then
        log "slurmd already running"
        return 0
    fi
    rm -f "${SLURMD_PID}"
    slurmd || die "slurmd failed to start"
    log "slurmd launched"
}

node_state() { timeout 10 sinfo -h -N -n "${NODE}" -o '%T' 2>/dev/null | head -n1; }

sacct_works() {
    local out
    out=$(timeout 10 sacct -n -X -a -S now-1minutes 2>&1) || return 1
    ! grep -qi 'disabled\|error' <<<"${out}"
}

wait_cluster_ready() {
    local deadline state last_resume=0 cluster_added=0 start
    start=$(date +%s)
    deadline=$((start + TIMEOUT))
    while :; do
        state=$(node_state || true)
        case ${state} in
            idle | mixed | allocated | completing)
                break ;;
            *'*')
                ;;  # "*": slurmd not responding (yet): keep waiting
            *drain* | *down* | *fail*)
                # slurmd answers but the node is left drained/down from an earlier run.
                if (($(date +%s) - last_resume >= 5)); then
                    log "node ${NODE} is ${state}: resuming it"
                    timeout 10 scontrol update nodename="${NODE}" state=resume >/dev/null 2>&1 || true
                    last_resume=$(date +%s)
                fi ;;
        esac
        pidfile_alive "${CTLD_PID}" slurmctld || die "slurmctld died"
        pidfile_alive "${SLURMD_PID}" slurmd || die "slurmd died"
        (($(date +%s) < deadline)) || die "node ${NODE} not idle after ${TIMEOUT}s (state: '${state}')"
        sleep 0.2
    done
    log "node ${NODE} is ${state}"
    while ! sacct_works; do
        # slurmctld registers the cluster with slurmdbd by itself; add it if it did not.
        if ((cluster_added == 0 && $(date +%s) > start + 10)); then
            if ! timeout 10 sacctmgr -n -P list cluster format=cluster 2>/dev/null | grep -qx "${CLUSTER}"; then
                log "registering cluster ${CLUSTER} in slurmdbd"
                timeout 10 sacctmgr -i add cluster "${CLUSTER}" >/dev/null 2>&1 || true
            fi
            cluster_added=1
        fi
        (($(date +%s) < deadline)) || die "sacct not working after ${TIMEOUT}s: $(timeout 10 sacct -n -X 2>&1 | head -n3)"
        sleep 0.2
    done
    log "sacct works"
}

stop_slurm_daemons() {
    stop_pidfile "${SLURMD_PID}" slurmd
    stop_pidfile "${CTLD_PID}" slurmctld
}

# ---------------------------------------------------------------- commands
cmd_start() {
    mkdir -p "${LOGS}"
    install_packages
    ensure_users_and_dirs
    start_munge
    start_mariadb
    if write_slurmdbd_conf; then
        log "wrote ${DBD_CONF_FILE}"
        stop_pidfile "${DBD_PID}" slurmdbd
    fi
    start_slurmdbd
    if write_slurm_conf; then
        log "wrote ${SLURM_CONF_FILE}"
        stop_slurm_daemons
    fi
    start_slurmctld
    start_slurmd
    wait_cluster_ready
    log "cluster up: partition ${PARTITION}, node ${NODE}, $(nproc) CPUs; logs in ${LOGS}"
    timeout 10 sinfo || true
}

cancel_all_jobs() {
    pidfile_alive "${CTLD_PID}" slurmctld || return 0
    local jobs i
    jobs=$(timeout 5 squeue -h -o '%A' 2>/dev/null || true)
    [[ -n ${jobs} ]] || return 0
    log "scancel $(wc -w <<<"${jobs}") job(s)"
    # shellcheck disable=SC2086
    timeout 5 scancel ${jobs} >/dev/null 2>&1 || true
    for ((i = 0; i < 50; i++)); do  # KillWait=5
        [[ -z $(timeout 5 squeue -h -t running,completing -o '%A' 2>/dev/null) ]] && break
        sleep 0.2
    done
}

cmd_stop() {
    cancel_all_jobs
    stop_pidfile "${SLURMD_PID}" slurmd
    stop_pidfile "${CTLD_PID}" slurmctld
    stop_pidfile "${DBD_PID}" slurmdbd
    stop_pidfile "${MYSQL_PID}" mariadbd
    stop_pidfile "${MUNGE_PID}" munged
    log "stopped"
}

cmd_status() {
    if pidfile_alive "${CTLD_PID}" slurmctld && timeout 10 sinfo 2>/dev/null; then
        return 0
    fi
    echo "not running"
    return 1
}

case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status) cmd_status ;;
    *)
        echo "usage: $0 {start|stop|status|restart}" >&2
        exit 2 ;;
esac
