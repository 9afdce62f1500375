"""Data at scale: how long preparing a large corpus takes, how much memory it holds, and how soon a run starts training.

    python benchmarks/data_scale.py [--pairs 100000 1000000] [--text words bpe] [--vocab-size 16000] [--seed 0]
                                    [--work DIR] [--device cpu] [--timeout S] [--json FILE]
                                    [-- REVNMT-TRAIN OPTIONS]

The corpora are synthesized from Multi30K (found as revnmt finds it: ``$REVNMT_DATA``, ``./data/multi30k``): each
of the ``--pairs`` lines joins two training sentences drawn at random (``random.Random(--seed)``) by a space, the
same two on both sides, so line i of ``PREFIX.en`` and of ``PREFIX.de`` are translations. They are written once
into ``--work`` as ``corpus-N-seedS.en`` / ``.de`` and reused by a later call with the same folder, size and seed
(the default folder is a fresh temporary one, so give ``--work`` to keep them).
The dev set is always Multi30K's (``val``).

For every size and text kind (``words``: Moses tokens, revnmt-train's default; ``bpe``: ``--subword bpe
--vocab-size 16000``, one joint model) four processes run, one at a time, each on fresh folders:

1. **prepare**: ``revnmt-prepare --prepared DIR``: wall time to exit, and pairs/s (pairs / that time);
2. **first run**: ``revnmt-train --save-dir RUN`` without ``--prepared``, so that it prepares ``RUN/data`` itself:
   seconds from launch to its progress line of step 1 (``--log-every 1``, read from its stderr as it comes), and
   the peak RSS that line reports (revnmt-train's own figure: the high-water mark of its resident memory since it
   started, ``VmHWM``, so preparation included). It then gets a SIGINT (Ctrl-C): it finishes the update under
   way, saves ``last.pt`` and exits, and the step it saved at is read from its log;
3. **resumed run**: the same command again on RUN, a resume, which must read ``RUN/data`` as it is: seconds to
   the progress line of its first step (the one after the saved step) and that line's peak RSS, then a SIGINT;
4. **prepared run**: ``revnmt-train --prepared DIR`` (the folder of phase 1) on a fresh save dir: seconds to step 1
   and its peak RSS, then a SIGINT.

Every run's JSON figures also hold ``start_seconds``, from launch to its line "training from epoch E, step S" (data
ready, model built): what is left to step 1 is the first update itself, which with the numba backend includes
compiling the buffer's loops, a cost that does not grow with the corpus.

The runs leave ``--max-steps`` unset on purpose: a run that reaches it validates on the whole dev set before it
exits, and a signal cannot cut that short, while a signal during training stops after the update under way.

Memory, besides the progress lines' figures: each process is reaped with ``wait4``, whose ``ru_maxrss`` is the
largest resident set the process (or any one of its descendants that it waited for) ever had: "peak RSS" of
revnmt-prepare in the table, what ``/usr/bin/time -v`` calls its maximum resident set size. Since a preparation
may tokenize in worker processes, the process tree's proportional set size (PSS: shared pages split among the
processes sharing them, so the sum is what the tree holds) is also sampled every 0.2 s from
``/proc/PID/smaps_rollup`` (Linux) and its peak goes into the JSON (``tree_peak_pss_mib``; the "tree" column for
preparation). A file read memory-mapped counts in RSS and PSS while its pages are resident.

Options after ``--`` go to every revnmt-train run (a model size, ``--batch-size``, ``--min-freq``; the default
model is revnmt-train's, 300 units); those that are data options go to revnmt-prepare as well, so that the
prepared folder serves the prepared run. The bpe model's size is this script's ``--vocab-size``: revnmt refuses
a ``--vocab-size`` after ``--`` for the words runs. The figures of a run of record go to ``benchmarks/results/scale/``
(``--json benchmarks/results/scale/NAME.json``) with the machine in the name; the JSON records the command, the
CPU, its core count and each child's exact command line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path

from machine import cpu_name

from revnmt.arguments import add_data_options
from revnmt.data import MULTI30K_SPLITS, find_multi30k, language_file

TEXT_KINDS = ("words", "bpe")
LANGS = ("en", "de")
WRITE_CHUNK = 10_000  # corpus lines per write
SAMPLE_S = 0.2  # how often the process tree's memory is sampled
STOP_TIMEOUT_S = 600  # from SIGINT to exit (a validation under way finishes first), then SIGKILL
TAIL_LINES = 60  # stderr lines kept for an error message
_STEP = re.compile(r"\| step (\d+) \|.*\| peak (?:RSS|CUDA reserved) ([\d.]+) (B|KiB|MiB|GiB|TiB)")
_SAVED_AT = re.compile(r"interrupted at step (\d+)")
_TRAINING = re.compile(r"training from epoch \d+, step \d+")  # data ready, model built
_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


# --- the corpora ---------------------------------------------------------------------------------------------------

def read_sentences(prefix: Path, lang: str) -> list[str]:
    """The lines of ``PREFIX.LANG`` or ``PREFIX.LANG.gz``, without line ends."""
    path = language_file(str(prefix), lang)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        return [line.rstrip("\r\n") for line in file]


def synthesize(source: Path, pairs: int, seed: int, work: Path) -> Path:
    """``WORK/corpus-PAIRS-seedSEED.{en,de}``: each line two random sentences of corpus ``source`` joined by a space,
    the same two in both languages; written once (streamed, each file renamed into place when whole) and reused."""
    prefix = work / f"corpus-{pairs}-seed{seed}"
    if all(Path(f"{prefix}.{lang}").is_file() for lang in LANGS):
        return prefix
    sides = {lang: read_sentences(source, lang) for lang in LANGS}
    n = len(sides[LANGS[0]])
    for lang in LANGS:
        rng = random.Random(seed)  # the same draws for both languages
        partial = Path(f"{prefix}.{lang}.partial")
        with open(partial, "w", encoding="utf-8") as file:
            for start in range(0, pairs, WRITE_CHUNK):
                lines = (f"{sides[lang][rng.randrange(n)]} {sides[lang][rng.randrange(n)]}\n"
                         for _ in range(min(WRITE_CHUNK, pairs - start)))
                file.write("".join(lines))
        partial.replace(f"{prefix}.{lang}")
    return prefix


# --- one child process ---------------------------------------------------------------------------------------------

@dataclass
class Child:
    """What one child process did: ``seconds`` from launch to the awaited stderr line (to its exit if none was
    awaited), the memory figures, and how it ended."""

    command: list[str]
    seconds: float
    exit_status: int
    max_rss_mib: float  # wait4's ru_maxrss: the largest RSS of the process (or one waited-for descendant)
    tree_peak_pss_mib: float | None  # sampled; None where /proc/PID/smaps_rollup cannot be read
    step: int | None = None  # the progress line awaited: its step
    step_peak_mib: float | None = None  # and the peak memory it reports
    start_seconds: float | None = None  # to the line "training from epoch E, step S"
    stop_seconds: float | None = None  # from SIGINT to exit
    saved_step: int | None = None  # the step a SIGINT made it save at
    stderr_tail: list[str] = field(default_factory=list, repr=False)


class TreeMemory(threading.Thread):
    """Samples the summed PSS of a process and its descendants every ``SAMPLE_S`` until :meth:`stop`; keeps the
    peak (KiB; None if nothing could be read)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kib, self._done = pid, None, threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            sizes = [_pss_kib(pid) for pid in _process_tree(self.pid)]
            known = [size for size in sizes if size is not None]
            if known:
                self.peak_kib = max(self.peak_kib or 0, sum(known))
            self._done.wait(SAMPLE_S)

    def stop(self) -> float | None:
        """Stop sampling; the peak in MiB."""
        self._done.set()
        self.join()
        return None if self.peak_kib is None else self.peak_kib / 1024


