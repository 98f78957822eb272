"""The counter-based client generator: exact bits, block = per-client, distributions, errors."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from fedrisk.algorithms.local import sample_batch, sample_batches
from fedrisk.errors import FedriskError
from fedrisk.rng import ClientRNG, client_generator, derive_seed, mix64

MASK = (1 << 64) - 1


def ref_mix64(z: int) -> int:
    """SplitMix64's output function on Python ints (the published constants)."""
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def ref_words(seed: int, rnd: int, client: int, call: int, n: int) -> list[int]:
    """The documented word formula, on Python ints."""
    base = derive_seed(seed, rnd, "clients", "update")
    key = ref_mix64((base + 0x9E3779B97F4A7C15 * (client + 1)) & MASK)
    sub = ref_mix64((key + 0xD1B54A32D192ED03 * call) & MASK)
    return [ref_mix64((sub + 0x9E3779B97F4A7C15 * (j + 1)) & MASK) for j in range(n)]


def test_mix64_matches_python_reference_and_splitmix64() -> None:
    z = np.random.default_rng(0).integers(0, 2**63, 2000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    assert [int(v) for v in mix64(z)] == [ref_mix64(int(v)) for v in z]
    # SplitMix64 with state 0: the first output is mix64(GOLDEN) = 0xE220A8397B1DCDAF (published)
    assert int(mix64(np.array([0x9E3779B97F4A7C15], dtype=np.uint64))[0]) == 0xE220A8397B1DCDAF


def test_words_follow_the_documented_formula() -> None:
    rng = client_generator(3, 5, 11)
    first = rng.bits(np.arange(7, dtype=np.uint64))
    second = rng.bits(np.arange(4, dtype=np.uint64))
    assert [int(w) for w in first] == ref_words(3, 5, 11, 1, 7)
    assert [int(w) for w in second] == ref_words(3, 5, 11, 2, 4)
    block = client_generator(3, 5, [2, 11]).bits(np.arange(7, dtype=np.uint64))
    assert [int(w) for w in block[1]] == ref_words(3, 5, 11, 1, 7)


def test_integers_pinned_values() -> None:
    """Pins the streams: a change here changes every run's minibatches."""
    assert client_generator(0, 3, 7).integers(100, (4,)).tolist() == [51, 89, 86, 7]
    assert client_generator(0, 0, 0).integers(10, (2, 3)).tolist() == [[8, 7, 5], [2, 2, 8]]


def draw_all(rng: ClientRNG, sizes: torch.Tensor | int) -> list[torch.Tensor]:
    """Every distribution, in a fixed order of calls."""
    return [
        rng.integers(sizes, (3, 5)),
        rng.uniform((4,), dtype=torch.float64),
        rng.normal((2, 3), dtype=torch.float64),
        rng.bernoulli(0.3, (6,)),
        rng.permutations(sizes, 17),
        sample_batches(rng, sizes, 2, 4, "shuffle"),
        sample_batch(rng, sizes, 5),
    ]


@pytest.mark.parametrize("clients", [[0], [4, 1, 9], list(range(12))])
def test_block_rows_equal_single_client_draws(clients: list[int]) -> None:
    sizes = torch.tensor([1 + (7 * k) % 13 for k in clients])
    block = draw_all(client_generator(5, 2, clients), sizes)
    for i, k in enumerate(clients):
        own = draw_all(client_generator(5, 2, k), int(sizes[i]))
        for b, o in zip(block, own):
            assert b.shape == (len(clients), *o.shape)
            assert b.dtype == o.dtype and torch.equal(b[i], o)
    indexed = client_generator(5, 2, clients)[len(clients) - 1]
    assert torch.equal(indexed.integers(5, (3,)), client_generator(5, 2, clients[-1]).integers(5, (3,)))


def test_streams_differ_across_clients_rounds_seeds_calls_and_streams() -> None:
    def ints(rng: ClientRNG) -> list[int]:
        return rng.integers(2**30, (8,)).tolist()

    base = ints(client_generator(0, 0, 0))
    others = [
        ints(client_generator(0, 0, 1)),
        ints(client_generator(0, 1, 0)),
        ints(client_generator(1, 0, 0)),
        ints(client_generator(0, 0, 0, stream="other")),
    ]
    rng = client_generator(0, 0, 0)
    rng.integers(2, (1,))
    others.append(ints(rng))  # the second call of the same generator
    assert all(o != base for o in others)
    assert len({tuple(o) for o in others}) == len(others)


def test_distributions() -> None:
    rng = client_generator(0, 0, list(range(50)))
    x = rng.integers(7, (2000,))
    counts = torch.bincount(x.flatten(), minlength=7).double()
    expected = x.numel() / 7
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 30  # 6 degrees of freedom: P(chi2 > 30) < 1e-4
    u = rng.uniform((4000,), dtype=torch.float64)
    assert float(u.min()) >= 0 and float(u.max()) < 1
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.var()) - 1 / 12) < 0.002
    z = rng.normal((4000,), dtype=torch.float64)
    assert abs(float(z.mean())) < 0.01 and abs(float(z.std()) - 1) < 0.01
    assert abs(float(((z - z.mean()) ** 3).mean())) < 0.05 and abs(float((z**4).mean()) - 3) < 0.1
    b = rng.bernoulli(0.2, (4000,)).double()
    assert abs(float(b.mean()) - 0.2) < 0.01
    # consecutive draws are uncorrelated
    w = rng.uniform((2, 4000), dtype=torch.float64)
    assert abs(float(torch.corrcoef(torch.stack([w[:, 0].flatten(), w[:, 1].flatten()]))[0, 1])) < 0.02


