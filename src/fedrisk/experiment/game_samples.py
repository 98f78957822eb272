"""What the generator of a network min-max game produces, over the rounds of a config run
(issue 30): at every evaluation the samples of the game's ``samples`` hook (the GAN: 500 points
``G(z)`` from fixed noise) are saved to ``DIR/samples/round_<r>.pt``, and at the end (with
``output.plots``) ``DIR/plots/samples_over_rounds.png`` shows up to six evaluations beside the
real data.  Files, not memory: a resumed run plots the rounds from before its interruption too.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> d = Path(tempfile.mkdtemp())
    >>> for r in (0, 10):
    ...     _ = save_samples(d, r, torch.randn(20, 2))
    >>> plot_samples(d, torch.randn(50, 2)).name
    'samples_over_rounds.png'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from fedrisk.api import Callback, History
from fedrisk.experiment.outputs import atomic_torch_save
from fedrisk.runtime.simulation import Simulation

__all__ = ["GameSamples", "game_callbacks", "plot_samples", "save_samples"]

SAMPLES_DIR = "samples"
PLOT_NAME = "samples_over_rounds.png"


def save_samples(run_dir: Path, round: int, samples: Tensor) -> Path:
    """``run_dir/samples/round_<round>.pt`` (float32, CPU)."""
    path = Path(run_dir) / SAMPLES_DIR / f"round_{round:06d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save(samples.detach().to("cpu", torch.float32), path)
    return path


def plot_samples(run_dir: Path, real: Tensor | None = None, panels: int = 6) -> Path | None:
    """Up to ``panels`` saved evaluations (the first, the last, evenly spaced between) as 2-D
    scatter plots over ``real`` points; ``run_dir/plots/samples_over_rounds.png`` (None when no
    samples were saved or they are not 2-D)."""
    files = sorted((Path(run_dir) / SAMPLES_DIR).glob("round_*.pt"))
    if not files:
        return None
    if len(files) > panels:
        pick = sorted({round(i * (len(files) - 1) / (panels - 1)) for i in range(panels)})
        files = [files[i] for i in pick]
    loaded = [(int(f.stem.split("_")[1]), torch.load(f, weights_only=True)) for f in files]
    if any(s.dim() != 2 or s.shape[1] != 2 for _, s in loaded):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(loaded), figsize=(2.6 * len(loaded), 2.8), squeeze=False)
    lim = max(float(s.abs().max()) for _, s in loaded)
    if real is not None and len(real):
        lim = max(lim, float(real.abs().max()))
    lim = min(lim * 1.1, 10.0)
    for ax, (r, s) in zip(axes[0], loaded):
        if real is not None and len(real):
            ax.scatter(real[:, 0], real[:, 1], s=2, c="0.75", label="real")
        ax.scatter(s[:, 0], s[:, 1], s=2, c="tab:blue", label="generated")
        ax.set_title(f"round {r}", fontsize=9)
        ax.set_xlim(-lim, lim)
        ax.set_ylim(-lim, lim)
        ax.set_aspect("equal")
        ax.tick_params(labelsize=6)
    fig.tight_layout()
    out = Path(run_dir) / "plots" / PLOT_NAME
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


class GameSamples(Callback):
    """Save the game's samples at every evaluation; plot them at the end (module docstring)."""

    def __init__(self, run_dir: Path, game: Any, plots: bool) -> None:
        self.run_dir, self.game, self.plots = Path(run_dir), game, plots

    def on_evaluation(self, sim: Simulation, record: dict[str, Any]) -> None:
        x = sim.algorithm.global_params(sim.server_state)
        save_samples(self.run_dir, sim.round, self.game.samples(x, sim.algorithm))

    def on_end(self, sim: Simulation, history: History) -> None:
        if self.plots:
            test = sim.federation.test
            real = test.x.reshape(len(test), -1) if test is not None and len(test) else None
            plot_samples(self.run_dir, real)


def game_callbacks(sim: Simulation, run_dir: Path, plots: bool) -> list[Callback]:
    """``[GameSamples]`` when the run's algorithm plays a network game with a ``samples`` hook."""
    game = getattr(sim.algorithm, "game_spec", None)
    return [GameSamples(run_dir, game, plots)] if game is not None and game.samples is not None else []
