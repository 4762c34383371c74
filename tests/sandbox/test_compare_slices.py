"""The judge's comparison over slices (judge.COMPARE_SLICE) gives whole-tensor torch.allclose's verdict, element by
element: one bad element anywhere, NaN/Inf counts, non-contiguous and empty outputs."""
import torch

from sandbox_workers import judge


def _cases():
    g = torch.Generator().manual_seed(0)
    base = torch.randn(5, 37, generator=g)
    yield base, base.clone(), True
    for pos in (0, 92, 184):  # first slice, middle, the last (partial) slice
        bad = base.clone()
        bad.view(-1)[pos] += 1.0
        yield bad, base, False
    nan_both = base.clone()
    nan_both[4, 36] = float("nan")
    yield nan_both, nan_both.clone(), True  # NaN where the reference has NaN: equal
    yield nan_both, base, False
    yield base.t(), base.t().clone(), True  # non-contiguous
    yield torch.empty(0, 3), torch.empty(0, 3), True
    yield torch.tensor(1.0), torch.tensor(1.0 + 1e-9), True


def test_sliced_verdict_equals_whole_tensor_allclose(monkeypatch):
    monkeypatch.setattr(judge, "COMPARE_SLICE", 7)  # many slices, the last one partial
    for o, e, want in _cases():
        assert torch.allclose(o, e, atol=1e-6, rtol=1e-6, equal_nan=True) is want
        assert judge._allclose(o, e, 1e-6, 1e-6) is want, (o.shape, want)
        assert judge._nonfinite(o) == int((~torch.isfinite(o)).sum())
        ok, detail = judge.compare([o], [e], 1e-6, 1e-6)
        assert ok is want, detail


def test_more_nonfinite_than_the_reference_is_named():
    e = torch.zeros(100)
    o = e.clone()
    o[[3, 50, 99]] = float("inf")
    ok, detail = judge.compare([o], [e], 1e-2, 1e-2)
    assert not ok and "3 NaN/Inf" in detail
