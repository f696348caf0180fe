"""Twenty visitors at once through the app's own API, on loopback: each uploads a note of its own, reads it and asks
for its secret code word; a few leave mid-answer. Every one must be answered once at the front of the line or
refused with a reason, no answer may be lost or reach another visitor, memory must stay bounded and the page must
stay quick for the owner.

    python -m benchmarks.app.load_visitors [--visitors 20 --leaving 5 --timeout 600]

The app is ``launch.py`` in a process of its own (the embedded SmolLM2-135M, ``HEADINFER_CPU_MODEL=embedded``, a free
port, saved documents in a temporary folder), by default on ``--host 0.0.0.0``: reachable by others, so each visitor's
shelf is kept apart as with ``--share``. Each visitor is a ``gradio_client.Client`` of its own (one browser tab: its
own session, its own heartbeat) sending the ``Origin`` a same-origin page sends; its note holds a code word no other
note has, so an answer delivered to the wrong visitor shows another's word. Those leaving close their tab once the
first token of a long answer arrived (the job cancelled, the client closed: the app's unload); a greedy few ask a
second question from the same tab while the first is in flight (answered after it, or refused by a per-tab cap with
its reason). Meanwhile an owner
fetches the page (``GET /``) and calls a light endpoint (``/saved``, through the same queue) every 0.5 s, and the app
process's RSS (its children included) is sampled every 0.5 s. Writes docs/benchmarks/load-visitors.md.
"""

from __future__ import annotations

import argparse
import html
import logging
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
WORDS = ("AMBER", "BIRCH", "COBALT", "DAHLIA", "EMBER", "FJORD", "GARNET", "HERON", "INDIGO", "JUNIPER", "KESTREL",
         "LUPIN", "MAGPIE", "NUTMEG", "OSPREY", "PLOVER", "QUARTZ", "RAVEN", "SAFFRON", "TUNDRA", "UMBER", "VIOLET",
         "WALNUT", "XENON", "YARROW", "ZINNIA")
PLACES = ("Kerrow Point", "Ashby Fen", "Brannock Hill", "Cold Harbour", "Dunmore Quay", "Elder Moss", "Fallow Ridge",
          "Gull Rock", "Hollin Bay", "Iron Gate", "Jackdaw Cove", "Kelda Falls", "Lark Rise", "Marten Wood",
          "Northam Sound", "Otter Creek", "Pike Lough", "Quarry End", "Rook Island", "Saltings", "Thorn Cross",
          "Upwater", "Vale Mill", "Wren Field", "Yew Tor", "Zeal Head")
QUESTION = "What is the secret code word of this note?"
SECOND_QUESTION = "Who knows the secret code word?"  # asked by a greedy visitor while its first question is in flight
LONG_QUESTION = "Retell this note at length, sentence by sentence, and explain each sentence."


@dataclass(frozen=True)
class LoadConfig:
    """One load run: how many visitors, how many leave mid-answer, the answers' lengths and the run's bound."""

    visitors: int = 20
    leaving: int = 5
    greedy: int = 2  # visitors who ask a second question while their first is in flight (a cap may refuse it)
    max_tokens: int = 24  # a code word's answer
    leave_tokens: int = 200  # those who leave ask for a long answer, so that they leave in the middle of it
    rounds: int = 2  # the crowd comes this many times, one round after another (memory must not grow round by round)
    timeout: float = 600.0  # the whole run, from the first visitor's arrival
    sample_seconds: float = 0.5  # the owner's polls and the RSS samples
    host: str = "0.0.0.0"  # reachable by others: visitors kept apart; "127.0.0.1" for the owner's own app
    same_origin: bool = True  # send the Origin header a page served by the app sends
    app_args: tuple[str, ...] = ()  # more launch.py flags

    def leaves(self, visitor: int) -> bool:
        """Whether ``visitor`` leaves mid-answer: ``leaving`` of them, spread evenly over the arrivals."""
        if self.leaving <= 0:
            return False
        step = self.visitors / self.leaving
        return any(int(k * step + step - 1) == visitor for k in range(self.leaving))

    def is_greedy(self, visitor: int) -> bool:
        """Whether ``visitor`` asks twice at once: ``greedy`` of them, spread evenly, none of those leaving."""
        step = self.visitors / max(self.greedy, 1)
        return not self.leaves(visitor) and any(int(k * step) == visitor for k in range(self.greedy))


