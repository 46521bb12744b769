#!/usr/bin/env bash
# A private single-node Slurm cluster (munged + slurmctld + slurmd) under one directory, for
# the integration tests. Nothing outside DIR is touched: no systemd units, no /etc/slurm, no
# /run/munge, so it can run next to a real cluster or another copy of itself.
#
#   testbed/slurm-local.sh start DIR   create DIR's files, start the daemons, wait until idle
#   testbed/slurm-local.sh stop DIR    stop exactly the daemons recorded in DIR/pids
#   testbed/slurm-local.sh env DIR     print the shell line that points Slurm's clients at DIR:
#                                      eval "$(testbed/slurm-local.sh env DIR)"; srun hostname
#
# DIR/task_prolog is the cluster's TaskProlog. Slurm reads it afresh for every task, so tests
# change the prolog by replacing that file (atomically: a half-written script fails the task).
#
# Needs root (slurmd runs jobs as any user), munge, slurmctld, slurmd, slurm-client and
# python3. SLURM_LOCAL_IDLE_TIMEOUT (seconds, default 60) bounds the wait for an idle node.
set -euo pipefail

readonly IDLE_TIMEOUT=${SLURM_LOCAL_IDLE_TIMEOUT:-60}
readonly STOP_TIMEOUT=15
# Ports are chosen and bound under one machine-wide lock: two clusters starting at the same
# time would otherwise both see the same port free.
readonly PORT_LOCK=/tmp/hpcstack-slurm-local.lock
readonly LOCK_TIMEOUT=180
# The munge socket and slurmd's per-step sockets (SlurmdSpoolDir/<node>_<job>.<step>) are
# Unix sockets, whose paths must fit in 108 bytes.
readonly MAX_DIR_LENGTH=64

usage() {
  echo "usage: $0 start|stop|env DIR" >&2
  exit 2
}

die() {
  echo "slurm-local: $*" >&2
  exit 1
}

# True if PID is a live (not zombie) process named NAME. The name check keeps a recycled pid
# from being mistaken for, and killed as, one of our daemons.
alive() {
  local pid=$1 name=$2 stat comm state
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  read -r _ comm state _ <<<"$stat"
  [[ $comm == "($name)" && $state != Z ]]
}

# Each line of DIR/pids is "PID NAME", in start order.
read_pids() {
  pids=() names=()
  [[ -f $dir/pids ]] || return 0
  local pid name
  while read -r pid name; do
    [[ $pid =~ ^[0-9]+$ && -n $name ]] || continue
    pids+=("$pid") names+=("$name")
  done <"$dir/pids"
}

