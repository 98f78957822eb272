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


def ref_partial_epoch(seed: int, rnd: int, client: int, n: int, m: int) -> list[int]:
    """The documented partial-epoch formula on Python ints: the first ``m`` distinct values of
    Lemire's multiply-shift of the words ``mix64(sub + GOLDEN * (2**62 + k + 1))``, k = 0, 1, ..."""
    base = derive_seed(seed, rnd, "clients", "update")
    key = ref_mix64((base + 0x9E3779B97F4A7C15 * (client + 1)) & MASK)
    sub = ref_mix64((key + 0xD1B54A32D192ED03 * 1) & MASK)
    out: list[int] = []
    k = 0
    while len(out) < m:
        v = ((ref_mix64((sub + 0x9E3779B97F4A7C15 * ((1 << 62) + k + 1)) & MASK) >> 32) * n) >> 32
        if v not in out:
            out.append(v)
        k += 1
    return out


@pytest.mark.parametrize(("n", "total"), [(33333, 32), (101, 50), (7, 3), (2**32 - 1, 5)])
def test_partial_epoch_follows_the_documented_formula(n: int, total: int) -> None:
    expected = ref_partial_epoch(2, 9, 4, n, total)
    assert client_generator(2, 9, 4).permutations(n, total).tolist() == expected
    assert client_generator(2, 9, [3, 4]).permutations(torch.tensor([n, n]), total)[1].tolist() == expected


def test_permutations_pinned_values() -> None:
    """Pins the shuffle streams: a change here changes every ``sampling = "shuffle"`` run."""
    assert client_generator(0, 3, 7).permutations(33333, 5).tolist() == PINNED_LARGE
    assert client_generator(0, 3, 7).permutations(4, 6).tolist() == PINNED_SMALL


PINNED_LARGE = [18823, 18867, 6946, 15225, 12138]  # the distinct-draws path
PINNED_SMALL = [3, 0, 2, 1, 0, 3]  # one sorted epoch + the first 2 of the next (as before)


def test_shuffle_draw_cost_does_not_grow_with_the_client_size(monkeypatch) -> None:
    """A batch of 32 from a client of any size computes O(32) random words and sorts no
    permutation of the client's rows (one client and a block alike)."""
    from fedrisk import rng as rng_module

    sizes: list[int] = []

    def counting_mix64(z: np.ndarray) -> np.ndarray:
        sizes.append(np.size(z))
        return mix64(z)

    def no_sort(*args: object) -> None:
        raise AssertionError("a full permutation was sorted")

    monkeypatch.setattr(rng_module, "mix64", counting_mix64)
    monkeypatch.setattr(rng_module, "_permutation_rows", no_sort)
    for n in (10**4, 10**6, 10**9):
        sizes.clear()
        idx = sample_batches(client_generator(0, 1, 3), n, 1, 32, "shuffle")
        assert idx.shape == (1, 32) and len(set(idx[0].tolist())) == 32 and int(idx.max()) < n
        assert max(sizes) <= 2 * 32 + 8
        sizes.clear()
        block = sample_batches(client_generator(0, 1, [3, 4, 5]), torch.tensor([n, 2 * n, 3 * n]), 2, 16, "shuffle")
        assert torch.equal(block[0], idx.reshape(2, 16))
        assert max(sizes) <= 3 * (2 * 32 + 8)


def test_permutations_mixing_full_epochs_and_a_drawn_tail() -> None:
    """Every epoch visits every row once; the cut epoch's rows are distinct, drawn by sorting
    (``2 m >= n``) or as distinct uniform draws (``2 m < n``); block rows = own draws."""
    sizes = torch.tensor([100, 7, 33333, 64, 65, 1, 130, 260, 10**6])
    total = 130
    block = client_generator(2, 3, list(range(len(sizes)))).permutations(sizes, total)
    for i, n in enumerate(sizes.tolist()):
        row = block[i].tolist()
        assert row == client_generator(2, 3, i).permutations(n, total).tolist()
        full, rest = divmod(total, n)
        for e in range(full):
            assert sorted(row[e * n : (e + 1) * n]) == list(range(n))
        assert len(set(row[full * n :])) == rest and all(0 <= v < n for v in row)


def test_drawn_tail_is_a_uniform_ordered_sample() -> None:
    """2 distinct rows of 5 (the distinct-draws path): all 20 ordered pairs, equally often."""
    pairs = client_generator(0, 0, list(range(40000))).permutations(5, 2)
    _, counts = torch.unique(pairs, dim=0, return_counts=True)
    expected = 40000 / 20
    assert len(counts) == 20
    assert float(((counts - expected) ** 2 / expected).sum()) < 50  # 19 dof: P(chi2 > 50) < 1e-3
    first = client_generator(0, 1, list(range(20000))).permutations(33333, 4)
    assert abs(float(first.double().mean()) - 16666) < 300  # uniform over the rows


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