@dataclass
class Visitor:
    """One visitor's run: what it did, how long each step waited, and how it ended."""

    number: int
    code: str
    file_name: str
    leaves: bool
    greedy: bool = False
    times: dict = field(default_factory=dict)  # step -> seconds (connect, upload, read_wait, read, wait, ttft, total)
    step: str = "connecting"  # what it is doing now: connecting, uploading, reading, asking
    outcome: str = "not started"  # answered | refused | left | error | timeout
    second: str = ""  # a greedy visitor's second question: answered | refused | ..., with the reason
    reason: str = ""  # a refusal's or an error's words
    answer: str = ""  # the answer's text (the model's words, without its stats line)
    places: dict = field(default_factory=dict)  # step -> its first place in the device's line (none: at once)
    read_pauses: int = 0  # "Paused after ... so that another visitor goes first" lines during its read
    seen: str = ""  # every text the app sent this visitor (tables, statuses, chat), for the cross-delivery check


def note_text(number: int) -> tuple[str, str]:
    """(the note's text, its code word): a few sentences about one place, the code word in the middle."""
    word, place = WORDS[number], PLACES[number]
    code = f"{word}-{17 + 7 * number}"
    text = (f"Field note {number + 1} from {place}.\n"
            f"The morning at {place} was cold and the tide turned at {5 + number % 7} o'clock. "
            f"The keeper of the {place} station counted {12 + number} boats in the harbour. "
            f"The secret code word of this note is {code}. Only the keeper of {place} knows it. "
            f"In the evening the lamp at {place} was lit and the keeper wrote the weather in the log.\n")
    return text, code


def _text(value: object) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", str(value)))


def _words(status: object) -> str:
    """A status line's sentence, without its closing full stop (the report puts it inside its own)."""
    return " ".join(_text(status).split()).rstrip(".")


def _message_text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # Gradio 6 sends content as typed parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _answer_of(chat: object) -> str:
    """The model's words in the chat's last answer ("" before the first token; the stats line left out)."""
    if not isinstance(chat, list) or not chat or chat[-1].get("role") != "assistant":
        return ""
    words = _message_text(chat[-1]).split('<span class="answer-stats">')[0].strip()
    return "" if words in ("…", "") or words.startswith("*(") else _text(words).strip()


def _kind(status: object) -> str | None:
    """A status line's kind (info, ok, warn, error, wait), None for an output that left it unchanged."""
    found = re.search(r'data-kind="(\w+)"', str(status)) if isinstance(status, str) else None
    return found.group(1) if found else None


def follow(job, deadline: float, on_output: Callable[[tuple, float], bool] = lambda out, at: False) -> bool:
    """Waits for ``job``, calling ``on_output(output, arrival)`` for each streamed output once (polled every 50 ms);
    returns False when ``on_output`` said to stop following it, or at ``deadline``."""
    seen = 0
    while True:
        done = job.done()
        outputs = job.outputs()
        for output in outputs[seen:]:
            if on_output(output, time.monotonic()):
                return False
        seen = len(outputs)
        if done:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


# -- one visitor --------------------------------------------------------------------------------
def visit(visitor: Visitor, url: str, note: Path, config: LoadConfig, start: threading.Barrier, deadline: float,
          headers: dict) -> Visitor:
    """Arrives with the others, connects, uploads ``note``, reads it, asks; records each step's time and the end."""
    from gradio_client import Client

    start.wait()
    arrived = time.monotonic()
    client = None
    try:
        client = Client(url, verbose=False, headers=headers)
        visitor.times["connect"] = time.monotonic() - arrived
        if _upload(client, visitor, note, deadline) and _read(client, visitor, deadline):
            _ask(client, visitor, config, deadline)
    except Exception as exc:  # the outcome the invariants judge: an error must still say why
        visitor.outcome, visitor.reason = "error", f"while {visitor.step}: {type(exc).__name__}: {exc}".strip()
        logger.warning("visitor %d: %s", visitor.number, visitor.reason)
    finally:
        if client is not None:
            client.close()
    return visitor


