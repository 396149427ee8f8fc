"""The prefill fit's bounded least squares, written out as scalar arithmetic, returns the
same floats as the general form it replaced (kept here verbatim), face for face.

The inputs are what ``InstanceTimeModel._fit_prefill`` builds: decayed weighted sums over
calls whose contention terms vary, never vary (singular faces), or vary only a little
(faces that are nearly tied, where the order of the faces and the tolerance decide), plus
raw positive semi-definite sums drawn at random.
"""

from __future__ import annotations

import random

import pytest

from agentflow.scheduler.cluster import InstanceSpec
from agentflow.scheduler.time_model import (
    RATIO_FLOOR,
    InstanceTimeModel,
    _bounded_least_squares,
)

# ----------------------------------------------------------- the general form, as it was


def _reference_bls(xx, xy, yy):
    best = None
    for own_at_floor in (False, True):
        for contention in ((), (1,), (2,), (1, 2)):
            b = [RATIO_FLOOR if own_at_floor else 0.0, 0.0, 0.0]
            free = list(contention) if own_at_floor else [0, *contention]
            if not free:
                coef = []
            else:
                fixed = [j for j in range(3) if j not in free]
                rhs = [xy[i] - sum(xx[i][j] * b[j] for j in fixed) for i in free]
                coef = _reference_solve([[xx[i][j] for j in free] for i in free], rhs)
            if coef is None:
                continue
            for c, i in zip(coef, free):
                b[i] = c
            if b[0] < RATIO_FLOOR - 1e-12 or b[1] < 0 or b[2] < 0:
                continue
            loss = yy - 2 * sum(b[i] * xy[i] for i in range(3)) + sum(
                b[i] * b[j] * xx[i][j] for i in range(3) for j in range(3))
            if best is None or loss < best[0] - 1e-12 * abs(yy):
                best = (loss, b)
    return None if best is None else best[1]


def _reference_solve(a, b):
    n = len(b)
    if n == 1:
        return [b[0] / a[0][0]] if a[0][0] > 0 else None
    det = _reference_det(a)
    scale = 1.0
    for i in range(n):
        scale *= a[i][i]
    if scale <= 0 or det <= 1e-9 * scale:
        return None
    out = []
    for k in range(n):
        m = [row[:k] + [b[i]] + row[k + 1:] for i, row in enumerate(a)]
        out.append(_reference_det(m) / det)
    return out


def _reference_det(m):
    if len(m) == 2:
        return m[0][0] * m[1][1] - m[0][1] * m[1][0]
    return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))


# ---------------------------------------------------------------------------- the tests


def _bits(b):
    return None if b is None else [float(x).hex() for x in b]


def _same(xx, xy, yy) -> bool:
    new, old = _bounded_least_squares(xx, xy, yy), _reference_bls(xx, xy, yy)
    assert _bits(new) == _bits(old), (xx, xy, yy, new, old)
    return new is not None


@pytest.mark.parametrize("seed", range(6))
def test_the_fit_returns_the_floats_of_the_general_form_along_real_observations(seed):
    rng = random.Random(seed)
    m = InstanceTimeModel.for_spec(InstanceSpec("a", "H100", "Llama-3.1-8B"))
    kind = seed % 3  # 0: contention varies; 1: never (singular faces); 2: barely
    faces = set()
    for _ in range(400):
        ahead = {0: rng.uniform(0, 8000), 1: 0.0, 2: 1000.0 + rng.random() * 1e-3}[kind]
        co = {0: rng.randint(0, 6), 1: 0, 2: 2}[kind]
        prompt = rng.randint(50, 6000)
        m.observe(prompt, rng.randint(2, 400), rng.uniform(0.01, 3.0), rng.uniform(3.0, 9.0),
                  co_runners=float(co), prefill_ahead_tokens=ahead, co_runners_at_start=co)
        _same(m._prefill_xx, m._prefill_xy, m._prefill_yy)
        best = _bounded_least_squares(m._prefill_xx, m._prefill_xy, m._prefill_yy)
        if best is not None:
            faces.add((best[0] == RATIO_FLOOR, best[1] == 0.0, best[2] == 0.0))
    if kind == 0:
        assert len(faces) >= 2  # more than one face won along the way


def test_the_fit_returns_the_floats_of_the_general_form_on_random_sums():
    rng = random.Random(11)
    solved = 0
    for _ in range(3000):
        rows = [[rng.choice([0.0, rng.uniform(0, 5), rng.uniform(0, 1e-4)])
                 for _ in range(3)] for _ in range(rng.randint(1, 6))]
        w = [rng.uniform(0.1, 2) for _ in rows]
        ys = [rng.uniform(0, 10) for _ in rows]
        xx = [[sum(wk * r[i] * r[j] for wk, r in zip(w, rows)) for j in range(3)]
              for i in range(3)]
        xy = [sum(wk * y * r[i] for wk, y, r in zip(w, ys, rows)) for i in range(3)]
        yy = sum(wk * y * y for wk, y in zip(w, ys))
        solved += _same(xx, xy, yy)
    assert solved > 1000
    assert _same([[0.0] * 3 for _ in range(3)], [0.0] * 3, 0.0)  # the floor face alone
