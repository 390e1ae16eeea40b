"""`training.trap_flags` (all runs at once, settled by a probe of the first sequences where it can) equals the
literal definition run by run: a run is trapped iff every training sequence's token histogram equals that of
the first sequence of its closed class (the class of its last state; one class where the run has no Π)."""
import torch

from rw_sweeps.core import training


def literal(tokens: torch.Tensor, K: int, classes=None) -> list[bool]:
    out = []
    for r in range(tokens.shape[0]):
        h = torch.stack([torch.bincount(s.long(), minlength=K) for s in tokens[r]])
        cls = [0] * len(h) if classes is None or classes[r] is None else [classes[r][int(s[-1])] for s in tokens[r]]
        out.append(all(torch.equal(h[i], h[cls.index(c)]) for i, c in enumerate(cls)))
    return out


def _cases(seed: int, count: int):
    g = torch.Generator().manual_seed(seed)
    for trial in range(count):
        K, L, R = (int(torch.randint(lo, hi, (1,), generator=g)) for lo, hi in ((2, 7), (1, 7), (1, 6)))
        n = int(torch.randint(1, 3 * training.TRAP_PROBE, (1,), generator=g))
        # sequences that are permutations of one row (equal histograms), some changed at one late position
        row = torch.randint(0, K, (R, 1, L), generator=g)
        tokens = row.expand(R, n, L).gather(2, torch.argsort(torch.rand(R, n, L, generator=g), dim=-1)).clone()
        changed = torch.rand(R, generator=g) < 0.5
        at = int(torch.randint(0, n, (1,), generator=g))
        tokens[changed, at, 0] = (tokens[changed, at, 0] + 1) % K
        classes = [None if torch.rand(1, generator=g) < 0.3 else
                   [int(x) for x in torch.randint(-1, K, (K,), generator=g)] for _ in range(R)]
        yield tokens.to(torch.uint8 if trial % 2 else torch.int64), K, classes


def test_trap_flags_equal_the_literal_definition_run_by_run():
    seen = set()
    for tokens, K, classes in _cases(seed=11, count=400):
        for cl in (None, classes):
            got = training.trap_flags(tokens, K, cl)
            assert got == literal(tokens, K, cl)
            seen |= set(got)
    assert seen == {True, False}  # both outcomes were exercised


def test_trap_flags_in_blocks_equal_one_block(monkeypatch):
    cases = list(_cases(seed=12, count=60))
    whole = [training.trap_flags(t, K, c) for t, K, c in cases]
    monkeypatch.setattr(training, "TRAP_BLOCK", 1)  # one run per block
    assert [training.trap_flags(t, K, c) for t, K, c in cases] == whole


def test_no_runs_no_flags():
    assert training.trap_flags(torch.zeros((0, 4, 3), dtype=torch.long), 3) == []