def _refused(visitor: Visitor, status: object, what: str) -> bool:
    """Records a refusal (the status line's words) unless ``status`` is a step's ok."""
    if _kind(status) in ("ok", "info"):
        return False
    visitor.outcome, visitor.reason = "refused", f"{what}: {_words(status) or 'no reason given'}"
    return True


def _note_place(visitor: Visitor, step: str, status: str) -> None:
    """The visitor's first place in the device's line for ``step`` (1: next), from its first "waiting" line."""
    found = re.search(r'data-queue-position="(\d+)"', status)
    if found and "Waiting for the compute device" in status:
        visitor.places.setdefault(step, int(found.group(1)))


def _upload(client, visitor: Visitor, note: Path, deadline: float) -> bool:
    from gradio_client import handle_file

    began, visitor.step = time.monotonic(), "uploading"
    job = client.submit([handle_file(str(note))], api_name="/upload")
    if not follow(job, deadline):
        visitor.outcome = "timeout"
        return False
    table, plan, _truncate, status = job.result()
    visitor.times["upload"] = time.monotonic() - began
    visitor.seen += _text(table) + _text(status)
    return not _refused(visitor, status, "upload")


def _read(client, visitor: Visitor, deadline: float) -> bool:
    began, last, visitor.step = time.monotonic(), [None, False], "reading"  # the last status, paused

    def on_output(output: tuple, at: float) -> bool:
        progress, status = output[0], output[1]
        if "read_wait" not in visitor.times and ('data-state="running"' in str(progress) or _kind(status) == "info"
                                                 and "Reading" in str(status)):
            visitor.times["read_wait"] = at - began
        if isinstance(status, str):
            last[0] = status
            visitor.seen += _text(status)
            # Said about every second while it waits (counted once), then at place 0 once it is at the front again.
            paused = "Paused after" in status and 'data-queue-position="0"' not in status
            visitor.read_pauses += paused and not last[1]
            last[1] = paused
            _note_place(visitor, "read", status)
        return False

    job = client.submit(False, api_name="/read")
    if not follow(job, deadline, on_output):
        visitor.outcome = "timeout"
        return False
    job.result()
    visitor.times["read"] = time.monotonic() - began
    return not _refused(visitor, last[0], "read")


def _ask(client, visitor: Visitor, config: LoadConfig, deadline: float) -> None:
    began, last, visitor.step = time.monotonic(), {"chat": [], "status": None, "second": None}, "asking"

    def on_output(output: tuple, at: float) -> bool:
        chat, _question, status = output[0], output[1], output[2]
        if visitor.greedy and last["second"] is None:  # the first is in the app's hands: a second from the same tab
            last["second"] = client.submit(SECOND_QUESTION, [], config.max_tokens, 0.0, api_name="/ask")
        if isinstance(chat, list):
            last["chat"] = chat
        if isinstance(status, str):
            last["status"] = status
            _note_place(visitor, "ask", status)
            if "wait" not in visitor.times and "Thinking" in status:
                visitor.times["wait"] = at - began
        if "ttft" not in visitor.times and _answer_of(chat):
            visitor.times["ttft"] = at - began
            visitor.times.setdefault("wait", visitor.times["ttft"])
            return visitor.leaves  # leaving now: the first token arrived, the rest of a long answer is ahead
        return False

    question, tokens = (LONG_QUESTION, config.leave_tokens) if visitor.leaves else (QUESTION, config.max_tokens)
    job = client.submit(question, [], tokens, 0.0, api_name="/ask")
    finished = follow(job, deadline, on_output)
    if last["second"] is not None:
        visitor.second = _second(last["second"], visitor, deadline)
    visitor.answer = _answer_of(last["chat"])
    visitor.seen += " ".join(_message_text(m) for m in last["chat"] if isinstance(m, dict))
    if not finished:
        if visitor.leaves and "ttft" in visitor.times:
            visitor.outcome = "left"
            job.cancel()  # the tab closes: the client stops listening, and its close ends the heartbeat
        else:
            visitor.outcome = "timeout"
        return
    job.result()
    visitor.times["total"] = time.monotonic() - began
    if not _refused(visitor, last["status"], "ask"):
        visitor.outcome = "answered" if visitor.answer else "no answer"


