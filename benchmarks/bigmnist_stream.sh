#!/usr/bin/env bash
# bigMNIST: generation throughput (and the projection for seed 000's full 72M set),
# then streaming read from page cache: ddpbench's reader vs a PyTorch DataLoader over
# the same files with the same number of workers (1).
#   benchmarks/bigmnist_stream.sh [COPIES=5]      # 60,000 × 6 × COPIES samples
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/job-scripts/setup.sh" || exit 1
copies=${1:-5}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
(cd "$here" && cargo build --release --quiet --example stream_read)
"$DDPBENCH_BIN" gen-bigmnist --from /usr/share/datasets/fashion-mnist --augment 6 --copies "$copies" --out "$work/set" 2>&1 | tail -1
cat "$work"/set/shard-*.bin > /dev/null   # page cache warm for both readers
"$here/target/release/examples/stream_read" "$work/set" 64
"$DDPBENCH_PYTHON" "$here/benchmarks/pytorch_bigmnist_loader.py" "$work/set" --workers 1 --batch-size 64
