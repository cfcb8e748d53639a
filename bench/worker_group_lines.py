"""The closing JSON lines of ``worker_group.py``: from the moments its hand-overs recorded
and the samples each map's follower saw, the failover, the graceful stop and the other
maps' freshness, each against its goal (``worker_group.py``'s docstring says what each
field means). They are read once every follower finished, so a sample never seen counts
against every goal it falls under."""

from __future__ import annotations

from typing import Any

from harness import emit
from live import nearest_rank
from worker_group_handovers import FRESH_S, Stream

from materializer.testing.process import ManagedProcess

FAILOVER_GOAL_S = 30.0
GRACEFUL_GOAL_S = 10.0
OTHERS_GOAL_P99_MS = 1000.0
LEAD_S = 5.0
"""The hand-over window of a graceful stop starts this long before the SIGTERM: events
produced then may wait for the hand-over, and a steady sample takes far less."""


def percentiles(ms: list[float]) -> dict[str, float | None]:
    """p50, p99 and max of sorted milliseconds (nearest rank)."""
    if not ms:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    return {
        "p50_ms": round(nearest_rank(ms, 50), 1),
        "p99_ms": round(nearest_rank(ms, 99), 1),
        "max_ms": round(ms[-1], 1),
    }


class Lines:
    """The lines of one run: its maps' streams, the steady window before each hand-over
    (``--window-seconds``) and the fields every line shares (rate, keys, maps)."""

    def __init__(
        self, streams: dict[str, Stream], window_seconds: float, common: dict[str, Any]
    ) -> None:
        self.streams, self.window_s, self.common = streams, window_seconds, common

    def failover(self, rounds: list[dict[str, Any]]) -> None:
        streams, window_s = self.streams, self.window_s
        per_kill = []
        for r in rounds:
            at, fresh_at = r["at"], r["fresh_at"]
            before = sorted(
                x for m in r["maps"] for x in streams[m].latencies_ms(at - window_s, at)
            )
            after = {
                m: percentiles(streams[m].latencies_ms(fresh_at, fresh_at + window_s))["max_ms"]
                for m in r["maps"]
            }
            join = sorted(
                x
                for s in streams.values()
                for x in s.latencies_ms(r["launched"], r["join_fresh_at"])
            )
            per_kill.append(
                {
                    "round": r["round"],
                    "killed": r["worker"],
                    "survivor": r["survivor"],
                    "fresh_again_s": r["fresh_again_s"],
                    "taken_over_s": r["taken_over_s"],
                    "before_kill_p99_ms": percentiles(before)["p99_ms"],
                    "after_fresh_max_ms": after,
                    "processes_left_behind": r["processes_left_behind"],
                    "replacement": r["replacement"],
                    "replacement_shared_s": r["replacement_shared_s"],
                    "replacement_fresh_s": r["replacement_fresh_s"],
                    "join_max_ms": percentiles(join)["max_ms"],
                }
            )
        seconds = sorted(s for r in rounds for s in r["fresh_again_s"].values())
        taken = sorted(s for r in rounds for s in r["taken_over_s"].values() if s is not None)
        emit(
            name="worker_group_failover",
            units="s",
            **self.common,
            kills=len(rounds),
            maps_taken_over=len(seconds),
            session_timeout_s=6,
            fresh_within_s=FRESH_S,
            per_kill=per_kill,
            seconds=seconds,
            p50_s=nearest_rank(seconds, 50),
            p99_s=nearest_rank(seconds, 99),
            max_s=seconds[-1],
            taken_over_p50_s=nearest_rank(taken, 50) if taken else None,
            taken_over_max_s=taken[-1] if taken else None,
            goal_s=FAILOVER_GOAL_S,
            met=seconds[-1] <= FAILOVER_GOAL_S,
        )

    def graceful(self, graceful: dict[str, Any]) -> None:
        streams = self.streams
        at, moved = graceful["at"], graceful["maps"]
        steady = sorted(
            x for m in moved for x in streams[m].latencies_ms(at - LEAD_S - self.window_s, at)
        )
        end = graceful["fresh_at"] + self.window_s
        window = sorted(x for m in moved for x in streams[m].latencies_ms(at - LEAD_S, end))
        unseen = sum(streams[m].unseen(at - LEAD_S, end) for m in moved)
        steady_p99 = nearest_rank(steady, 99)
        extra_s = (window[-1] - steady_p99) / 1000
        proc: ManagedProcess = graceful["proc"]
        exited = graceful["stopped"].get("at")
        emit(
            name="worker_group_graceful",
            units="s, ms",
            **self.common,
            stopped=graceful["worker"],
            survivor=graceful["survivor"],
            moved_maps=moved,
            worker_exit_s=round(exited - at, 2) if exited is not None else None,
            worker_exit_code=proc.proc.returncode,
            taken_over_s=graceful["taken_over_s"],
            fresh_again_s=graceful["fresh_again_s"],
            steady_samples=len(steady),
            steady_p99_ms=round(steady_p99, 1),
            handover_samples=len(window),
            handover_unresolved=unseen,
            handover_max_ms=round(window[-1], 1),
            handover_p99_ms=round(nearest_rank(window, 99), 1),
            extra_staleness_s=round(extra_s, 2),
            goal_extra_staleness_s=GRACEFUL_GOAL_S,
            met=extra_s <= GRACEFUL_GOAL_S and unseen == 0,
        )

    def others(self, hand_overs: list[dict[str, Any]]) -> None:
        streams = self.streams
        windows, all_ms, steady = [], [], []
        unseen = 0
        for h in hand_overs:
            at, others = h["at"], [m for m in streams if m not in h["maps"]]
            ms = sorted(x for m in others for x in streams[m].latencies_ms(at, h["fresh_at"]))
            before = sorted(
                x for m in others for x in streams[m].latencies_ms(at - self.window_s, at)
            )
            unseen += sum(streams[m].unseen(at, h["fresh_at"]) for m in others)
            all_ms += ms
            steady += before
            windows.append(
                {
                    "after": f"kill {h['round']}" if "round" in h else "SIGTERM",
                    "seconds": round(h["fresh_at"] - at, 1),
                    "samples": len(ms),
                    **percentiles(ms),
                    "before_p99_ms": percentiles(before)["p99_ms"],
                }
            )
        all_ms.sort()
        steady.sort()
        p99 = percentiles(all_ms)["p99_ms"]
        emit(
            name="worker_group_others",
            units="ms",
            **self.common,
            windows=windows,
            samples=len(all_ms),
            unresolved=unseen,
            **percentiles(all_ms),
            steady_before_p99_ms=percentiles(steady)["p99_ms"],
            goal_p99_ms=OTHERS_GOAL_P99_MS,
            met=p99 is not None and p99 <= OTHERS_GOAL_P99_MS and unseen == 0,
        )