def _second(job, visitor: Visitor, deadline: float) -> str:
    """How a greedy visitor's second question ended: "answered", or "refused: <the status line's words>"."""
    if not follow(job, deadline):
        return "timeout"
    chat, status = [], None
    for output in job.outputs():
        chat = output[0] if isinstance(output[0], list) else chat
        status = output[2] if isinstance(output[2], str) else status
    visitor.seen += " ".join(_message_text(m) for m in chat if isinstance(m, dict))
    if _kind(status) == "ok" and _answer_of(chat):
        return "answered"
    return f"refused: {_words(status)}" if _kind(status) in ("error", "warn") and _words(status) \
        else f"neither answered nor refused ({_words(status) or 'no status'})"


# -- the app, the owner, the memory ---------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_app(folder: Path, config: LoadConfig, *, ready_timeout: float = 600.0):
    """``launch.py`` serving the embedded model on a free port; yields (its URL, the process, its log file)."""
    port = free_port()
    log = folder / "app.log"
    env = {**os.environ, "HEADINFER_CPU_MODEL": "embedded", "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "launch.py", "--host", config.host, "--port", str(port),
               "--kv-cache-dir", str(folder / "kv"), *config.app_args]
    with log.open("w") as sink:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        ready_by = time.monotonic() + ready_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the app exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            if time.monotonic() > ready_by:
                raise RuntimeError(f"the app did not answer within {ready_timeout:.0f} s:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        yield url, process, log
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def app_rss(pid: int) -> int:
    """The resident bytes of process ``pid`` and all its children (a file's extraction may run in a child)."""
    import psutil

    process = psutil.Process(pid)
    total = process.memory_info().rss
    for child in process.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


class Sampler:
    """Every ``every`` seconds on a thread of its own until stopped: the app's RSS (children included), the owner's
    page fetch and its light API call, each with its latency."""

    def __init__(self, url: str, pid: int, every: float, headers: dict):
        self.url, self.pid, self.every, self.headers = url, pid, every, headers
        self.rss: list[tuple[float, int]] = []
        self.page_seconds: list[float] = []
        self.api_seconds: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._memory, daemon=True),
                         threading.Thread(target=self._owner, daemon=True)]

    def __enter__(self) -> Sampler:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _memory(self) -> None:
        while not self._stop.is_set():
            self.rss.append((time.monotonic(), app_rss(self.pid)))
            self._stop.wait(self.every)

    def _owner(self) -> None:
        from gradio_client import Client

        owner = Client(self.url, verbose=False, headers=self.headers)
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    request = urllib.request.Request(self.url, headers=self.headers)
                    with urllib.request.urlopen(request, timeout=60) as response:
                        response.read()
                    self.page_seconds.append(time.monotonic() - began)
                    began = time.monotonic()
                    owner.predict(api_name="/saved")
                    self.api_seconds.append(time.monotonic() - began)
                except Exception as exc:  # counted and reported: the owner's page failing is a finding
                    self.failures.append(f"{type(exc).__name__}: {exc}")
                self._stop.wait(max(self.every - (time.monotonic() - began), 0.0))
        finally:
            owner.close()


