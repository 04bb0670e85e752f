"""Pipeline schedules: idle time (bubble) and point-to-point time on the critical path.

With m micro-batches over S stages, each stage busy t per micro-batch (forward + backward):
- GPipe and 1F1B: every stage idles (S - 1) micro-batch slots while the pipeline fills and
  drains, so the step takes (m + S - 1) slots; 1F1B only changes memory (it keeps at most S
  micro-batches in flight instead of m).
- Interleaved 1F1B with v virtual stages per device: each slot is a chunk of 1/v of the stage,
  so the bubble shrinks to (S - 1) / v slots, at the price of v times more p2p messages.
Imbalanced stages: the busiest stage sets the pace for the m steady-state slots; fill and drain
walk once through every stage, so the bubble uses the average stage time.

Point-to-point: a micro-batch's activation (and later its gradient) crosses every stage
boundary; blocking sends sit on the critical path 2 (v m + S - 1) times (v = 1 unless interleaved).
"""

from __future__ import annotations

import numpy as np

from perfmodels.plans import SCHEDULE_CODE


def bubble_s(
    t_avg_mb_s: np.ndarray, stages: np.ndarray, schedule: np.ndarray, virtual: np.ndarray
) -> np.ndarray:
    S = stages.astype(np.float64)
    v = np.where(schedule == SCHEDULE_CODE["interleaved-1f1b"], virtual, 1).astype(np.float64)
    return (S - 1) / v * t_avg_mb_s


def p2p_transfers_on_critical_path(m: np.ndarray, stages: np.ndarray, schedule: np.ndarray,
                                   virtual: np.ndarray) -> np.ndarray:
    S = stages.astype(np.float64)
    v = np.where(schedule == SCHEDULE_CODE["interleaved-1f1b"], virtual, 1).astype(np.float64)
    return np.where(S > 1, 2.0 * (v * m + S - 1), 0.0)
