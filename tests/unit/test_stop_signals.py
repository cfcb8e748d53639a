"""Which signals stop a run: SIGHUP too, unless the run was started ignoring it (``nohup``),
which it then goes on doing, in the driver and in the JVM."""

from __future__ import annotations

import signal
import subprocess
import sys

SHOW = (
    "from materializer.spark.signals import ROUTED, STOP_SIGNALS; "
    "print(sorted(s.name for s in STOP_SIGNALS), list(ROUTED))"
)


def _signals_of_a_process(ignore_hup: bool) -> str:
    def started() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN if ignore_hup else signal.SIG_DFL)

    shown = subprocess.run(
        [sys.executable, "-c", SHOW],
        preexec_fn=started,
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return shown.stdout.strip()


def test_sighup_stops_a_run_like_sigterm_and_ctrl_c() -> None:
    assert _signals_of_a_process(ignore_hup=False) == (
        "['SIGHUP', 'SIGINT', 'SIGTERM'] ['TERM', 'HUP']"
    )


def test_a_run_started_under_nohup_goes_on_ignoring_sighup() -> None:
    assert _signals_of_a_process(ignore_hup=True) == "['SIGINT', 'SIGTERM'] ['TERM']"