def _process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants alive now (``/proc/PID/task/TID/children``)."""
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        for children in Path(f"/proc/{tree[-1]}/task").glob("*/children"):
            try:
                todo += [int(child) for child in children.read_text().split()]
            except OSError:
                pass  # the thread or the process ended meanwhile
    return tree


def _pss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _read_lines(stream, lines: queue.Queue) -> None:
    """Put (arrival time, line) of every line of ``stream`` on ``lines``, then (time, None) at its end."""
    for line in stream:
        lines.put((time.monotonic(), line))
    lines.put((time.monotonic(), None))


def run_child(command: list[str], timeout: float, until_step: int | None = None) -> Child:
    """Run ``command`` and time it: to exit, or with ``until_step`` to the stderr progress line of that step, after
    which the process gets a SIGINT and is waited for (``STOP_TIMEOUT_S``, then SIGKILL). RuntimeError with the
    tail of its stderr if it fails, or never logs the step in ``timeout`` seconds."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, encoding="utf-8", errors="replace")
    memory = TreeMemory(process.pid)
    memory.start()
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_read_lines, args=(process.stderr, lines), daemon=True).start()
    tail: deque[str] = deque(maxlen=TAIL_LINES)
    reached = step_peak = interrupted = saved = training = None
    killed, deadline = False, start + timeout
    while True:
        try:
            at, line = lines.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            if killed:
                break  # the stream did not end even so
            process.kill()
            if interrupted is None:
                _reap(process)
                memory.stop()
                problem = f"no progress line of step {until_step}" if until_step else "not done"
                raise RuntimeError(f"{_shown(command)}: {problem} after {timeout:.0f} s:\n" + "".join(tail)) from None
            killed, deadline = True, time.monotonic() + 60  # SIGINT did not stop it in time
            continue
        if line is None:
            process.stderr.close()
            break
        tail.append(line)
        if training is None and _TRAINING.search(line):
            training = at
        if (found := _SAVED_AT.search(line)) is not None:
            saved = int(found.group(1))
        found = _STEP.search(line)
        if until_step is not None and reached is None and found is not None and int(found.group(1)) == until_step:
            reached, step_peak = at, float(found.group(2)) * _UNITS[found.group(3)] / (1 << 20)
            process.send_signal(signal.SIGINT)
            interrupted, deadline = time.monotonic(), time.monotonic() + STOP_TIMEOUT_S
    status, max_rss_kib = _reap(process)
    end = time.monotonic()
    child = Child(command, (reached or end) - start, status, max_rss_kib / 1024, memory.stop(),
                  until_step if reached else None, step_peak, None if training is None else training - start,
                  None if interrupted is None else end - interrupted, saved, list(tail))
    expected = (0, 128 + signal.SIGINT) if interrupted is not None else (0,)
    if status not in expected or (until_step is not None and reached is None):
        problem = f"exited with status {status}" + ("" if reached or until_step is None else
                                                     f" before its progress line of step {until_step}")
        raise RuntimeError(f"{_shown(command)} {problem}:\n" + "".join(tail))
    return child


