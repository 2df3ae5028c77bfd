#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The systemd unit of `shardlm serve` (deploy/systemd/): tests/deploy/test_systemd.sh SHARDLM MODEL
#
# 1. `systemd-analyze verify` on shardlm@.service, its /usr/bin/shardlm pointed at the build:
#    any line it prints about the unit fails (verify exits 0 on an unknown key or a bad value).
#    shardlm.sysusers, applied to a scratch root, creates the unit's User= and Group=.
# 2. The unit's ExecStart= run as systemd runs it: Environment=, then EnvironmentFile= (the
#    instance's conf: example.conf with the test's model, a free port and a private runtime
#    directory appended), ${X} one word, $X split on white space, %i the instance; the
#    manager's variables; NOTIFY_SOCKET a datagram socket this test reads. Checks: STATUS= at
#    the start, READY=1 exactly once and GET /health answering 200 when it comes, every message
#    from the main process (NotifyAccess=main), a completion, and then SIGTERM to the main
#    process alone (KillMode=mixed): STOPPING=1, exit 0, no worker left, nothing in the runtime
#    directory but weights segments. Three runs: cold, warm (mapping the weights segments the
#    first one left; NOTIFY_SOCKET an abstract name) under strace -f, cold again under strace.
# 3. Every system call of the traced runs, coordinator and workers, from load to drain, against
#    SystemCallFilter= as systemd builds it (the first line picks allow or deny list; @default
#    and the always-allowed calls join an allow list; groups expanded by `systemd-analyze
#    syscall-filter`; ~ lines remove) and the calls other settings deny (PrivateDevices=,
#    ProtectClock=, ProtectKernelModules=, ProtectKernelLogs=, ProtectHostname=); then the
#    arguments some settings restrict (RestrictAddressFamilies=, MemoryDenyWriteExecute=,
#    RestrictRealtime=, RestrictNamespaces=, LockPersonality=, RestrictSUIDSGID=). Prints what
#    systemd would refuse.
# 4. `systemd-analyze security --offline=true` of an instance, printed; past EXPOSURE_MAX
#    (default 2.0, of 10) it fails.
# A missing tool fails the test, naming its Debian package (deploy/bootstrap.sh installs them):
# systemd (systemd-analyze, systemd-sysusers), strace, python3, curl, procps (pgrep).
# Environment: SYSTEMD_TEST_KEEP=1 keeps the work folder.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/script_lib.sh
. "$HERE/../script_lib.sh"
script_args "$@"
SRC=$(cd "$HERE/../.." && pwd)
UNIT_SRC=$SRC/deploy/systemd/shardlm@.service
CONF_SRC=$SRC/deploy/systemd/example.conf
SYSUSERS=$SRC/deploy/systemd/shardlm.sysusers
INSTANCE="test"
EXPOSURE_MAX=${EXPOSURE_MAX:-2.0}

need() { # need COMMAND PACKAGE
    command -v "$1" >/dev/null ||
        { echo "FAIL: $1 is not installed (Debian package $2, in deploy/bootstrap.sh)"; exit 1; }
}
need systemd-analyze systemd
need systemd-sysusers systemd
need strace strace
need python3 python3
need curl curl
need pgrep procps
for f in "$UNIT_SRC" "$CONF_SRC" "$SYSUSERS"; do
    [ -f "$f" ] || { echo "FAIL: $f is missing"; exit 1; }
done
[ -f "$MODEL" ] || { echo "FAIL: $MODEL is missing (the serve_model test makes it)"; exit 1; }
[ -x "$BIN" ] || { echo "FAIL: $BIN is not executable"; exit 1; }

WORK=$(mktemp -d /tmp/shardlm-systemd.XXXXXX)
RUNDIR=/dev/shm/shardlm-systemd-test-$$
mkdir -m 700 "$RUNDIR"
SRV=""      # the server's main process
LAUNCHER="" # what the test started for it: the server itself, or strace
LISTENER=""