# -- the run ----------------------------------------------------------------------------------------
def run_load(config: LoadConfig, folder: Path) -> dict:
    """Starts the app, sends ``config.visitors`` visitors at once, and returns what was measured."""
    from concurrent.futures import ThreadPoolExecutor

    if not 1 <= config.visitors < len(WORDS):
        raise ValueError(f"visitors: 1 to {len(WORDS) - 1} (one code word each, and the warm-up's)")
    notes = {}
    for number in [*range(config.visitors), len(WORDS) - 1]:  # the last word is the warm-up visit's
        notes[number] = folder / f"note-{number + 1:02d}-{WORDS[number].lower()}.txt"
        notes[number].write_text(note_text(number)[0])

    def arrivals() -> list[Visitor]:
        return [Visitor(n, note_text(n)[1], notes[n].name, config.leaves(n), config.is_greedy(n))
                for n in range(config.visitors)]

    warm = Visitor(len(WORDS) - 1, note_text(len(WORDS) - 1)[1], notes[len(WORDS) - 1].name, False)
    rounds = []  # per round: its visitors, how long it took, the app's RSS once its tabs had closed
    with running_app(folder, config) as (url, process, log):
        headers = {"Origin": url.rstrip("/")} if config.same_origin else {}
        rss_start = app_rss(process.pid)
        # One visit first, alone, as the owner trying the app would: a first start's one-off work (the retrieval
        # heads' calibration, minutes on a busy CPU) lands there, and the load meets the app as it usually is.
        visit(warm, url, notes[warm.number], replace(config, leaving=0, greedy=0), threading.Barrier(1),
              time.monotonic() + config.timeout, headers)
        with Sampler(url, process.pid, config.sample_seconds, headers) as sampler:
            time.sleep(2 * config.sample_seconds)  # the app at rest, before anyone arrives
            rss_ready = app_rss(process.pid)
            began = time.monotonic()
            deadline = began + config.timeout
            for number in range(config.rounds):  # the same crowd again: what a round kept, the next one finds
                visitors, start, round_began = arrivals(), threading.Barrier(config.visitors), time.monotonic()
                with ThreadPoolExecutor(config.visitors) as pool:
                    list(pool.map(lambda v: visit(v, url, notes[v.number], config, start, deadline, headers),
                                  visitors))
                closed = _tabs_closed(log, 1 + config.visitors * (number + 1), time.monotonic() + 60) - 1
                rounds.append({"visitors": visitors, "elapsed": time.monotonic() - round_began,
                               "tabs_closed": closed - config.visitors * number, "rss_after": app_rss(process.pid)})
            elapsed = time.monotonic() - began
        app_log = log.read_text()
    return {"config": config, "visitors": rounds[-1]["visitors"], "rounds": rounds, "warm": warm, "elapsed": elapsed,
            "rss_start": rss_start, "rss_ready": rss_ready, "rss_after": rounds[-1]["rss_after"],
            "rss_peak": max(rss for _, rss in sampler.rss), "page_seconds": sampler.page_seconds,
            "api_seconds": sampler.api_seconds, "owner_failures": sampler.failures,
            "app_errors": app_errors(app_log)}


def app_errors(log: str) -> list[str]:
    """Each traceback or ERROR line in the app's log, with the lines that follow it (up to the next log line)."""
    found, lines = [], log.splitlines()
    for index, line in enumerate(lines):
        if line.startswith("Traceback") or " ERROR " in line:
            block = [line]
            for following in lines[index + 1:index + 40]:
                if re.match(r"\d{4}-\d\d-\d\d ", following):
                    break
                block.append(following)
            found.append("\n".join(block))
    return found


def _tabs_closed(log: Path, expected: int, until: float) -> int:
    """How many tabs the app saw close (its unload's log line), waiting for ``expected`` of them until ``until``."""
    while True:
        closed = log.read_text().count("browser session closed")
        if closed >= expected or time.monotonic() > until:
            return closed
        time.sleep(0.5)


def cross_deliveries(visitors: list[Visitor]) -> list[str]:
    """Each visitor shown another's code word or file name: "visitor 3 saw KESTREL (visitor 11's)"."""
    found = []
    for visitor in visitors:
        seen = visitor.seen.upper()
        for other in visitors:
            if other is not visitor and (WORDS[other.number] in seen or other.file_name.upper() in seen):
                found.append(f"visitor {visitor.number + 1} saw {WORDS[other.number]} (visitor {other.number + 1}'s)")
    return found


def invariants(result: dict) -> list[str]:
    """What went wrong, in words; [] when every visitor of every round was answered or refused with a reason (those
    leaving left mid-answer), nothing reached the wrong visitor, and the app noticed every closed tab."""
    problems, rounds = [], result["rounds"]
    for number, run in enumerate(rounds):
        said = _round_problems(run, result["warm"])
        problems += [(f"round {number + 1}: " if len(rounds) > 1 else "") + problem for problem in said]
    if result["warm"].outcome != "answered":
        problems.append(f"the warm-up visit: {result['warm'].outcome} {result['warm'].reason}".strip())
    problems += [f"owner: {failure}" for failure in result["owner_failures"][:3]]
    return problems


