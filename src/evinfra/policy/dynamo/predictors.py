"""Load predictors of Dynamo's SLA planner: forecast next interval's request count, mean
input length and mean output length from one series each.

Source: `docs/design-docs/planner-design.md` ("Step 2: Load Prediction": constant, ARIMA,
Kalman, Prophet) and `components/src/dynamo/planner/config/defaults.py` (Kalman
q_level=1.0, q_trend=0.1, r=10.0, min_points=5). Like Dynamo's predictors, leading zeros
(the idle time after deployment) are skipped, and a predictor short of history falls back
to the last value. `arima` here is a fixed ARIMA(1,1,0) fitted by least squares, not
Dynamo's auto-ARIMA (pmdarima); Prophet is not modelled.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Protocol


class LoadPredictor(Protocol):
    def add_data_point(self, value: float) -> None: ...
    def predict_next(self) -> float:
        """Forecast of the next point (0 with no history). Mutates nothing."""


class _Series:
    def __init__(self) -> None:
        self.values: list[float] = []

    def add_data_point(self, value: float) -> None:
        if value == 0.0 and not self.values:
            return  # still in the idle period before the first traffic
        self.values.append(float(value))

    def last(self) -> float:
        return self.values[-1] if self.values else 0.0


class ConstantPredictor(_Series):
    """Next = current."""

    def predict_next(self) -> float:
        return self.last()


class MovingAveragePredictor(_Series):
    """Mean of the last `window` points."""

    def __init__(self, window: int = 5) -> None:
        super().__init__()
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window

    def predict_next(self) -> float:
        recent = self.values[-self.window :]
        return sum(recent) / len(recent) if recent else 0.0


class ArimaPredictor(_Series):
    """ARIMA(1,1,0): the next difference is `phi` times the last one, `phi` fitted by least
    squares on the differenced series (clipped to |phi| < 1); never below 0."""

    def predict_next(self) -> float:
        if len(self.values) < 3:
            return self.last()
        diffs = [b - a for a, b in pairwise(self.values)]
        num = sum(d1 * d0 for d0, d1 in pairwise(diffs))
        den = sum(d0 * d0 for d0 in diffs[:-1])
        phi = 0.0 if den == 0.0 else max(-0.99, min(0.99, num / den))
        return max(0.0, self.values[-1] + phi * diffs[-1])


class KalmanPredictor:
    """Local linear trend Kalman filter: state (level, trend), level += trend each step."""

    def __init__(
        self, q_level: float = 1.0, q_trend: float = 0.1, r: float = 10.0, min_points: int = 5
    ) -> None:
        self.q_level, self.q_trend, self.r, self.min_points = q_level, q_trend, r, min_points
        self._n = 0
        self._last = 0.0
        self._level = 0.0
        self._trend = 0.0
        # covariance [[p00, p01], [p01, p11]]
        self._p = (1e3, 0.0, 1e3)

    def add_data_point(self, value: float) -> None:
        if value == 0.0 and self._n == 0:
            return
        self._last = float(value)
        if self._n == 0:
            self._level, self._n = float(value), 1
            return
        self._n += 1
        # predict
        level, trend = self._level + self._trend, self._trend
        p00, p01, p11 = self._p
        p00, p01, p11 = p00 + 2 * p01 + p11 + self.q_level, p01 + p11, p11 + self.q_trend
        # update with the observation of the level
        s = p00 + self.r
        k0, k1 = p00 / s, p01 / s
        innovation = value - level
        self._level, self._trend = level + k0 * innovation, trend + k1 * innovation
        self._p = ((1 - k0) * p00, (1 - k0) * p01, p11 - k1 * p01)

    def predict_next(self) -> float:
        if self._n < self.min_points:
            return self._last
        return max(0.0, self._level + self._trend)


PREDICTORS = ("constant", "moving_average", "arima", "kalman")


def make_predictor(name: str) -> LoadPredictor:
    if name == "constant":
        return ConstantPredictor()
    if name == "moving_average":
        return MovingAveragePredictor()
    if name == "arima":
        return ArimaPredictor()
    if name == "kalman":
        return KalmanPredictor()
    raise ValueError(f"unknown load predictor {name!r}; known: {', '.join(PREDICTORS)}")
