"""CoreShare: the engine's thread count follows what other processes leave of the cores."""

from __future__ import annotations

import time
from pathlib import Path

from inference.engine.core_share import CoreShare, read_cpu_times

TICKS_PER_S = 100  # Linux's USER_HZ


class Machine:
    """A `cores`-core machine's /proc (stat and self/stat, as Linux writes them) under `proc`,
    advanced by hand."""

    def __init__(self, proc: Path, cores: int = 2) -> None:
        self.proc, self.cores, self.now = proc, cores, 0.0
        # cumulative ticks: user nice system idle iowait irq softirq steal; own utime, stime
        self.machine = [0] * 8
        self.own = [0, 0]
        (proc / "self").mkdir(parents=True)
        self._write()

    def run(self, seconds: float, *, own: float = 0.0, others: float = 0.0, niced: float = 0.0):
        """`seconds` pass with the engine, unniced and niced other processes keeping that many
        cores busy (system time a fifth of each)."""
        ticks = seconds * TICKS_PER_S
        user, system = round(0.8 * (own + others) * ticks), round(0.2 * (own + others) * ticks)
        niced_ticks = round(niced * ticks)
        self.machine[0] += user
        self.machine[1] += niced_ticks
        self.machine[2] += system
        self.machine[3] += round(self.cores * ticks) - user - system - niced_ticks
        self.own[0] += round(0.8 * own * ticks)
        self.own[1] += round(0.2 * own * ticks)
        self.now += seconds
        self._write()

    def _write(self) -> None:
        per_core = " ".join("0" for _ in range(10))
        (self.proc / "stat").write_text(
            f"cpu  {' '.join(map(str, self.machine))} 0 0\n"
            + "".join(f"cpu{i} {per_core}\n" for i in range(self.cores))
            + "intr 0\nctxt 0\n"
        )
        fields = ["S", *["0"] * 10, *map(str, self.own), *["0"] * 30]
        (self.proc / "self" / "stat").write_text(f"4242 (python (engine)) {' '.join(fields)}\n")

    def core_share(self, max_threads: int) -> CoreShare:
        return CoreShare(
            max_threads,
            read_times=lambda: read_cpu_times(self.proc),
            clock=lambda: self.now,
            num_cores=self.cores,
            machine_cores=self.cores,
        )


def test_a_busy_neighbour_takes_a_thread_until_it_stops(tmp_path):
    machine = Machine(tmp_path / "proc", cores=2)
    share = machine.core_share(max_threads=2)
    machine.run(1.0, own=2.0)
    assert share.threads() == 2
    machine.run(1.0, own=1.0, others=1.0)
    assert share.threads() == 1
    assert share.others_busy_cores == 1.0
    machine.run(1.0, own=2.0)
    assert share.threads() == 2


def test_the_engines_own_time_and_niced_work_take_no_thread(tmp_path):
    machine = Machine(tmp_path / "proc", cores=2)
    share = machine.core_share(max_threads=2)
    machine.run(1.0, own=2.0, niced=2.0)
    assert share.threads() == 2
    assert share.others_busy_cores == 0.0


def test_light_use_by_others_keeps_every_thread_and_the_count_stays_in_bounds(tmp_path):
    machine = Machine(tmp_path / "proc", cores=4)
    share = machine.core_share(max_threads=3)
    machine.run(1.0, others=0.3)  # a shell, a log writer: not a core
    assert share.threads() == 3
    machine.run(1.0, others=4.0)  # every core busy elsewhere: still one thread
    assert share.threads() == 1


def test_it_measures_again_only_after_its_window(tmp_path):
    machine = Machine(tmp_path / "proc", cores=2)
    share = machine.core_share(max_threads=2)
    machine.run(0.1, others=2.0)
    assert share.threads() == 2  # within the window: the last answer stands
    machine.run(0.5, others=2.0)
    assert share.threads() == 1


def test_without_proc_it_keeps_the_configured_count(tmp_path):
    share = CoreShare(2, read_times=lambda: read_cpu_times(tmp_path / "nothing"), num_cores=2)
    assert share.threads() == 2


def test_the_real_proc_counts_this_processs_work_as_its_own():
    before = read_cpu_times()
    assert before is not None
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    after = read_cpu_times()
    assert after is not None
    own_ticks = after.own - before.own
    assert own_ticks >= 0.2 * TICKS_PER_S
    assert after.busy_unniced - before.busy_unniced >= own_ticks - 2
    assert after.total > before.total
