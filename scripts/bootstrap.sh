#!/usr/bin/env bash
# Idempotent machine set-up for Corral on Debian/Ubuntu, run as root.
#
# Installs what is missing from Debian's packages, registers the gVisor runtimes with dockerd, starts dockerd when it
# is not answering, creates .venv, and builds the base image corral/workspace:base when it is missing or stale.
# Every step checks before it acts, so a second run takes seconds.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
cd "$here"
log() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }
die() { printf '[bootstrap] error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root: it installs packages and starts dockerd"
command -v apt-get >/dev/null || die "needs a Debian or Ubuntu machine (apt-get not found)"

# --- 1. Debian packages -------------------------------------------------------------------------------------------
packages=(docker.io mmdebstrap iptables iproute2 e2fsprogs git ca-certificates gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then missing+=(python3-venv); fi
# node and npm run the E2B JavaScript SDK's e2e test; a node already installed (e.g. NodeSource's) is kept.
if ! command -v npm >/dev/null; then missing+=(nodejs npm); fi
# Headless Chromium drives the web console's and /docs' e2e tests (through Playwright, which downloads no browser).
if ! command -v chromium >/dev/null; then missing+=(chromium); fi
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 1b. gVisor from bookworm-backports (pinned) --------------------------------------------------------------------
# bookworm's own runsc (20221219) fails the second checkpoint/restore cycle ("id already in use"), so pause with memory
# needs the backports release. Pinned: a newer gVisor changes behaviour we test for (see the README's gVisor notes).
RUNSC_VERSION=0.0~20240729.0-4~bpo12+2
if [ "$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)" != "$RUNSC_VERSION" ]; then
    if ! apt-cache madison runsc 2>/dev/null | grep -qF "$RUNSC_VERSION"; then
        if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
            . /etc/os-release
            [ "${VERSION_CODENAME:-}" = bookworm ] || die "runsc $RUNSC_VERSION comes from Debian bookworm-backports; \
this is ${PRETTY_NAME:-an unknown system}. Install that runsc release by hand, or run on Debian 12."
            # The mirror that serves bookworm itself (deb822 stanzas or one-line entries).
            mirror=$(python3 - <<'PY'
import glob, re
for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*"))]:
    try:
        text = open(path).read()
    except OSError:
        continue
    for stanza in re.split(r"\n\s*\n", text):
        fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.+)$", stanza, re.M))
        if "bookworm" in fields.get("Suites", "").split():
            print(fields["URIs"].split()[0]); raise SystemExit
    for m in re.finditer(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+bookworm\s", text, re.M):
        print(m.group(1)); raise SystemExit
PY
)
            log "adding bookworm-backports (${mirror:-http://deb.debian.org/debian}) to apt's sources"
            printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: %s\n' \
                "${mirror:-http://deb.debian.org/debian}" /usr/share/keyrings/debian-archive-keyring.gpg \
                > /etc/apt/sources.list.d/corral-bookworm-backports.sources
        fi
        apt-get update -qq
    fi
    log "installing runsc $RUNSC_VERSION from bookworm-backports"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends --allow-downgrades \
        "runsc=$RUNSC_VERSION" >/dev/null
fi

# --- 2. gVisor runtimes in /etc/docker/daemon.json ----------------------------------------------------------------
# Two entries because on kernels like this one runsc cannot join Docker's bridge network ("cannot run with network
# enabled in root network namespace"): `runsc` has no network at all (isolated workspaces), `runsc-net` uses
# --network=host, which inside Docker's per-container network namespace gives the sandbox its own eth0.
runsc_path=$(command -v runsc)
mkdir -p /etc/docker
changed=$(python3 - "$runsc_path" <<'PY'
import json, pathlib, sys
path = pathlib.Path("/etc/docker/daemon.json")
cfg = json.loads(path.read_text()) if path.exists() and path.read_text().strip() else {}
# ptrace: this runsc's default platform (systrap) spawns processes 2.6x slower on these hosts. overlay2=none: the
# container's own writable layer keeps root filesystem writes (runsc's default keeps them in sandbox memory, so a stop
# would lose /etc and /usr edits, and `docker commit` would copy a 1 GiB filestore).
flags = ["--platform=ptrace", "--overlay2=none"]
want = {
    "runsc": {"path": sys.argv[1], "runtimeArgs": ["--network=none", *flags]},
    "runsc-net": {"path": sys.argv[1], "runtimeArgs": ["--network=host", *flags]},
}
runtimes = cfg.setdefault("runtimes", {})
if all(runtimes.get(k) == v for k, v in want.items()) and cfg.get("experimental") is True:
    print("no")
else:
    # experimental: Docker 20.10's checkpoint API (pause with memory, snapshots, forks). Needs a restart, not a HUP.
    print("restart" if cfg.get("experimental") is not True else "yes")
    runtimes.update(want)
    cfg["experimental"] = True
    path.write_text(json.dumps(cfg, indent=2) + "\n")
PY
)

# --- 3. dockerd ---------------------------------------------------------------------------------------------------
docker_ok() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }
if docker_ok && [ "$changed" = restart ]; then
    log "restarting dockerd to enable its experimental (checkpoint) API; running containers stop"
    pkill -x dockerd || true
    for _ in $(seq 1 60); do pgrep -x dockerd >/dev/null || break; sleep 0.5; done
fi
if docker_ok; then
    if [ "$changed" = yes ]; then
        log "reloading dockerd to pick up the gVisor runtimes"
        pkill -HUP -x dockerd || true
        sleep 1
    fi
else
    log "starting dockerd (log: /var/log/corral-dockerd.log)"
    # setsid: dockerd must outlive this script and the make process that ran it.
    setsid nohup dockerd >/var/log/corral-dockerd.log 2>&1 < /dev/null &
    for _ in $(seq 1 120); do docker_ok && break; sleep 0.5; done
    docker_ok || die "dockerd did not answer within 60 s; see /var/log/corral-dockerd.log"
fi
docker info --format '{{json .Runtimes}}' | grep -q '"runsc"' || die "dockerd does not list the runsc runtime"
[ "$(docker version --format '{{.Server.Experimental}}')" = true ] || die "dockerd's experimental mode is off; \
restart dockerd (checkpoints need it)"

# --- 4. virtualenv ------------------------------------------------------------------------------------------------
stamp=.venv/.corral-installed
want_stamp=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    python3 -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want_stamp" ]; then
    log "installing corral and its dependencies into .venv"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[dev]'
    echo "$want_stamp" > "$stamp"
fi

# --- 4b. the E2B JavaScript SDK for tests/e2e/test_e2b_js_sdk.py ---------------------------------------------------
# `npm ci` installs exactly the lock file, so tests fetch nothing; it runs again only when the lock file changes.
js=tests/e2e/js
js_stamp=$js/node_modules/.corral-installed
want_js_stamp=$(sha256sum "$js/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$js_stamp" 2>/dev/null)" != "$want_js_stamp" ]; then
    log "installing the E2B JavaScript SDK into $js/node_modules (npm ci)"
    (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
    echo "$want_js_stamp" > "$js_stamp"
fi

# --- 4c. browser assets the server serves itself (web console terminal, offline /docs) ----------------------------
# xterm.js and Swagger UI come from the npm registry here, at set-up, pinned by web/package-lock.json; the server never
# fetches anything at run time. --ignore-scripts: these are static files, and no install script may phone home.
web=web
web_stamp=$web/node_modules/.corral-installed
want_web_stamp=$(sha256sum "$web/package-lock.json" | cut -d' ' -f1)
if [ "$(cat "$web_stamp" 2>/dev/null)" != "$want_web_stamp" ]; then
    log "installing the web console's and /docs' browser assets into $web/node_modules (npm ci)"
    (cd "$web" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    echo "$want_web_stamp" > "$web_stamp"
fi

# --- 5. base image ------------------------------------------------------------------------------------------------
.venv/bin/corral image build --if-missing
log "ready"