def test_permutations_are_epochs_of_permutations() -> None:
    perm = client_generator(1, 2, [0, 1, 2]).permutations(torch.tensor([5, 3, 8]), 16)
    for row, n in zip(perm.tolist(), [5, 3, 8]):
        full, rest = divmod(16, n)
        for e in range(full):
            assert sorted(row[e * n : (e + 1) * n]) == list(range(n))
        assert len(set(row[full * n :])) == rest and all(0 <= v < n for v in row)
    # every ordering of 3 items appears, about equally often
    orders = client_generator(0, 0, list(range(3000))).permutations(3, 3)
    _, counts = torch.unique(orders, dim=0, return_counts=True)
    assert len(counts) == 6 and int(counts.min()) > 400


def test_permutations_of_mixed_sizes_are_chunked_without_changing_results(monkeypatch) -> None:
    """A block mixing 1-row and 5000-row clients is sorted in size-ordered chunks (bounded
    memory); every chunking gives each client its own draw."""
    from fedrisk import rng as rng_module

    sizes = torch.tensor([5000, 1, 3, 5000, 2, 40])
    clients = list(range(len(sizes)))
    whole = client_generator(4, 1, clients).permutations(sizes, 24)
    for budget in (1, 100, 30_000):
        monkeypatch.setattr(rng_module, "PERMUTATION_ELEMENTS", budget)
        assert torch.equal(client_generator(4, 1, clients).permutations(sizes, 24), whole)
    monkeypatch.undo()
    for i, k in enumerate(clients):
        assert torch.equal(whole[i], client_generator(4, 1, k).permutations(int(sizes[i]), 24))


def test_integers_with_per_client_bounds() -> None:
    x = client_generator(0, 0, [0, 1, 2]).integers(torch.tensor([1, 2, 2**31 - 1]), (500,))
    assert int(x[0].max()) == 0 and set(x[1].tolist()) == {0, 1} and int(x[2].max()) > 2**30


def test_no_numpy_overflow_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rng = client_generator(2**62, 10**6, 2**40)
        for _ in range(3):
            draw_all(rng, 9)
        draw_all(client_generator(2**62, 10**6, [0, 2**40]), torch.tensor([9, 2]))


def test_torch_generator_escape_hatch() -> None:
    g1, g2 = client_generator(0, 1, 2).torch_generator(), client_generator(0, 1, 2).torch_generator()
    assert torch.equal(torch.randn(3, generator=g1), torch.randn(3, generator=g2))
    with pytest.raises(TypeError, match="one client"):
        client_generator(0, 1, [2, 3]).torch_generator()


def test_bad_input() -> None:
    rng = client_generator(0, 0, [0, 1])
    with pytest.raises(ValueError, match=r"high must be in \[1, 2\*\*31\)"):
        rng.integers(torch.tensor([3, 0]), (2,))
    with pytest.raises(ValueError, match="must be one int or have shape"):
        rng.integers(torch.tensor([3, 4, 5]), (2,))
    with pytest.raises(ValueError, match="must be integers"):
        rng.integers(2.5, (2,))
    with pytest.raises(ValueError, match="p must be in"):
        rng.bernoulli(1.5, (2,))
    with pytest.raises(ValueError, match="1-D sequence of ints"):
        client_generator(0, 0, [[0, 1]])
    with pytest.raises(FedriskError, match="no samples"):
        sample_batches(rng, torch.tensor([3, 0]), 1, 2)
    with pytest.raises(FedriskError, match="no samples"):
        sample_batches(client_generator(0, 0, 0), 0, 1, 2)
    with pytest.raises(TypeError):
        client_generator(0, 0, 3)[0]


def test_large_block_of_minibatches() -> None:
    """W2's round: 1000 clients x 5 steps x 16 rows below 32, uniform."""
    rng = client_generator(0, 0, list(range(1000)))
    out = sample_batches(rng, torch.full((1000,), 32), 5, 16)
    assert out.shape == (1000, 5, 16) and math.isclose(float(out.double().mean()), 15.5, rel_tol=0.02)