all_alive() {
  read_pids
  ((${#pids[@]} == 3)) || return 1
  local i
  for i in "${!pids[@]}"; do
    alive "${pids[i]}" "${names[i]}" || return 1
  done
}

clients_env() {
  export SLURM_CONF=$dir/slurm.conf
}

# Cancel what is still running first: slurmstepd processes outlive slurmd, and their pids
# are not ours to look up.
cancel_jobs() {
  local i jobs=() deadline
  for i in "${!pids[@]}"; do
    if [[ ${names[i]} == slurmctld ]] && alive "${pids[i]}" slurmctld; then
      clients_env
      mapfile -t jobs < <(timeout 10 squeue -h -o %A 2>/dev/null || true)
      ((${#jobs[@]})) || return 0
      timeout 10 scancel "${jobs[@]}" 2>/dev/null || true
      deadline=$((SECONDS + STOP_TIMEOUT))
      while ((SECONDS < deadline)) && [[ -n $(timeout 10 squeue -h -o %A 2>/dev/null) ]]; do
        sleep 0.5
      done
      return 0
    fi
  done
}

stop_daemons() {
  read_pids
  ((${#pids[@]})) || return 0
  cancel_jobs
  local i deadline left
  # Reverse start order: slurmd and slurmctld still need munged while they shut down.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    if alive "${pids[i]}" "${names[i]}"; then
      kill -TERM "${pids[i]}" 2>/dev/null || true
    fi
  done
  deadline=$((SECONDS + STOP_TIMEOUT))
  while :; do
    left=()
    for i in "${!pids[@]}"; do
      if alive "${pids[i]}" "${names[i]}"; then
        left+=("$i")
      fi
    done
    ((${#left[@]})) || break
    if ((SECONDS >= deadline)); then
      for i in "${left[@]}"; do
        echo "slurm-local: ${names[i]} (pid ${pids[i]}) ignored TERM; killing it" >&2
        kill -KILL "${pids[i]}" 2>/dev/null || true
      done
      break
    fi
    sleep 0.2
  done
  rm -f "$dir/pids"
}

# In the foreground each daemon logs both to its log file and to stderr (NAME.out); the
# .out file only says more when the daemon died before it could open its log file.
log_tails() {
  local name log
  for name in munged slurmctld slurmd; do
    log=$dir/log/$name.log
    [[ -s $log ]] || log=$dir/log/$name.out
    [[ -s $log ]] || continue
    echo "----- tail of $log" >&2
    tail -n 25 "$log" >&2
  done
}

fail_start() {
  echo "slurm-local: start failed: $*" >&2
  log_tails
  stop_daemons
  exit 1
}

# Two ports that nothing listens on, below the kernel's ephemeral range so that an outgoing
# connection (srun's own, say) cannot take one between this check and the daemon's bind.
pick_ports() {
  python3 - <<'EOF'
import random, socket

low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
candidates = list(range(10000, min(low, 32768)))
random.shuffle(candidates)
found = []
for port in candidates:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            continue
    found.append(str(port))
    if len(found) == 2:
        break
print(" ".join(found))
EOF
}

make_key() {
  local key=$1
  [[ -s $key ]] && return 0
  if ! mungekey --create --keyfile="$key" 2>/dev/null; then
    # munge < 0.5.14 has no mungekey.
    dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
  fi
  chmod 0600 "$key"
}

write_conf() {
  local node=$1 ctld_port=$2 slurmd_port=$3 hardware
  # slurmd -C prints the node line as slurmd itself will measure it; a node configured
  # with more than that is drained as soon as it registers.
  hardware=$(slurmd -C | sed -n 's/^NodeName=[^ ]* //p')
  [[ -n $hardware ]] || die "slurmd -C printed no node line"
  cat >"$dir/slurm.conf" <<EOF
# Written by testbed/slurm-local.sh; rewritten on every start.
ClusterName=hpcstack
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket.2
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
TaskProlog=$dir/task_prolog
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MailProg=/bin/true
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$node NodeAddr=127.0.0.1 $hardware State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# Starts a daemon in the foreground as our child, so that $! is the daemon's own pid (a
# forking daemon's pid would have to be fished out of its pid file after the fact). The lock
# descriptor is closed for it: a daemon holding it would block every later start.
launch() {
  local name=$1
  shift
  "$@" </dev/null >>"$dir/log/$name.out" 2>&1 9>&- &
  echo "$! $name" >>"$dir/pids"
}

# True while PID (a child of this script, so its pid cannot be reused before we reap it)
# has not exited. No name check: between fork and exec the child still runs as this script.
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # The state follows the command name, which is in parentheses and may contain blanks.
  stat=${stat##*) }
  [[ ${stat:0:1} != Z ]]
}

# Waits until "$@" succeeds; fails the start at once if any daemon started so far is dead.
wait_for() {
  local what=$1 timeout=$2 i
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    read_pids
    for i in "${!pids[@]}"; do
      running "${pids[i]}" || fail_start "${names[i]} died while waiting for $what"
    done
    ((SECONDS < deadline)) || fail_start "no $what after ${timeout} s"
    sleep 0.05
  done
}

controller_up() {
  scontrol ping 2>/dev/null | grep -q UP
}

node_idle() {
  [[ $(sinfo -h -N -o %T 2>/dev/null) == idle ]]
}

start() {
  local node ctld_port slurmd_port started
  started=$(date +%s%N)
  command -v python3 >/dev/null || die "python3 is needed to pick free ports"
  ((${#dir} <= MAX_DIR_LENGTH)) || die "DIR is longer than $MAX_DIR_LENGTH bytes: $dir"
  # munged refuses a socket whose parent directories not every user can search, and job
  # users must reach it too.
  local parent=$dir
  while [[ $parent != / ]]; do
    (((8#$(stat -c %a "$parent") & 1) == 1)) ||
      die "every directory above DIR must be searchable by all users (chmod o+x): $parent"
    parent=$(dirname "$parent")
  done
  # slurm.conf values end at the first blank.
  [[ $dir != *[[:space:]]* ]] || die "DIR contains blanks: $dir"

  exec 9>>"$PORT_LOCK"
  flock -w "$LOCK_TIMEOUT" 9 || die "another start held $PORT_LOCK for ${LOCK_TIMEOUT} s"

  if all_alive; then
    echo "slurm-local: already running in $dir (pids ${pids[*]})"
    return 0
  fi
  # Leftovers of a half-dead cluster would hold the old ports and state.
  stop_daemons
  rm -rf "$dir/state" "$dir/spool" "$dir/run" "$dir/log"
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/run" "$dir/log"
  # Clients of any user need to reach the socket; munged refuses a directory others can write.
  chmod 0755 "$dir/munge"
  : >"$dir/pids"

  printf '#!/bin/sh\nexit 0\n' >"$dir/task_prolog.tmp"
  chmod 0755 "$dir/task_prolog.tmp"
  mv -f "$dir/task_prolog.tmp" "$dir/task_prolog"

  node=$(hostname -s)
  read -r ctld_port slurmd_port < <(pick_ports)
  [[ -n ${slurmd_port:-} ]] || die "found no two free TCP ports"
  write_conf "$node" "$ctld_port" "$slurmd_port"
  clients_env

  make_key "$dir/munge/munge.key"
  launch munged munged --foreground --socket="$dir/munge/munge.socket.2" \
    --pid-file="$dir/run/munged.pid" --key-file="$dir/munge/munge.key" \
    --seed-file="$dir/munge/munged.seed" --log-file="$dir/log/munged.log"
  wait_for "munge socket" 10 test -S "$dir/munge/munge.socket.2"

  launch slurmctld slurmctld -D -f "$dir/slurm.conf"
  # A slurmd that finds no controller retries its registration only after a second or so.
  wait_for "answer from slurmctld" "$IDLE_TIMEOUT" controller_up
  launch slurmd slurmd -D -f "$dir/slurm.conf" -N "$node"
  wait_for "idle node" "$IDLE_TIMEOUT" node_idle

  local ms=$((($(date +%s%N) - started) / 1000000))
  echo "slurm-local: node $node idle in $((ms / 1000)).$(printf %03d $((ms % 1000))) s" \
    "(SlurmctldPort=$ctld_port SlurmdPort=$slurmd_port, pids $(cut -d' ' -f1 "$dir/pids" | xargs))"
}

(($# == 2)) || usage
readonly command=$1
[[ -n $2 ]] || usage
if [[ $command == start ]]; then
  mkdir -p "$2"
fi
dir=$(cd "$2" && pwd -P) || die "no such directory: $2"
readonly dir
pids=() names=()

case $command in
  start) start ;;
  stop) stop_daemons ;;
  env) printf 'export SLURM_CONF=%q\n' "$dir/slurm.conf" ;;
  *) usage ;;
esac
