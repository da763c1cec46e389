"""An SLO-driven batching window: the largest `max_queue_delay` whose predicted p95 meets a latency target.

Why: a fixed window is right for one load only. Too short and batches stay small, so a compute-bound model
runs far below its throughput; too long and light traffic waits for nothing. Given a p95 target (config
parameter `p95_latency_target_ms`), the batcher re-derives its window from what it measures.

The model of one batch, updated online:
  * execution time per batch size, fitted as t(n) = a + b*n by exponentially-weighted least squares over
    recent executions, so sizes not yet seen are extrapolated;
  * the arrival rate λ, an exponentially-weighted average of inter-arrival gaps.
A window W collects about n(W) = min(max_batch_size, 1 + λW) requests; the oldest then waits W and runs for
t(n). Requests that arrive while the instance is busy also wait for the batch in flight, so the predicted
worst case is W + 2*t(n(W)). The window chosen is the largest W in [0, target] with
    W + 2*t(n(W)) <= k * target,
found by bisection (the left side grows with W). Larger windows form larger batches, which is where the
throughput comes from, so "largest that fits" maximises throughput under the latency bound.

The window is an upper bound, not a wait: with early dispatch (join_forecast.py, on by default) a batch
leaves as soon as no other request can join it, e.g. once every client of a closed loop is in. So the budget
buys batch size and never idle time. Without it the instance idled out the rest of the window after each
batch had all it could get: mlp_large at c=16, 60 ms target, ran at 58-63 % of the best fixed window's
throughput in batches of 16; with it, the same batches of 16 run at 1.01-1.11 of it (perf/history/batching.md,
"Issue 13: batcher"): a batch of 16 costs less than two of 8, so growing it was right, waiting was not.

Feedback: the model ignores queueing under overload and the network, so the measured p95 of the latency the
batcher sees (enqueue → response) corrects it. Every `_EVERY` completions, k shrinks by 20 % when the measured
p95 exceeds the target and grows by 5 % (up to 1) when it is below 70 % of it.

Pure and synchronous (the caller passes timestamps), so it is tested with plain functions.
"""

from __future__ import annotations

from collections import deque

_ALPHA = 0.1  # weight of a new sample in the moving averages
_EVERY = 64  # completions between feedback steps
_SAMPLES = 256  # latencies kept for the p95


class AdaptiveWindow:
    def __init__(self, target_ns: int, max_batch_size: int) -> None:
        self.target_ns = target_ns
        self.max_batch_size = max(1, max_batch_size)
        self.k = 0.8  # start with headroom; feedback moves it
        self._gap_ns = 0.0  # moving average of inter-arrival gaps
        self._last_arrival = 0
        # Weighted sums for least squares of t = a + b*n.
        self._sw = self._sn = self._st = self._snn = self._snt = 0.0
        self._latencies: deque[int] = deque(maxlen=_SAMPLES)
        self._since_feedback = 0
        self.window_ns = 0

    # ------------------------------------------------------------------ observations

    def on_arrival(self, now_ns: int) -> None:
        if self._last_arrival:
            gap = now_ns - self._last_arrival
            self._gap_ns = gap if not self._gap_ns else (1 - _ALPHA) * self._gap_ns + _ALPHA * gap
        self._last_arrival = now_ns

    def on_execution(self, batch_size: int, duration_ns: int) -> None:
        decay = 1 - _ALPHA
        self._sw = self._sw * decay + 1
        self._sn = self._sn * decay + batch_size
        self._st = self._st * decay + duration_ns
        self._snn = self._snn * decay + batch_size * batch_size
        self._snt = self._snt * decay + batch_size * duration_ns
        self._recompute()

    def on_latency(self, latency_ns: int) -> None:
        self._latencies.append(latency_ns)
        self._since_feedback += 1
        if self._since_feedback >= _EVERY:
            self._since_feedback = 0
            p95 = self.measured_p95_ns()
            if p95 > self.target_ns:
                self.k = max(0.05, self.k * 0.8)
            elif p95 < 0.7 * self.target_ns:
                self.k = min(1.0, self.k * 1.05)
            self._recompute()

    # ------------------------------------------------------------------ model

    def measured_p95_ns(self) -> int:
        if not self._latencies:
            return 0
        ordered = sorted(self._latencies)
        return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]

    def exec_time_ns(self, n: float) -> float:
        """Predicted execution time of a batch of n, from the weighted least-squares fit."""
        if self._sw == 0:
            return 0.0
        mean_n, mean_t = self._sn / self._sw, self._st / self._sw
        var_n = self._snn / self._sw - mean_n * mean_n
        slope = (self._snt / self._sw - mean_n * mean_t) / var_n if var_n > 1e-9 else mean_t / max(mean_n, 1)
        slope = max(slope, 0.0)
        return max(mean_t + slope * (n - mean_n), 0.0)

    def batch_for(self, window_ns: float) -> float:
        if not self._gap_ns:
            return 1.0
        return min(float(self.max_batch_size), 1.0 + window_ns / self._gap_ns)

    def predicted_ns(self, window_ns: float) -> float:
        return window_ns + 2 * self.exec_time_ns(self.batch_for(window_ns))

    def _recompute(self) -> None:
        budget = self.k * self.target_ns
        if self.predicted_ns(0) >= budget:
            self.window_ns = 0
            return
        lo, hi = 0.0, float(self.target_ns)
        if self._gap_ns:  # past the time that fills a maximal batch, waiting buys nothing
            hi = min(hi, (self.max_batch_size - 1) * self._gap_ns)
        if self.predicted_ns(hi) <= budget:
            self.window_ns = int(hi)
            return
        for _ in range(30):
            mid = (lo + hi) / 2
            if self.predicted_ns(mid) <= budget:
                lo = mid
            else:
                hi = mid
        self.window_ns = int(lo)