cleanup() {
    set +e
    kill_server "$SRV"
    [ -n "$LAUNCHER" ] && kill -KILL "$LAUNCHER" 2>/dev/null
    [ -n "$LISTENER" ] && kill "$LISTENER" 2>/dev/null
    # every background job, including one an earlier run left behind, so that wait cannot block
    for j in $(jobs -p); do kill -KILL "$j" 2>/dev/null; done
    wait 2>/dev/null
    rm -rf "$RUNDIR"
    if [ "${SYSTEMD_TEST_KEEP:-0}" = 1 ]; then echo "work folder: $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT


# ---- the helper: the unit read as systemd reads it, the notify socket, the trace's calls ----
cat >"$WORK/unit.py" <<'PYEOF'
import json, os, re, secrets, shlex, socket, struct, subprocess, sys, time, urllib.request

def unit_service(path):
    """[Service] of a unit file: a list of (key, value) in order (continuations joined)."""
    out, section, pending = [], None, ""
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if pending:
            line, pending = pending + line, ""
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        s = line.strip()
        if not s or s[0] in "#;":
            continue
        if s.startswith("["):
            section = s.strip("[]")
        elif section == "Service" and "=" in s:
            k, v = s.split("=", 1)
            out.append((k.strip(), v.strip()))
    return out

def specifiers(s, unit, instance):
    """%i and the other specifiers this test can know (systemd.unit(5)); others are an error."""
    prefix = unit.split("@")[0]
    table = {"i": instance, "I": instance, "n": f"{prefix}@{instance}.service",
             "N": f"{prefix}@{instance}", "p": prefix, "P": prefix, "%": "%"}
    def sub(m):
        c = m.group(1)
        if c not in table:
            sys.exit(f"unit.py: specifier %{c} is not emulated by this test")
        return table[c]
    return re.sub(r"%(.)", sub, s)

def env_file(path):
    """An EnvironmentFile= as systemd parses it (env-file.c): KEY=VALUE, # or ; comments at a
    line's start, quotes anywhere in a value, backslash escapes, trailing blanks trimmed."""
    env, text = {}, open(path, encoding="utf-8").read()
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            while i < n and text[i] != "\n":
                i += 1
            continue
        j = i
        while j < n and text[j] not in "=\n":
            j += 1
        key = text[i:j].strip()
        if j >= n or text[j] != "=":
            i = j
            continue
        i = j + 1
        while i < n and text[i] in " \t":
            i += 1
        val, trail, q = [], 0, None
        while i < n:
            c = text[i]
            if q is None:
                if c == "\n":
                    break
                if c in "'\"":
                    q, trail = c, 0
                elif c == "\\" and i + 1 < n:
                    i += 1
                    if text[i] != "\n":
                        val.append(text[i])
                    trail = 0
                else:
                    val.append(c)
                    trail = trail + 1 if c in " \t\r" else 0
            elif c == q:
                q = None
            elif q == '"' and c == "\\" and i + 1 < n:
                i += 1
                if text[i] in '"\\`$':
                    val.append(text[i])
                elif text[i] != "\n":
                    val.append("\\" + text[i])
            else:
                val.append(c)
            i += 1
        v = "".join(val)
        env[key] = v[: len(v) - trail] if trail else v
    return env

def expand(words, env):
    """ExecStart='s words with systemd's variable rules: a word that is exactly $NAME becomes
    the value split on white space (none if unset or empty); ${NAME} anywhere is the value as
    it is, in one word; $$ is a $. A bare $NAME inside a longer word is refused here."""
    argv = []
    for w in words:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            argv += shlex.split(env.get(m.group(1), ""))
            continue
        if re.search(r"(?<!\$)\$[A-Za-z_]", w.replace("$$", "")):
            sys.exit(f"unit.py: '{w}': write ${{NAME}} inside a word")
        w = re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), w)
        argv.append(w.replace("$$", "$"))
    return argv