def _reap(process: subprocess.Popen) -> tuple[int, int]:
    """Wait for ``process`` with wait4: its exit status (as ``Popen.returncode``) and ``ru_maxrss`` (KiB)."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss


def _shown(command: list[str]) -> str:
    return " ".join(command)


# --- the phases ----------------------------------------------------------------------------------------------------

def text_options(kind: str, vocab_size: int) -> list[str]:
    """revnmt-train's options of a text kind."""
    return [] if kind == "words" else ["--subword", "bpe", "--vocab-size", str(vocab_size)]


def prepare_options(extra: list[str]) -> list[str]:
    """The options of ``extra`` (with their values) that revnmt-prepare takes too: the data options."""
    parser = argparse.ArgumentParser(add_help=False)
    add_data_options(parser, test_set=False)
    _, unknown = parser.parse_known_args(extra)  # the other options, in their order
    kept, others = [], iter(unknown)
    other = next(others, None)
    for token in extra:
        if token == other:
            other = next(others, None)
        else:
            kept.append(token)
    return kept


def folder_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Size and modification time of every file under ``folder``: whether a run wrote into it."""
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


CASE_MARK = ".made-by-data-scale"  # in each case folder this benchmark made: what is inside is its to remove


def case_folder(folder: Path) -> Path:
    """``folder`` for one case's runs, made and marked as this benchmark's; SystemExit if it holds files of someone
    else's (a ``--work`` folder of the user's)."""
    if folder.exists() and not (folder / CASE_MARK).exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise SystemExit(f"data_scale: {folder} holds files this benchmark did not make: give another --work")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CASE_MARK).touch()
    return folder


def fresh(folder: Path) -> Path:
    """``folder``, in a case folder of this benchmark's (:func:`case_folder`), emptied of what an earlier call left."""
    if not (folder.parent / CASE_MARK).exists():
        raise ValueError(f"{folder.parent} is not a case folder this benchmark made")
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def measure_case(prefix: Path, valid: str, pairs: int, kind: str, args: argparse.Namespace, extra: list[str],
                 folder: Path) -> dict:
    """The four phases of one corpus size and text kind, one process at a time; their figures."""
    python = [sys.executable, "-m"]
    data = ["--train", str(prefix), "--valid", valid, "--src", "en", "--tgt", "de",
            *text_options(kind, args.vocab_size)]
    prepared, first_dir, prepared_dir = (fresh(folder / name) for name in ("prepared", "run", "prepared-run"))
    train = [*python, "revnmt.cli.train", *data, "--log-every", "1", "--device", args.device]

    case: dict = {"pairs": pairs, "text": kind}
    _progress(f"{pairs:,} pairs, {kind}: prepare")
    case["prepare"] = _figures(run_child([*python, "revnmt.cli.prepare", *data, "--prepared", str(prepared),
                                          *prepare_options(extra)], args.timeout))
    case["prepare"]["pairs_per_s"] = pairs / case["prepare"]["seconds"]
    prepared_files = folder_state(prepared)

    _progress(f"{pairs:,} pairs, {kind}: first run (prepares {first_dir / 'data'})")
    first = run_child([*train, "--save-dir", str(first_dir), *extra], args.timeout, until_step=1)
    if first.saved_step is None:
        raise RuntimeError(f"{_shown(first.command)}: no 'interrupted at step N' after SIGINT:\n"
                           + "".join(first.stderr_tail))
    case["first_run"] = _figures(first)
    run_data = folder_state(first_dir / "data")

    _progress(f"{pairs:,} pairs, {kind}: resumed run (from step {first.saved_step})")
    resumed = run_child(first.command, args.timeout, until_step=first.saved_step + 1)
    case["resumed_run"] = _figures(resumed) | {"data_rewritten": folder_state(first_dir / "data") != run_data}

    _progress(f"{pairs:,} pairs, {kind}: run on the prepared folder")
    on_prepared = run_child([*train, "--save-dir", str(prepared_dir), "--prepared", str(prepared), *extra],
                            args.timeout, until_step=1)
    case["prepared_run"] = _figures(on_prepared) | {"data_rewritten": folder_state(prepared) != prepared_files}
    return case


