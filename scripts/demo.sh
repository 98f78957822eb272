#!/usr/bin/env bash
# The quickstart: a small fair comparison of federated AUC maximisation against averaging.
# CODASCA vs CODA+ vs FedAvg on Fashion-MNIST binarised to 10% positives and split over 8 clients
# by a Dirichlet(0.3) label skew: each method's step size tuned with 4 Optuna trials on the
# validation split, then 2 seeds each (a few minutes on 2 cores once set up). Ends with the results
# table (test AUROC, mean ± std over seeds, with the tuned values) and comparison plots under
# runs/quickstart/. Finished studies and runs are reused when the demo is run again; delete
# runs/quickstart to start afresh. See docs/comparing-methods.md for the protocol.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
args=()
if ! ls /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte* >/dev/null 2>&1; then
  echo "note: Fashion-MNIST is not installed (Debian package dataset-fashion-mnist; scripts/setup.sh installs it" \
       "when run as root), so the demo runs on scikit-learn's digits instead." >&2
  args=(--set data.dataset=digits --out runs/quickstart-digits)
fi
.venv/bin/fedrisk sweep configs/quickstart.toml --tune 4 "${args[@]}" "$@"
