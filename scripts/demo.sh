#!/usr/bin/env bash
# The quickstart: FedAvg vs SCAFFOLD on Fashion-MNIST split over 20 clients by a Dirichlet(0.1)
# label skew, 2 seeds each, 2 runs at a time (well under a minute on 2 cores once set up). Ends with the
# results table (mean ± std over seeds) and comparison plots under runs/quickstart/.
# Finished runs are reused when the demo is run again; delete runs/quickstart to start afresh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=()
if ! ls /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte* >/dev/null 2>&1; then
  echo "note: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it" \
       "when run as root), so the demo runs on scikit-learn's digits instead." >&2
  args=(--set data.dataset=digits --out runs/quickstart-digits)
fi
.venv/bin/fedrisk sweep configs/quickstart.toml "${args[@]}" "$@"