def cmd_exec(unit, instance, etc, binary, out_env, out_argv):
    """The environment and argv systemd would give ExecStart= (files of NUL-separated words);
    /etc/shardlm/ read from @etc, /usr/bin/shardlm mapped to @binary."""
    name = os.path.basename(unit)
    env, files, execs = {}, [], []
    for k, v in unit_service(unit):
        v = specifiers(v, name, instance)
        if k == "Environment":
            if not v:
                env = {}
            for a in shlex.split(v):
                ek, _, ev = a.partition("=")
                env[ek] = ev
        elif k == "EnvironmentFile":
            files = [] if not v else files + [v]
        elif k == "ExecStart":
            execs.append(v)
    if len(execs) != 1:
        sys.exit(f"unit.py: {len(execs)} ExecStart= lines, expected one")
    for f in files:
        optional = f.startswith("-")
        f = f.lstrip("-")
        if not f.startswith("/etc/shardlm/"):
            sys.exit(f"unit.py: EnvironmentFile={f}: expected under /etc/shardlm/")
        local = os.path.join(etc, f[len("/etc/shardlm/"):])
        if not os.path.exists(local):
            if optional:
                continue
            sys.exit(f"unit.py: {f} ({local}) is missing")
        env.update(env_file(local))  # EnvironmentFile= wins over Environment=
    line, expand_vars = execs[0], True
    while line and line[0] in "@-:+!":
        if line[0] == "@":
            sys.exit("unit.py: ExecStart=@ is not emulated by this test")
        expand_vars &= line[0] != ":"
        line = line[1:]
    words = shlex.split(line)
    argv = expand(words, env) if expand_vars else words
    if argv[0] != "/usr/bin/shardlm":
        sys.exit(f"unit.py: ExecStart= runs {argv[0]}, expected /usr/bin/shardlm (the install's)")
    argv[0] = binary
    with open(out_env, "w") as f:
        f.write("".join(f"{k}={v}\0" for k, v in env.items()))
    with open(out_argv, "w") as f:
        f.write("".join(a + "\0" for a in argv))

def cmd_setting(unit, key):
    """The last value of a [Service] setting (empty if unset)."""
    v = [val for k, val in unit_service(unit) if k == key]
    print(v[-1] if v else "")

