"""Whether another request can still join a batch before its window ends: early dispatch, pure.

Why: a window only pays when someone joins during it. Under a closed loop (perf_analyzer's sync mode, or
any fixed set of clients that each wait for their answer) with c clients, once all c requests are queued or
executing nobody else can arrive until one is answered; waiting out the window then adds its whole length to
every request's latency and buys nothing. At c = 1 that doubles the latency of a fast model behind a 1 ms
window. And under light open-loop traffic, when the mean gap between arrivals is many windows long, the
window mostly ends empty.

Two signals, both measured here from what the batcher sees:
  * the population: the peak of requests in flight (queued + executing, counted at each arrival) in each
    epoch of `EPOCH_NS`. When the last two complete epochs had the same peak, that is the population; when
    the requests in flight equal it, every client seen lately already has a request in, so nobody can join:
    dispatch at once. A cold batcher (fewer than two complete epochs) and a population still moving (two
    different peaks, or more in flight than the peak) wait out the window as Triton does: dispatching early
    on a wrong population would split batches that the window would have kept whole, and under a closed
    loop a split tends to last (the halves then take turns on the instance).
  * the arrival rate: an exponentially-weighted mean of the gaps between arrivals. When the whole window is
    under `RARE` mean gaps, traffic is sparse: an arrival within it is unlikely (under 10 % for Poisson
    arrivals), so do not wait at all. The whole window, not what is left of it: under a closed loop the
    arrivals come in bursts (everyone answered at once comes back at once) and the mean gap, mostly the
    spaces between bursts, says nothing about how soon the rest of a burst follows. It counts only after
    `_MIN_GAPS` gaps, so the first requests of a run are not taken for sparse traffic.
Batches are never made smaller by the first signal under a closed loop: what is queued when everybody is in
is all that can come. The peak is measured, so a client that is in flight but has not reached the batcher
(parsing, on the wire) never counts; reaching the peak is then what a full round looks like.

Owned by `BatchPolicy` (policy.py), which calls it from one thread with its own clock readings.
"""

from __future__ import annotations

EPOCH_NS = 250_000_000  # how long one epoch of the population's peak lasts
RARE = 0.1  # do not wait when the window is under this many mean arrival gaps
_ALPHA = 0.1  # weight of a new gap in the moving average
_MIN_GAPS = 16  # gaps measured before the mean gap counts


class JoinForecast:
    """Arrivals in, "can anyone still join?" out. Not thread-safe."""

    def __init__(self) -> None:
        self._epoch_start = 0
        self._peak = 0  # peak in flight in the current epoch
        self._last_peaks = (0, 0)  # peaks of the two complete epochs before it
        self._gap_ns = 0.0  # moving average of inter-arrival gaps; 0 = none measured
        self._gaps = 0  # gaps measured, up to _MIN_GAPS
        self._last_arrival = 0

    @property
    def population(self) -> int:
        """Clients seen lately: the peak in flight of the last two complete epochs when they agree, else 0
        (not known)."""
        last, before = self._last_peaks
        return last if last == before else 0

    @property
    def mean_gap_ns(self) -> float:
        return self._gap_ns

    def on_arrival(self, now_ns: int, in_flight: int, window_ns: int) -> None:
        """A request was queued at `now_ns`; `in_flight` counts it. Gaps count at most twice the sparse
        threshold (`2 * window_ns / RARE`), so one long idle spell cannot make the next burst look sparse."""
        if not self._epoch_start:
            self._epoch_start = now_ns
        epochs = (now_ns - self._epoch_start) // EPOCH_NS
        if epochs:  # the current epoch is complete; any after it that saw no arrival had a peak of 0
            if epochs == 1:
                self._last_peaks = (self._peak, self._last_peaks[0])
            else:
                self._last_peaks = (0, self._peak) if epochs == 2 else (0, 0)
            self._peak = 0
            self._epoch_start = now_ns
        self._peak = max(self._peak, in_flight)
        if self._last_arrival:
            gap = float(now_ns - self._last_arrival)
            if window_ns:
                gap = min(gap, 2 * window_ns / RARE)
            self._gap_ns = gap if not self._gap_ns else (1 - _ALPHA) * self._gap_ns + _ALPHA * gap
            self._gaps = min(self._gaps + 1, _MIN_GAPS)
        self._last_arrival = now_ns

    def none_can_join(self, window_ns: int, in_flight: int) -> bool:
        """Whether waiting out a window of `window_ns` cannot bring another request (see the module doc)."""
        population = self.population
        if population and in_flight == population:
            return True
        return self._gaps >= _MIN_GAPS and window_ns < RARE * self._gap_ns
