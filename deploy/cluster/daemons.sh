# shellcheck shell=bash disable=SC2154,SC2153 # PIDS, LOGS, COMPONENTS, ...: set by up.sh
# Starting, watching and stopping the local cluster's daemons. Sourced by
# up.sh (not run on its own): it uses up.sh's variables (PIDS, LOGS, BIN_DIR,
# COMPONENTS, TIMEOUT, here) and log.

# gone PID: true once PID has exited or is exiting (a zombie: its parent, here
# usually PID 1, has not reaped it yet). Checked via /proc/PID/stat rather than
# /proc/PID/exe, which vanishes early in a process's exit.
gone() {
  local st
  st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 0
  [ "$st" = Z ]
}

# pid_of NAME: prints the pid from NAME's pid file if that process is alive
# and really is NAME (a stale pid may have been reused). Uses
# /proc/PID/{stat,comm}, which stay valid while a process exits, unlike
# /proc/PID/exe; comm is the binary name cut to 15 characters.
pid_of() {
  local f=$PIDS/$1.pid pid comm
  [ -f "$f" ] || return 1
  pid=$(cat "$f" 2>/dev/null) || return 1
  [ -n "$pid" ] || return 1
  ! gone "$pid" || return 1
  comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
  [ "$comm" = "${1:0:15}" ] || return 1
  echo "$pid"
}

# port_open PORT: true when something accepts TCP connections on 127.0.0.1:PORT
# (bash's /dev/tcp; no extra tools needed).
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# stop_all: kills whatever this state dir's pid files name; used when a start
# fails half way (stop_on_failure). SIGKILL, since the state is thrown away
# anyway and a graceful apiserver shutdown hangs once etcd is gone.
# The state dir (with logs) is kept for debugging; the next up.sh or down.sh
# removes it.
stop_all() {
  local c pid pids="" all
  # Several nodes (nodes.sh): their PID 1s, and with them all they run.
  if declare -F mn_kill_inits >/dev/null; then mn_kill_inits; fi
  for c in "${COMPONENTS[@]}"; do
    if pid=$(pid_of "$c"); then
      kill -9 "$pid" 2>/dev/null || true
      pids="$pids $pid"
    fi
  done
  # A daemon whose start was cut short may not have written its pid file
  # yet; it is then the last background job, still the wrapper shell (or
  # setsid, which does not fork here: a background job leads no process
  # group), whose command line names the pid file.
  if [ -n "${!:-}" ] && ! gone "$!"; then
    case "$(cat "/proc/$!/comm" 2>/dev/null)" in
      sh | setsid)
        if tr '\0' ' ' <"/proc/$!/cmdline" 2>/dev/null | grep -qF " $PIDS/"; then
          kill -9 "$!" 2>/dev/null || true
          pids="$pids $!"
        fi
        ;;
    esac
  fi
  # SIGKILL is asynchronous; wait until they have exited (their sockets can
  # linger a moment longer; the port check before a restart allows for that).
  for _ in $(seq 50); do
    all=1
    for pid in $pids; do
      gone "$pid" || all=0
    done
    [ $all = 0 ] || return 0
    sleep 0.1
  done
}

# up.sh sets STOP_ON_EXIT=1 (and traps EXIT with stop_on_failure) once it
# starts making the cluster, and back to 0 once the cluster is ready, so that
# a start that ends any other way (an error, a failed check, a signal) leaves
# no daemon running. FAILED: fail has already said why.
STOP_ON_EXIT=0
FAILED=0

# stop_on_failure: the EXIT trap; stops everything unless the start finished.
stop_on_failure() {
  local rc=$?
  [ "$STOP_ON_EXIT" = 1 ] || return 0
  STOP_ON_EXIT=0
  [ "$FAILED" = 1 ] || log "ERROR: start aborted (exit status $rc); stopping what it started"
  stop_all
  log "logs kept in $LOGS; run $here/down.sh to clean up"
}

# fail MSG [COMPONENT...]: prints MSG and the tail of each component's log,
# and exits non-zero; the EXIT trap (stop_on_failure) then stops everything.
fail() {
  local msg=$1 c
  shift
  log "ERROR: $msg"
  for c in "$@"; do
    if [ -f "$LOGS/$c.log" ]; then
      log "---- last lines of $LOGS/$c.log ----"
      tail -n 25 "$LOGS/$c.log" >&2 || true
    fi
  done
  FAILED=1
  exit 1
}

# start_daemon NAME ARGS...: starts $BIN_DIR/NAME detached and records its pid.
# start_daemon_path NAME BINARY ARGS...: the same for a binary elsewhere.
#  - setsid: its own session, so a caller killing its process group (a test
#    harness timing out, the shell's job control) does not take the cluster
#    down with it; down.sh is the way to stop it.
#  - stdin/stdout/stderr redirected, fd 9 (the lock) closed: a caller reading
#    up.sh's stdout through a pipe (e.g. Go's exec.Cmd.Output) would otherwise
#    never see EOF while the daemons live.
#  - the wrapper shell writes its own pid and then execs the binary, so the
#    pid file holds the daemon's pid even if setsid had to fork.
start_daemon() {
  local name=$1
  shift
  start_daemon_path "$name" "$BIN_DIR/$name" "$@"
}
start_daemon_path() {
  local name=$1 bin=$2
  shift 2
  rm -f "$PIDS/$name.pid"
  # shellcheck disable=SC2016 # expanded by the inner sh, on purpose
  setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDS/$name.pid" "$bin" "$@" \
    </dev/null >"$LOGS/$name.log" 2>&1 9>&- &
  # Out of this shell's job table: no "Killed" notices when stop_all kills one.
  disown "$!"
  # Wait for the exec: until then the pid belongs to `sh`, and pid_of (which
  # checks the process name) would take the daemon for dead.
  for _ in $(seq 100); do
    pid_of "$name" >/dev/null && return 0
    sleep 0.05
  done
  fail "$name exited right after starting" "$name"
}

# wait_for DESC COMPONENT CMD...: retries CMD every 0.25 s until it succeeds,
# the component dies, or TIMEOUT passes.
wait_for() {
  local desc=$1 comp=$2 deadline=$((SECONDS + TIMEOUT))
  shift 2
  until "$@" >/dev/null 2>&1; do
    pid_of "$comp" >/dev/null || fail "$comp exited while waiting for $desc" "$comp"
    [ $SECONDS -lt $deadline ] || fail "timed out after ${TIMEOUT}s waiting for $desc" "${COMPONENTS[@]}"
    sleep 0.25
  done
}
