"""The best fixed partition of bench/midas_best_static.py: exact over whole segments, linear
between the measured points of each curve."""
import itertools

from bench.midas_best_static import best_partition, interpolate


def test_interpolation_is_linear_between_points_and_flat_outside_them():
    curve = [(2, 0.1), (4, 0.3), (8, 0.5)]
    assert interpolate(curve, 2) == 0.1
    assert abs(interpolate(curve, 3) - 0.2) < 1e-12
    assert abs(interpolate(curve, 6) - 0.4) < 1e-12
    assert interpolate(curve, 1) == 0.1
    assert interpolate(curve, 34) == 0.5


def test_the_best_partition_is_the_best_of_every_split():
    # Three made-up curves with different shapes: one saturating early, one linear, one with a cliff.
    curves = {
        "cheap": [(2, 0.6), (4, 0.8), (8, 0.9), (16, 0.95), (34, 1.0)],
        "linear": [(2, 0.05), (34, 1.0)],
        "cliff": [(2, 0.02), (28, 0.1), (32, 0.9), (34, 1.0)],
    }
    split, value = best_partition(curves, 48)
    assert sum(split.values()) <= 48 and all(v >= 2 and v % 2 == 0 for v in split.values())
    brute = max(
        sum(interpolate(curves[n], m) for n, m in zip(sorted(curves), ms))
        for ms in itertools.product(range(2, 49, 2), repeat=3) if sum(ms) <= 48)
    assert abs(value - brute) < 1e-9
    assert abs(value - sum(interpolate(curves[n], m) for n, m in split.items())) < 1e-9
    # The cliff is worth climbing here: the best split gives it at least 32 MiB.
    assert split["cliff"] >= 32, split


def test_a_budget_too_small_for_one_segment_each_is_refused():
    curves = {"a": [(2, 1.0)], "b": [(2, 1.0)], "c": [(2, 1.0)]}
    try:
        best_partition(curves, 4)
    except ValueError as e:
        assert "cannot give" in str(e)
    else:
        raise AssertionError("a 4 MiB budget was split among three 2 MiB minimums")