def _round_problems(run: dict, warm: Visitor) -> list[str]:
    problems = []
    for v in run["visitors"]:
        expected = ("left", "refused") if v.leaves else ("answered", "refused")
        if v.outcome not in expected or v.outcome == "refused" and not v.reason:
            problems.append(f"visitor {v.number + 1}: {v.outcome} {v.reason}".strip())
        asked = v.outcome == "answered" or v.reason.startswith("ask:")  # a visitor refused its read never asks
        if v.greedy and asked and not v.second.startswith(("answered", "refused: ")):
            problems.append(f"visitor {v.number + 1}'s second question: {v.second or 'never sent'}")
    problems += cross_deliveries([*run["visitors"], warm])
    if run["tabs_closed"] < len(run["visitors"]):
        problems.append(f"the app saw {run['tabs_closed']} of {len(run['visitors'])} tabs close")
    return problems


# -- the report -------------------------------------------------------------------------------------
def _seconds(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _spread(values: list[float]) -> str:
    if not values:
        return "– (no sample)"
    ordered = sorted(values)
    p95 = ordered[min(int(0.95 * len(ordered)), len(ordered) - 1)]
    return f"median {statistics.median(ordered):.2f} s, p95 {p95:.2f} s, max {ordered[-1]:.2f} s ({len(ordered)} polls)"


def report(result: dict, stamp: dict) -> list[str]:
    """The markdown report: what was run, the figures, then a row per visitor."""
    from ..records import machine_line

    config = result["config"]
    lines = [
        f"# {config.visitors} visitors at once (SmolLM2-135M, CPU, loopback)", "",
        f"`python -m benchmarks.app.load_visitors --visitors {config.visitors} --leaving {config.leaving} --greedy "
        f"{config.greedy} --rounds {config.rounds}`: `launch.py` (embedded SmolLM2-135M, `--host {config.host}`) and "
        f"{config.visitors} `gradio_client` visitors arriving together, each uploading a note of its own (~110 tokens, "
        "a code word no other note has), reading it and asking for its code word "
        f"({config.max_tokens} tokens at most, temperature 0); {config.leaving} ask for a long answer "
        f"({config.leave_tokens} tokens) and close their tab at its first token; {config.greedy} ask a second question "
        "from the same tab while the first is in flight. One visit runs alone before them (a first start's one-off "
        f"work lands there); the crowd comes {config.rounds} times, one round after another (the table: the last "
        f"round). The owner fetches the page and calls `/saved` every {config.sample_seconds} s throughout; the app's "
        "RSS (children included) is sampled as often. Times are seconds from the visitor's own request. *Read*: its "
        "first *place* in the compute device's line (1: next; – at once), its *turn*, when it reached the front "
        "(\"Reading…\"), the *pauses* it made between layers so that another visitor went first (each time it gave "
        "way), *done*. *Ask*: its first place, *wait* until it reached the front (\"Thinking…\"), *TTFT* to its "
        "first token, *total* to the last. "
        + machine_line(stamp, " (2 cores shared with other jobs)"), "",
        *summary(result), "",
        "| visitor | code | connect | upload | read: place | turn | pauses | done | ask: place | wait | TTFT | "
        "total | outcome |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for v in result["visitors"]:
        t = v.times
        role = " (leaves)" if v.leaves else " (asks twice)" if v.greedy else ""
        outcome = (v.outcome + (f" ({v.reason})" if v.reason else "")).replace("|", "/")
        lines.append(f"| {v.number + 1}{role} | {v.code} | {_seconds(t.get('connect'))} | "
                     f"{_seconds(t.get('upload'))} | {v.places.get('read', '–')} | {_seconds(t.get('read_wait'))} | "
                     f"{v.read_pauses} | {_seconds(t.get('read'))} | {v.places.get('ask', '–')} | "
                     f"{_seconds(t.get('wait'))} | {_seconds(t.get('ttft'))} | {_seconds(t.get('total'))} | "
                     f"{outcome} |")
    return lines


def summary(result: dict) -> list[str]:
    """The figures as bullet lines: each round's outcomes, deliveries and refusals, memory, the owner's latency."""
    config, warm, gib = result["config"], result["warm"], 2**30
    lines = [_round_line(number, run, len(result["rounds"])) for number, run in enumerate(result["rounds"])]
    memory = ", ".join(f"{run['rss_after'] / gib:.2f} GiB after round {number + 1}'s tabs closed"
                       for number, run in enumerate(result["rounds"]))
    return [
        *lines,
        f"- The visit alone before them: {warm.outcome}, read {_seconds(warm.times.get('read'))} s, answer "
        f"{_seconds(warm.times.get('total'))} s.",
        f"- App RSS: {result['rss_start'] / gib:.2f} GiB at start, {result['rss_ready'] / gib:.2f} GiB after the "
        f"visit alone, {result['rss_peak'] / gib:.2f} GiB peak, {memory}.",
        f"- Owner's page (`GET /`): {_spread(result['page_seconds'])}; `/saved`: {_spread(result['api_seconds'])}; "
        f"failures: {len(result['owner_failures'])}.",
        f"- Whole run: {result['elapsed']:.0f} s (bound {config.timeout:.0f} s). Errors in the app's log: "
        f"{len(result['app_errors'])}."]


def _round_line(number: int, run: dict, rounds: int) -> str:
    visitors = run["visitors"]
    outcomes = {kind: sum(v.outcome == kind for v in visitors) for kind in ("answered", "refused", "left")}
    own = sum(v.outcome == "answered" and WORDS[v.number] in v.answer.upper() for v in visitors)
    others = ", ".join(f"{v.number + 1} {v.outcome}" for v in visitors if v.outcome not in outcomes)
    refusals = "; ".join(f"{v.number + 1}: {v.reason}" for v in visitors if v.outcome == "refused")
    seconds = "; ".join(f"{v.number + 1}: {v.second}" for v in visitors if v.greedy)
    title = f"Round {number + 1} ({run['elapsed']:.0f} s)" if rounds > 1 else "Outcomes"
    return (f"- {title}: "
            f"{outcomes['answered']} answered ({own} with their own code word), {outcomes['refused']} refused, "
            f"{outcomes['left']} left mid-answer; others: {others or 'none'}. Sent to the wrong visitor: "
            f"{', '.join(cross_deliveries(visitors)) or 'nothing'}. Tabs the app saw close: {run['tabs_closed']} of "
            f"{len(visitors)}. Refusals: {refusals or 'none'}. A second question from the same tab while the first "
            f"was in flight: {seconds or 'none asked'}.")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.app.load_visitors")
    p.add_argument("--visitors", type=int, default=20)
    p.add_argument("--leaving", type=int, default=5, help="visitors who close their tab mid-answer")
    p.add_argument("--rounds", type=int, default=2, help="times the crowd comes, one round after another")
    p.add_argument("--greedy", type=int, default=2, help="visitors who ask a second question at once")
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the visitors' run may take in all")
    p.add_argument("--host", default="0.0.0.0", help="the app's --host (0.0.0.0: visitors kept apart)")
    p.add_argument("--no-origin", action="store_true", help="send no Origin header (gradio_client's default)")
    p.add_argument("--out", default="docs/benchmarks")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per poll otherwise
    from ..records import run_stamp

    config = LoadConfig(visitors=args.visitors, leaving=args.leaving, greedy=args.greedy, rounds=args.rounds,
                        max_tokens=args.max_tokens, timeout=args.timeout, host=args.host,
                        same_origin=not args.no_origin)
    stamp = run_stamp("cpu")
    with tempfile.TemporaryDirectory(prefix="headinfer-load-") as folder:
        result = run_load(config, Path(folder))
    lines = report(result, stamp)
    problems = invariants(result)
    lines += ["", f"Invariants: {'all held' if not problems else 'BROKEN: ' + '; '.join(problems)}."]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "load-visitors.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
