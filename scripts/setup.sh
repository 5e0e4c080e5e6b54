#!/usr/bin/env bash
# Installs the system packages the build needs, when they are missing.
# Sourced by the other scripts; safe to run again.
set -euo pipefail

need=()
# bindgen (librocksdb-sys) needs libclang; cc needs a C++ compiler.
if ! compgen -G "/usr/lib/llvm-*/lib/libclang.so*" >/dev/null && ! compgen -G "/usr/lib/*/libclang-[0-9]*.so*" >/dev/null; then
    need+=(libclang-dev)
fi
command -v c++ >/dev/null || need+=(g++)
# The preload library's tests run Debian's fio.
command -v fio >/dev/null || need+=(fio)
# kv-remote generates its gRPC code from a .proto file with protoc.
if [ -z "${PROTOC:-}" ] && ! command -v protoc >/dev/null; then
    need+=(protobuf-compiler)
fi
# The monitoring test runs a real Prometheus and lints with promtool.
command -v promtool >/dev/null && command -v prometheus >/dev/null || need+=(prometheus)
# The fleet-in-etcd tests start their own etcd server.
command -v etcd >/dev/null || need+=(etcd-server)
if ((${#need[@]})); then
    echo "setup: installing ${need[*]}" >&2
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null || { echo "setup: cargo is not installed" >&2; exit 1; }