def cmd_listen(path, events, health_url):
    """NOTIFY_SOCKET: one JSON line per datagram, with the sender's pid (SCM_CREDENTIALS) and,
    for READY=1, the status GET /health answers at that moment."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
    s.bind("\0" + path[1:] if path.startswith("@") else path)  # '@': an abstract name
    s.settimeout(1)
    parent = os.getppid()
    open(events + ".up", "w").close()
    with open(events, "a", buffering=1) as out:
        while os.getppid() == parent:  # the test went away: so does this
            try:
                data, anc, _, _ = s.recvmsg(4096, socket.CMSG_SPACE(12))
            except socket.timeout:
                continue
            pid = 0
            for level, kind, cdata in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", cdata[:12])[0]
            msg = data.decode("utf-8", "replace")
            ev = {"t": time.time(), "pid": pid, "msg": msg}
            if "READY=1" in msg.split("\n"):
                try:
                    ev["health"] = urllib.request.urlopen(health_url, timeout=5).status
                except urllib.error.HTTPError as e:
                    ev["health"] = e.code
                except Exception as e:
                    ev["health"] = str(e)
            out.write(json.dumps(ev) + "\n")

def cmd_events(events, main_pid):
    """Checks the notifications of one run: prints PASS/FAIL lines, exits 1 on a failure."""
    evs = [json.loads(l) for l in open(events)] if os.path.exists(events) else []
    lines = [(e, a) for e in evs for a in e["msg"].split("\n")]
    fails = 0
    def check(name, ok, detail):
        nonlocal fails
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
        fails += not ok
    ready = [e for e, a in lines if a == "READY=1"]
    stopping = [e for e, a in lines if a == "STOPPING=1"]
    status = [a for e, a in lines if a.startswith("STATUS=")]
    check("notify-status", any(a.startswith("STATUS=loading") for a in status),
          "STATUS= lines: " + "; ".join(status))
    check("notify-ready-once", len(ready) == 1, f"{len(ready)} READY=1")
    check("notify-ready-health", bool(ready) and all(e.get("health") == 200 for e in ready),
          "GET /health when READY=1 came: " + ", ".join(str(e.get("health")) for e in ready))
    after = not ready or (stopping and stopping[0]["t"] >= ready[0]["t"])
    check("notify-stopping", len(stopping) == 1 and after,
          f"{len(stopping)} STOPPING=1, after READY=1")
    pids = sorted({e["pid"] for e in evs})
    check("notify-main-only", pids == [int(main_pid)],
          f"senders {pids}, main process {main_pid}")
    sys.exit(1 if fails else 0)

def group(name, cache={}):
    """The system calls of @name, nested groups expanded (systemd-analyze syscall-filter)."""
    if name not in cache:
        out = subprocess.run(["systemd-analyze", "syscall-filter", name], check=True,
                             capture_output=True, text=True).stdout.splitlines()
        calls = set()
        for l in out[1:]:
            w = l.strip()
            if not w or w.startswith("#"):
                continue
            calls |= group(w) if w.startswith("@") else {w}
        cache[name] = calls
    return cache[name]

def names(words):
    calls = set()
    for w in words:
        w = w.split(":")[0]  # a deny list's ":errno"
        calls |= group(w) if w.startswith("@") else {w}
    return calls

def cmd_filter(unit, *traces):
    """Every call in the strace -f files against the unit's filter and its argument rules."""
    svc = unit_service(unit)
    get = lambda key: [v for k, v in svc if k == key]
    on = lambda key: any(v.lower() in ("yes", "true", "1", "on", "strict", "invisible")
                         for v in get(key)[-1:])
    allow, allowed, denied = None, set(), set()
    for v in get("SystemCallFilter"):
        if not v:
            allow, allowed, denied = None, set(), set()
            continue
        inv = v.startswith("~")
        calls = names(v.lstrip("~").split())
        if allow is None:
            allow = not inv
            if allow:  # systemd.exec(5): these are always allowed
                allowed |= group("@default") | {"execve", "exit", "exit_group", "getrlimit",
                                                "rt_sigreturn", "sigreturn"}
        if allow:
            allowed = allowed - calls if inv else allowed | calls
        else:
            denied = denied | calls if inv else denied - calls
    implied = {"PrivateDevices": names(["@raw-io"]), "ProtectClock": names(["@clock"]),
               "ProtectKernelModules": names(["@module"]), "ProtectKernelLogs": {"syslog"},
               "ProtectHostname": {"sethostname", "setdomainname"}}
    extra = set().union(*[c for k, c in implied.items() if on(k)])

    used, refused = {}, []  # call -> count; (why, line)
    families = get("RestrictAddressFamilies")[-1:]
    fam_inv = bool(families) and families[0].startswith("~")
    fam = set(families[0].lstrip("~").split()) if families else None
    call_re = re.compile(r"^(\d+) +(?:<\.\.\. )?([a-z0-9_]+)(?:\(| resumed>)")
    for path in traces:
        for line in open(path, errors="replace"):
            if "runs in 32 bit mode" in line or "runs in x32 mode" in line:
                refused.append(("SystemCallArchitectures=native", line.strip()))
            m = call_re.match(line)
            if not m or "resumed>" in line[: m.end()]:
                continue
            call = m.group(2)
            used[call] = used.get(call, 0) + 1
            args = line[m.end():]
            if call in ("socket", "socketpair") and fam is not None:
                f = args.split(",")[0].strip()
                if (f in fam) == fam_inv:
                    refused.append(("RestrictAddressFamilies=", line.strip()))
            if on("MemoryDenyWriteExecute"):
                if call in ("mmap", "mmap2") and "PROT_EXEC" in args and "PROT_WRITE" in args:
                    refused.append(("MemoryDenyWriteExecute=", line.strip()))
                if call in ("mprotect", "pkey_mprotect") and "PROT_EXEC" in args:
                    refused.append(("MemoryDenyWriteExecute=", line.strip()))
                if call == "shmat" and "SHM_EXEC" in args:
                    refused.append(("MemoryDenyWriteExecute=", line.strip()))
            if on("RestrictRealtime") and call in ("sched_setscheduler", "sched_setattr") and \
                    re.search(r"SCHED_(FIFO|RR|DEADLINE)", args):
                refused.append(("RestrictRealtime=", line.strip()))
            if on("RestrictNamespaces") and call in ("clone", "clone3", "unshare", "setns") and \
                    "CLONE_NEW" in args:
                refused.append(("RestrictNamespaces=", line.strip()))
            if on("LockPersonality") and call == "personality" and \
                    not re.match(r"(0xffffffff|PER_LINUX\)|0\))", args):
                refused.append(("LockPersonality=", line.strip()))
            if on("RestrictSUIDSGID") and call in ("chmod", "fchmod", "fchmodat") and \
                    re.search(r", 0?[2467]\d{3}\b", args):
                refused.append(("RestrictSUIDSGID=", line.strip()))
    for call in sorted(used):
        ok = (call in allowed) if allow else (allow is None or call not in denied)
        if not ok or call in extra:
            why = "SystemCallFilter=" if not ok else "a call another setting denies"
            refused.append((why, f"{call} ({used[call]} calls)"))
    print(f"{len(used)} system calls used: {' '.join(sorted(used))}")
    if "clone3" in used and on("RestrictNamespaces"):
        print("note: RestrictNamespaces= makes clone3 fail with ENOSYS (its flags are out of "
              "seccomp's reach); glibc then uses clone, whose flags are checked above")
    for why, what in refused:
        print(f"denied by {why}: {what}")
    sys.exit(1 if refused else 0)

