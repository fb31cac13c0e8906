#!/usr/bin/env bash
# Installs what ddpbench needs and builds it. Idempotent: when everything is
# present it only checks, and returns in seconds. Source it (it exports
# DDPBENCH_BIN, LIBTORCH, LD_LIBRARY_PATH) or run it. It sets no shell options
# in the caller: every step checks its own result.
#
# Respects what a user already has:
#   LIBTORCH=<dir>   an existing libtorch (or PyTorch's torch/ folder) to build against
#   mpirun on PATH   an existing MPI (Debian's Open MPI is installed only if absent)
#   DDPBENCH_HOME    where the PyTorch venv lives (default ~/.cache/ddpbench), outside the clone
#
# `source job-scripts/setup.sh --env` installs and builds nothing: it exports the
# environment of an existing build (a login node without cargo or apt, a second shell),
# and says what is missing instead of installing it.

ddpbench_setup() {
  local here torch_version=2.11.0 need=() p sudo="" venv py env_only=0
  [ "${1:-}" = --env ] && env_only=1
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd) || return 1
  DDPBENCH_HOME=${DDPBENCH_HOME:-$HOME/.cache/ddpbench}
  say() { printf '[setup] %s\n' "$*" >&2; }

  # 1. System packages (Debian/Ubuntu), each checked before apt runs.
  have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
  if ! command -v mpirun >/dev/null 2>&1 || ! command -v mpicc >/dev/null 2>&1; then
    need+=(libopenmpi-dev openmpi-bin)
  fi
  for p in libhwloc-dev libjpeg-dev pkg-config libclang-dev dataset-fashion-mnist fonts-dejavu-core python3-venv; do
    have_pkg "$p" || need+=("$p")
  done
  if ((${#need[@]})) && [ "$env_only" = 1 ]; then
    say "missing: ${need[*]} (--env installs nothing: run job-scripts/setup.sh without it to install them)"
  elif ((${#need[@]})); then
    if ! command -v apt-get >/dev/null 2>&1; then
      say "missing: ${need[*]}, and no apt-get here: install them with your package manager"; return 1
    fi
    [ "$(id -u)" = 0 ] || sudo="sudo"
    say "installing ${need[*]}"
    $sudo apt-get update -qq || { say "apt-get update failed"; return 1; }
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null \
      || { say "apt-get install ${need[*]} failed"; return 1; }
  fi

  # 2. libtorch: a user's LIBTORCH wins; else PyTorch $torch_version in a venv outside the clone.
  if [ -z "${LIBTORCH:-}" ]; then
    venv=$DDPBENCH_HOME/venv
    py=$venv/bin/python
    if [ "$env_only" = 1 ] && ! [ -x "$py" ]; then
      say "no PyTorch venv at $venv and --env installs nothing: set LIBTORCH, or run job-scripts/setup.sh once"; return 1
    fi
    if [ "$env_only" = 0 ] && ! "$py" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$torch_version' else 1)" 2>/dev/null; then
      say "creating $venv with torch==$torch_version (about 2.7 GB download, once)"
      mkdir -p "$DDPBENCH_HOME" && python3 -m venv "$venv" \
        && "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch_version" numpy \
        || { say "could not install torch==$torch_version into $venv"; return 1; }
    fi
    LIBTORCH=$("$py" -c 'import torch,os; print(os.path.dirname(torch.__file__))') || return 1
    export DDPBENCH_PYTHON=$py
  fi
  export LIBTORCH
  case ":${LD_LIBRARY_PATH:-}:" in
    *":$LIBTORCH/lib:"*) ;;
    *) export LD_LIBRARY_PATH=$LIBTORCH/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;;
  esac

  # NCCL: the torch wheel ships nvidia/nccl/lib/libnccl.so.2, but the loader ddpbench uses
  # (cudarc) opens libnccl.so; link one under $DDPBENCH_HOME/lib and put it on the path.
  local nccl2
  nccl2=$(cd "$LIBTORCH/../nvidia/nccl/lib" 2>/dev/null && pwd)/libnccl.so.2
  if [ -f "$nccl2" ]; then
    mkdir -p "$DDPBENCH_HOME/lib" && ln -sfn "$nccl2" "$DDPBENCH_HOME/lib/libnccl.so"
    case ":${LD_LIBRARY_PATH:-}:" in
      *":$DDPBENCH_HOME/lib:"*) ;;
      *) export LD_LIBRARY_PATH=$DDPBENCH_HOME/lib:$LD_LIBRARY_PATH ;;
    esac
  fi

  # 3. Open MPI as root (containers, CI) needs explicit consent.
  if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  fi

  # 4. Build: one profile (release) for the binary and the tests, so torch-sys' C++ shim builds once.
  if [ "$env_only" = 1 ]; then
    if ! [ -x "$here/target/release/ddpbench" ]; then
      say "no build at $here/target/release/ddpbench and --env builds nothing: run job-scripts/setup.sh once"; return 1
    fi
    export DDPBENCH_BIN=$here/target/release/ddpbench
    say "environment of the existing build: $DDPBENCH_BIN (libtorch: $LIBTORCH)"
    return 0
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    say "cargo not found: install Rust (https://rustup.rs) and run again"; return 1
  fi
  (cd "$here" && cargo build --release --locked --quiet) || { say "cargo build failed (see above)"; return 1; }
  export DDPBENCH_BIN=$here/target/release/ddpbench
  say "ready: $DDPBENCH_BIN (libtorch: $LIBTORCH)"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  ddpbench_setup "$@" || exit 1
else
  ddpbench_setup "$@" || return 1
fi