def _figures(child: Child) -> dict:
    figures = asdict(child)
    del figures["stderr_tail"]
    return figures


def _progress(message: str) -> None:
    print(f"data_scale: {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# --- the report ----------------------------------------------------------------------------------------------------

COLUMNS = (("pairs", 10), ("text", 6), ("prep s", 8), ("pairs/s", 9), ("prep MiB", 9), ("tree MiB", 9),
           ("1st s", 7), ("1st MiB", 8), ("resume s", 9), ("res MiB", 8), ("prep'd s", 9), ("prep'd MiB", 11))


def table_header() -> str:
    return "".join(f"{name:>{width}}" for name, width in COLUMNS)


def table_row(case: dict) -> str:
    """One line of the table: the size, the text kind and the figures of its four phases."""
    prep, runs = case["prepare"], [case[name] for name in ("first_run", "resumed_run", "prepared_run")]
    cells = [f"{case['pairs']:,}", case["text"], f"{prep['seconds']:.1f}", f"{prep['pairs_per_s']:,.0f}",
             f"{prep['max_rss_mib']:.0f}", _mib(prep["tree_peak_pss_mib"])]
    for run in runs:
        cells += [f"{run['seconds']:.1f}", _mib(run["step_peak_mib"])]
    return "".join(f"{cell:>{width}}" for cell, (_, width) in zip(cells, COLUMNS))


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", nargs="+", type=_positive, default=[100_000, 1_000_000], help="corpus sizes")
    parser.add_argument("--text", nargs="+", choices=TEXT_KINDS, default=list(TEXT_KINDS), help="text kinds")
    parser.add_argument("--vocab-size", type=_positive, default=16_000, help="bpe: pieces of the joint model")
    parser.add_argument("--seed", type=int, default=0, help="of the synthesized corpora")
    parser.add_argument("--work", type=Path, help="corpora and runs (default: a temporary folder)")
    parser.add_argument("--device", default="cpu", help="revnmt-train's --device")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds a phase may take to its figure")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)

    multi30k = find_multi30k()
    valid = str(multi30k / MULTI30K_SPLITS["valid"])
    work = args.work or Path(tempfile.mkdtemp(prefix="data-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    report = {"command": "python benchmarks/data_scale.py " + " ".join(argv), "cpu": cpu_name(),
              "cpu_count": os.cpu_count(), "seed": args.seed, "valid": valid, "work": str(work), "extra": extra,
              "cases": []}
    print(table_header(), flush=True)
    for pairs in args.pairs:
        _progress(f"{pairs:,} pairs: corpus in {work}")
        prefix = synthesize(multi30k / MULTI30K_SPLITS["train"], pairs, args.seed, work)
        for kind in args.text:
            case = measure_case(prefix, valid, pairs, kind, args, extra, case_folder(work / f"{pairs}-{kind}"))
            case["corpus"] = {"prefix": str(prefix), "bytes": sum(Path(f"{prefix}.{lang}").stat().st_size
                                                                 for lang in LANGS)}
            report["cases"].append(case)
            print(table_row(case), flush=True)
            if args.json:  # after every case: a long run that fails later keeps what it measured
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