if __name__ == "__main__":
    {"exec": cmd_exec, "setting": cmd_setting, "listen": cmd_listen, "events": cmd_events,
     "filter": cmd_filter}[sys.argv[1]](*sys.argv[2:])
PYEOF
unit() { python3 "$WORK/unit.py" "$@"; }

# ---- 1. verify ----
mkdir -p "$WORK/units" "$WORK/etc/shardlm" "$WORK/root/etc"
UNIT=$WORK/units/shardlm@.service
# the unit as installed, but for where the binary is (verify checks that it is executable)
sed "s|/usr/bin/shardlm|$BIN|g" "$UNIT_SRC" >"$UNIT"
grep -q '^ExecStart=/usr/bin/shardlm ' "$UNIT_SRC" ||
    check unit-binary 0 "ExecStart= does not run /usr/bin/shardlm, where the install puts it"
# --man=no: Documentation='s man page is the package's (deploy/test_deb.sh checks it installed)
(cd "$WORK/units" && systemd-analyze verify --man=no "./shardlm@$INSTANCE.service") \
    >"$WORK/verify.out" 2>&1 || check verify 0 "systemd-analyze verify exited $?"
# verify also loads the units ours depends on; lines about those are the host's business
ours=$(grep -E "shardlm|$WORK" "$WORK/verify.out" || true)
others=$(grep -vE "shardlm|$WORK" "$WORK/verify.out" || true)
[ -z "$others" ] || printf 'note: verify on the host'"'"'s units:\n%s\n' "$others"
check verify "$([ -z "$ours" ] && echo 1 || echo 0)" \
    "systemd-analyze verify shardlm@$INSTANCE.service${ours:+: $ours}"
systemd-sysusers --root="$WORK/root" - <"$SYSUSERS" >"$WORK/sysusers.out" 2>&1 ||
    { cat "$WORK/sysusers.out"; check sysusers 0 "systemd-sysusers failed on $SYSUSERS"; }
user=$(unit setting "$UNIT" User)
group_=$(unit setting "$UNIT" Group)
check sysusers "$(grep -q "^$user:x:[0-9]*:[0-9]*:" "$WORK/root/etc/passwd" 2>/dev/null &&
    grep -q "^$group_:x:[0-9]*:" "$WORK/root/etc/group" 2>/dev/null && echo 1 || echo 0)" \
    "shardlm.sysusers creates User=$user and Group=$group_"
for kv in Type=notify NotifyAccess=main KillMode=mixed RemoveIPC=no; do
    v=$(unit setting "$UNIT" "${kv%%=*}")
    check "setting-${kv%%=*}" "$([ "$v" = "${kv#*=}" ] && echo 1 || echo 0)" "${kv%%=*}=$v"
done

# ---- 2. ExecStart= by hand ----
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
PORT=$(free_port)
CONF=$WORK/etc/shardlm/$INSTANCE.conf
{
    cat "$CONF_SRC"
    echo "# the test's own, after the example's (the last assignment wins)"
    echo "MODEL=$MODEL"
    echo "PORT=$PORT"
    echo "SHARDLM_RUNTIME_DIR=$RUNDIR"
} >"$CONF"
unit exec "$UNIT_SRC" "$INSTANCE" "$WORK/etc/shardlm" "$BIN" "$WORK/env.list" "$WORK/argv.list" ||
    { echo "FAIL exec: the unit's ExecStart= cannot be built"; exit 1; }
mapfile -d '' UNIT_ENV <"$WORK/env.list"
mapfile -d '' ARGV <"$WORK/argv.list"
echo "ExecStart= gives: ${ARGV[*]}"
HOST=127.0.0.1
for kv in "${UNIT_ENV[@]}"; do [ "${kv%%=*}" = HOST ] && HOST=${kv#*=}; done
URL=http://$HOST:$PORT
# what the manager adds (systemd.exec(5), "Environment Variables in Spawned Processes"); a
# sanitizer's options pass through
MANAGER_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    "USER=$user" "LOGNAME=$user" HOME=/nonexistent SHELL=/usr/sbin/nologin
    "INVOCATION_ID=$(python3 -c 'import secrets; print(secrets.token_hex(16))')")
for v in ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS TSAN_OPTIONS; do
    [ -n "${!v:-}" ] && MANAGER_ENV+=("$v=${!v}")
done

weights_re='^w-[0-9a-f]{16}-l[0-9]+-r[0-9]+of[0-9]+-n([0-9]+|x)\.weights$'
# serve_once NAME TRACE(0|1) [SOCKET]: one start, notifications, requests, SIGTERM, checks;
# NOTIFY_SOCKET a path, or SOCKET ('@NAME': abstract)
serve_once() {
    local name=$1 trace=$2 sock=${3:-$WORK/notify-$1.sock} events=$WORK/events-$1.jsonl
    local log=$WORK/server-$1.log main launcher before=$FAILS
    rm -f "$sock" "$events" "$events.up"
    python3 "$WORK/unit.py" listen "$sock" "$events" "$URL/health" 2>"$WORK/listener-$name.log" &
    LISTENER=$!
    for _ in $(seq 100); do [ -e "$events.up" ] && break; sleep 0.05; done
    local run=(env -i "${MANAGER_ENV[@]}" "NOTIFY_SOCKET=$sock" "${UNIT_ENV[@]}")
    if [ "$trace" = 1 ]; then
        # LeakSanitizer (an ASan build) stops the world with ptrace, which strace holds
        run+=("ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
        "${run[@]}" strace -f -qq -o "$WORK/trace-$name" -- "${ARGV[@]}" >"$log" 2>&1 &
        launcher=$!
        LAUNCHER=$launcher
        main=""
        # the child of strace that runs the server (strace forks probes of its own first)
        for _ in $(seq 200); do
            for p in $(pgrep -P "$launcher"); do
                [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$BIN" ] && main=$p
            done
            [ -n "$main" ] && break
            sleep 0.05
        done
        if [ -z "$main" ]; then
            check "$name-start" 0 "no $BIN under strace within 10 s: $(head -c 300 "$log")"
            kill -KILL "$launcher" 2>/dev/null || true
            kill "$LISTENER" 2>/dev/null || true
            LAUNCHER="" LISTENER=""
            return
        fi
    else
        "${run[@]}" "${ARGV[@]}" >"$log" 2>&1 &
        launcher=$!
        LAUNCHER=$launcher
        main=$launcher
    fi
    SRV=$main
    local ok=0
    for _ in $(seq 600); do
        grep -q 'READY=1' "$events" 2>/dev/null && { ok=1; break; }
        kill -0 "$launcher" 2>/dev/null || break
        sleep 0.05
    done
    check "$name-ready" $ok "READY=1 within 30 s (pid $main)"
    if [ $ok = 1 ]; then
        local body='{"prompt":"Once upon a time","max_tokens":12,"temperature":0}'
        local code
        code=$(curl -s -o "$WORK/completion-$name.json" -w '%{http_code}' -m 30 \
            -H 'Content-Type: application/json' -d "$body" "$URL/v1/completions" || true)
        ok=0
        [ "$code" = 200 ] && grep -q '"text"' "$WORK/completion-$name.json" && ok=1
        check "$name-completion" $ok \
            "POST /v1/completions: $code $(head -c 160 "$WORK/completion-$name.json" 2>/dev/null)"
        code=$(curl -s -o "$WORK/stream-$name.txt" -w '%{http_code}' -m 30 \
            -H 'Content-Type: application/json' \
            -d '{"prompt":"One day","max_tokens":8,"stream":true}' "$URL/v1/completions" || true)
        ok=0
        [ "$code" = 200 ] && grep -q '^data: \[DONE\]' "$WORK/stream-$name.txt" && ok=1
        check "$name-stream" $ok "a streamed completion: $code"
        curl -s -m 10 "$URL/metrics" >/dev/null || true
    fi
    local workers
    workers=$(pgrep -P "$main" | tr '\n' ' ')
    kill -TERM "$main" 2>/dev/null || true # the main process alone, as KillMode=mixed does
    local rc=0 gone=0
    for _ in $(seq 400); do
        kill -0 "$launcher" 2>/dev/null || { gone=1; break; }
        sleep 0.05
    done
    if [ $gone = 1 ]; then wait "$launcher" || rc=$?; else rc=timeout; fi
    check "$name-exit" "$([ "$rc" = 0 ] && echo 1 || echo 0)" \
        "exit status after SIGTERM: $rc (within 20 s)"
    local left=""
    for w in $workers; do kill -0 "$w" 2>/dev/null && left+="$w "; done
    check "$name-workers" "$([ -n "$workers" ] && [ -z "$left" ] && echo 1 || echo 0)" \
        "workers ${workers:-(none seen)}gone${left:+; still alive: $left}"
    local stray
    stray=$(find "$RUNDIR" -mindepth 1 -printf '%f\n' | grep -vE "$weights_re" || true)
    check "$name-runtime-dir" "$([ -z "$stray" ] && echo 1 || echo 0)" \
        "runtime directory: $(find "$RUNDIR" -mindepth 1 -printf '%f ' | head -c 300)"
    kill "$LISTENER" 2>/dev/null || true
    wait "$LISTENER" 2>/dev/null || true
    LISTENER=""
    if [ $gone = 0 ]; then # still there after 20 s: the next run must not meet it
        kill_server "$main"
        kill -KILL "$launcher" 2>/dev/null || true
        wait "$launcher" 2>/dev/null || true
    fi
    SRV=""
    LAUNCHER=""
    { unit events "$events" "$main" || true; } | sed "s/^\(PASS\|FAIL\) /\1 $name-/" |
        tee "$WORK/events-$name.out"
    if grep -q '^FAIL' "$WORK/events-$name.out"; then FAILS=$((FAILS + 1)); fi
    [ "$FAILS" = "$before" ] || { echo "--- server log ($name)"; cat "$log"; }
}

serve_once cold 0
find "$RUNDIR" -mindepth 1 -printf "%f\n" | grep -qE "$weights_re" ||
    check persist 0 "no weights segment left for the next start"
serve_once warm 1 "@shardlm-systemd-test-$$"
find "$RUNDIR" -mindepth 1 -delete # a cold start again, traced: the load through io_uring
serve_once cold-traced 1

# ---- 3. the system call filter ----
if unit filter "$UNIT_SRC" "$WORK/trace-warm" "$WORK/trace-cold-traced" >"$WORK/filter.out"; then
    cat "$WORK/filter.out"
    check syscall-filter 1 "every system call of coordinator and workers is allowed"
else
    cat "$WORK/filter.out"
    check syscall-filter 0 "systemd would refuse the calls above"
fi

# ---- 4. the exposure score ----
(cd "$WORK/units" && systemd-analyze security --offline=true --no-pager \
    "./shardlm@$INSTANCE.service") >"$WORK/security.out" 2>&1 || true
cat "$WORK/security.out"
score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$WORK/security.out")
ok=0
[ -n "$score" ] && python3 -c "import sys; sys.exit($score > $EXPOSURE_MAX)" && ok=1
check security $ok "systemd-analyze security: exposure ${score:-unknown}, at most $EXPOSURE_MAX"

if [ "$FAILS" -gt 0 ]; then
    echo "test_systemd: $FAILS check(s) failed"
    exit 1
fi
echo "test_systemd: all checks passed"
