"""launch.py: its flags, size parsing, and serving locally when --share cannot reach the internet."""

from __future__ import annotations

import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import launch
from app import cli, startup

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ("--model", "--device", "--dtype", "--gpu-memory", "--host-memory", "--chunk-size", "--head-group",
         "--max-context", "--no-kv-cache", "--kv-cache-dir", "--kv-cache-max", "--host", "--port", "--share",
         "--auth", "--max-upload", "--exceed-trained-window", "--kv-8bit", "--kv-disk-dir", "--kv-disk-max",
         "--max-question", "--weights", "--auth-file", "--add-user", "--visitor-questions", "--visitor-upload-max",
         "--visitor-shelf-max")


def test_help_lists_and_explains_every_flag():
    result = subprocess.run([sys.executable, "launch.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in FLAGS:
        assert flag in result.stdout
    text = " ".join(result.stdout.split())  # argparse wraps the help where it likes
    assert "embedded SmolLM2" in text and "20GiB" in text
    # The units a SIZE means, binary (the page's) and decimal (still taken: parsing is not display), issue 51.
    assert "KiB, MiB, GiB, TiB (binary" in text and "KB, MB, GB, TB (decimal" in text and "64GB" not in text


@pytest.mark.parametrize(("text", "size"), [
    ("20GiB", 20 * 2**30), ("16GB", 16 * 10**9), ("512 MiB", 512 * 2**20), ("1.5g", int(1.5 * 2**30)),
    ("4096", 4096), ("64kb", 64_000), ("2TiB", 2 * 2**40),
])
def test_parse_size(text, size):
    assert cli.parse_size(text) == size


@pytest.mark.parametrize("flags", [
    ["--gpu-memory", "lots"], ["--host-memory", "12 parsecs"], ["--host-memory", "0"], ["--chunk-size", "0"],
    ["--head-group", "two"], ["--auth", "nopassword"], ["--dtype", "int3"], ["--kv-cache-max", "plenty"],
    ["--kv-8bit", "int4"], ["--kv-disk-max", "roomy"], ["--weights", "int4"],
])
def test_bad_flags_are_refused(flags, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.build_parser().parse_args(flags)
    assert exit_info.value.code == 2
    assert flags[0] in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "words"), [
    (["--head-group", "99"], "--head-group 99: this model has 3 KV heads"),
    (["--head-group", "2"], "use one of 1, 3"),
    (["--port", "99999"], "not a port number"),
    (["--port", "0"], "not a port number"),
    (["--device", "tpu"], "'tpu' is not a device"),
    (["--device", "cuda:7"], "cuda:7"),
    (["--host-memory", "1000TiB"], "is more than this machine's"),
    (["--host-memory", "0"], "--host-memory"),
    (["--max-upload", "lots"], "--max-upload"),
    (["--max-context", "100000"], "beyond the 8,192 tokens this model was trained"),
    (["--host", "name.invalid"], "--host name.invalid"),
    (["--model", "/no/such/folder"], "--model /no/such/folder: no such file or folder"),
    (["--kv-disk-max", "1GiB"], "--kv-disk-max needs --kv-disk-dir"),
    (["--kv-disk-dir", "/proc/no-such-place"], "--kv-disk-dir /proc/no-such-place: cannot write there"),
    (["--weights", "int8", "--dtype", "float16"], "--weights int8 computes in float32 or bfloat16, not --dtype"),
    (["--weights", "gguf", "--dtype", "bfloat16"], "--weights gguf computes in float32, not --dtype bfloat16"),
])
def test_each_bad_value_is_one_line_and_exit_code_2(flags, words, capsys, busy_ports):
    busy_ports(7860)  # the default port: another app may serve there; the value is still the error reported
    with pytest.raises(SystemExit) as exit_info:
        launch.main(flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.count("\n") == 1 and err.startswith("launch.py: error: ") and words in err, err


def test_gpu_memory_needs_a_gpu_that_has_it(capsys):
    import torch

    flags = ["--gpu-memory", "10000GiB"] + ([] if torch.cuda.is_available() else ["--device", "cpu"])
    with pytest.raises(SystemExit) as exit_info:
        launch.main(flags)
    assert exit_info.value.code == 2 and "--gpu-memory" in capsys.readouterr().err


@pytest.fixture
def busy_ports():
    """``busy(port)`` listens on ``port`` for the test (where something else already does, it stays busy)."""
    sockets = []

    def busy(port: int) -> int:
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:  # already taken: busy, as wanted
            sock.close()
            return port
        sockets.append(sock)
        return sock.getsockname()[1]

    yield busy
    for sock in sockets:
        sock.close()


def test_a_port_in_use_is_refused_before_loading_the_model(capsys, busy_ports, caplog):
    port = busy_ports(0)
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--port", str(port)])
    assert exit_info.value.code == 2 and f"--port {port}: something else already listens" in capsys.readouterr().err
    assert "model ready" not in caplog.text


@pytest.mark.parametrize(("flags", "words"), [
    (["--device", "tpu"], "'tpu' is not a device"), (["--head-group", "99"], "--head-group 99"),
    (["--host-memory", "1000TiB"], "--host-memory"), (["--max-context", "100000"], "beyond the 8,192 tokens"),
])
def test_a_bad_value_is_reported_before_the_port_is_looked_at(flags, words, capsys, busy_ports):
    port = busy_ports(0)
    busy_ports(7860)
    for argv in ([*flags, "--port", str(port)], flags):  # the test's own busy port, and the default one
        with pytest.raises(SystemExit) as exit_info:
            launch.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and words in err and "already listens" not in err, err


@pytest.mark.parametrize("flags", [["--model", "/nonexistent"], ["--model", "./no-such-model.gguf"]])
def test_a_bad_model_path_fails_in_under_3_s_before_torch_loads_even_on_a_busy_port(flags, busy_ports):
    port = busy_ports(0)
    busy_ports(7860)
    # -X importtime lists every module imported: torch must not be among them.
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-X", "importtime", "launch.py", *flags, "--port", str(port)],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - started
    assert result.returncode == 2 and seconds < 3, (seconds, result.stderr[-500:])
    lines = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert len(lines) == 1 and lines[0].startswith("launch.py: error: ") and flags[0] in lines[0], lines
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "gradio" not in imported


@pytest.mark.slow
@pytest.mark.parametrize(("flags", "words"), [
    (["--host-memory", "1KiB"], "--host-memory"),
    (["--max-context", "100"], "--max-context"),
])
def test_start_up_values_below_what_the_model_needs_end_the_start_with_one_line(flags, words):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = subprocess.run([sys.executable, "launch.py", "--no-kv-cache", "--port", str(port), *flags], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("launch.py: error: ") and words in last and "Traceback" not in result.stderr, last
    assert "Running on" not in result.stdout + result.stderr  # never served


def test_the_trained_window_can_be_exceeded_only_on_purpose():
    from engine.models.loader import read_config

    config = read_config(None)
    args = cli.build_parser().parse_args(["--max-context", "100000", "--exceed-trained-window", "--head-group", "3"])
    startup.check_model(args, config)  # no error
    assert startup.make_policy(args).exceed_trained_window is True
    assert "degrade" in cli.build_parser().format_help()
    assert startup.make_policy(cli.build_parser().parse_args([])).exceed_trained_window is False


def test_a_bad_value_from_the_command_line_prints_no_traceback():
    result = subprocess.run([sys.executable, "launch.py", "--device", "tpu"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "launch.py: error: --device: 'tpu' is not a device; use auto, cpu, cuda or cuda:N (see launch.py --help)"]


def test_flags_become_the_offload_policy():
    args = cli.build_parser().parse_args(["--chunk-size", "512", "--head-group", "2", "--gpu-memory", "20GiB",
                                             "--host-memory", "64GB", "--max-context", "100000",
                                             "--host-attention", "all"])
    policy = startup.make_policy(args)
    assert (policy.chunk_size, policy.head_group_size, policy.max_context) == (512, 2, 100_000)
    assert policy.host_attention == "all"
    assert (policy.gpu_memory, policy.host_memory) == (20 * 2**30, 64 * 10**9)
    defaults = startup.make_policy(cli.build_parser().parse_args([]))
    assert defaults.head_group_size is None and defaults.gpu_memory is None and defaults.host_attention == "auto"


def test_kv_cache_flags_become_the_snapshot_store(tmp_path, monkeypatch):
    args = cli.build_parser().parse_args(["--kv-cache-dir", str(tmp_path / "kv"), "--kv-cache-max", "50GiB"])
    store = startup.make_snapshot_store(args)
    assert store.root == tmp_path / "kv" and store.root.is_dir() and store.max_bytes == 50 * 2**30

    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "cache"))  # the default folder, not the user's
    store = startup.make_snapshot_store(cli.build_parser().parse_args([]))
    assert store.root == tmp_path / "cache" / "kv" and store.max_bytes is None

    assert startup.make_snapshot_store(cli.build_parser().parse_args(["--no-kv-cache"])) is None


def test_unusable_kv_cache_dir_turns_saving_off_with_a_warning(tmp_path, caplog):
    (tmp_path / "file").write_text("not a folder")
    args = cli.build_parser().parse_args(["--kv-cache-dir", str(tmp_path / "file")])
    assert startup.make_snapshot_store(args) is None
    assert "will not be saved" in caplog.text and str(tmp_path / "file") in caplog.text


def test_the_start_up_log_names_the_folders_read_documents_are_saved_in(tmp_path):
    from engine import SnapshotStore

    store = SnapshotStore(tmp_path / "kv", max_bytes=2**30)
    local = startup.where_saved(store, private=False, has_auth=False, session_shelves=None)
    assert local == f"saving read documents to {tmp_path / 'kv'} (at most 1.00 GiB)"
    per_user = startup.where_saved(store, private=True, has_auth=True, session_shelves=None)
    assert per_user.startswith(f"saving each user's read documents in a folder of their own under "
                               f"{tmp_path / 'kv' / 'users'} ") and "each)" in per_user
    tabs = tmp_path / "visitors" / "pid-1"
    per_tab = startup.where_saved(store, private=True, has_auth=False, session_shelves=tabs)
    assert per_tab.startswith(f"saving each visitor's read documents in a folder of their own under {tabs}, "
                              "deleted 10 minutes after their browser's last tab closes (at most 1.00 GiB each)")
    assert "saving read documents to" not in per_tab and f"{tmp_path / 'kv'} is not used without --auth" in per_tab


@pytest.mark.slow
def test_share_without_internet_keeps_serving_locally(tmp_path):
    if cli.can_reach_share_server():
        pytest.skip("this machine can reach the share server; the offline path cannot be tested here")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = tmp_path / "launch.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "launch.py", "--share", "--port", str(port),
                                    "--kv-cache-dir", str(tmp_path / "kv")], cwd=ROOT,
                                   stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while True:
            assert process.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        output = log.read_text()
        assert "Could not create a share link" in output and "Serving locally" in output
        # Visitors kept apart without --auth save in per-tab folders: the shared folder is not advertised.
        assert f"saving read documents to {tmp_path / 'kv'}" not in output
        assert (f"saving each visitor's read documents in a folder of their own under {cli.VISITOR_SHELVES}"
                in output)
        assert f"{tmp_path / 'kv'} is not used without --auth" in output
        assert "WARNING headinfer.launch: no login is asked" in output  # and the page says so too
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_8bit_and_disk_flags_reach_the_policy(tmp_path):
    args = cli.build_parser().parse_args(["--kv-8bit", "int8", "--kv-disk-dir", str(tmp_path),
                                             "--kv-disk-max", "2GiB"])
    policy = startup.make_policy(args)
    assert (policy.kv_dtype, policy.disk_dir, policy.disk_memory) == ("int8", str(tmp_path), 2 * 2**30)


_SPY = """
import json, os, sys
seen = {}
class TorchImportSpy:  # records the allocator settings at the moment torch is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "at_torch_import" not in seen:
            seen["at_torch_import"] = {k: os.environ.get(k) for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                                                                      "OMP_WAIT_POLICY", "MALLOC_MMAP_THRESHOLD_",
                                                                      "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")}
        return None
sys.meta_path.insert(0, TorchImportSpy())
import launch
seen["torch_after_import_launch"] = "torch" in sys.modules
try:
    launch.main(["--self-check", "--device", "cuda:7"])  # loads torch (then refuses the device here)
except SystemExit:
    pass
print(json.dumps(seen))
"""


def _launch_env_at_torch_import(names: tuple[str, ...], user: dict[str, str]) -> dict:
    """What ``_SPY`` saw: ``launch.main`` run in a child whose environment has none of ``names`` but ``user``'s."""
    import json
    import os

    env = {k: v for k, v in os.environ.items() if k not in names} | user
    result = subprocess.run([sys.executable, "-c", _SPY], cwd=ROOT, capture_output=True, text=True, env=env,
                            timeout=300)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="expandable segments are set on Linux only")
@pytest.mark.parametrize("user", [None, "max_split_size_mb:512"])
def test_launch_sets_expandable_segments_before_torch_loads_keeping_the_users_settings(user):
    """Issue 30: on the H200 the allocator reserved 25.68e9 bytes for a plan of 23.59e9 (allocated 23.45e9)."""
    seen = _launch_env_at_torch_import(("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"),
                                       {"PYTORCH_CUDA_ALLOC_CONF": user} if user else {})
    assert seen["torch_after_import_launch"] is False
    expected = f"{user},expandable_segments:True" if user else "expandable_segments:True"
    assert seen["at_torch_import"]["PYTORCH_CUDA_ALLOC_CONF"] == expected


@pytest.mark.parametrize("user", [None, "ACTIVE"])
def test_launch_makes_openmp_threads_sleep_before_torch_loads_unless_the_user_chose(user):
    """torch's spinning OpenMP threads took the cores of the engine's C pools (2K decode on two threads: 37.7 ms
    against 33.3-34.5 with PASSIVE)."""
    seen = _launch_env_at_torch_import(("OMP_WAIT_POLICY",), {"OMP_WAIT_POLICY": user} if user else {})
    assert seen["torch_after_import_launch"] is False
    assert seen["at_torch_import"]["OMP_WAIT_POLICY"] == (user or "PASSIVE")


_HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20), "MALLOC_ARENA_MAX": "1"}


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc malloc's")
@pytest.mark.parametrize("user", [None, "1048576"])
def test_launch_sets_glibc_malloc_thresholds_before_torch_loads_unless_the_user_chose(user):
    """A prefill's large temporaries were fresh pages every chunk (2.1M page faults in a 2K-token read)."""
    seen = _launch_env_at_torch_import(tuple(_HEAP), {"MALLOC_TRIM_THRESHOLD_": user} if user else {})
    assert seen["torch_after_import_launch"] is False
    expected = {name: None for name in _HEAP} | {"MALLOC_TRIM_THRESHOLD_": user} if user else _HEAP
    assert {name: seen["at_torch_import"][name] for name in _HEAP} == expected


_FAULTS = """
import json, resource, sys, threading, torch
import process_env

def mlp(x):  # a 512-token chunk's MLP temporaries (Qwen2.5-1.5B), made and freed in transformers' order
    gate, up = torch.empty(512, 8960).fill_(1.0), torch.empty(512, 8960).fill_(2.0)
    act = torch.empty(512, 8960).fill_(3.0)
    del gate
    hidden = torch.empty(512, 8960).fill_(4.0)
    del act, up
    out = torch.empty(512, 1536).fill_(5.0)
    del hidden
    return out

def faults():  # page faults of eight layers' MLPs
    before, x = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, torch.empty(512, 1536)
    for _ in range(8):
        x = mlp(x)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

environ = {}
is_set = process_env.keep_freed_heap(environ) if sys.argv[1] == "kept" else False
counts = []
def compute():  # on a worker thread, as the app computes
    for _ in range(3):  # the heap grows to its size (and glibc's own thresholds settle on the first frees)
        faults()
    counts.extend(faults() for _ in range(3))
worker = threading.Thread(target=compute)
worker.start()
worker.join()
print(json.dumps({"faults": sum(counts), "is_set": is_set, "environ": environ}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc malloc's")
def test_kept_heap_gives_a_chunks_temporaries_the_same_pages_again_on_a_worker_thread():
    import json
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    seen = {}
    for mode in ("default", "kept"):
        result = subprocess.run([sys.executable, "-c", _FAULTS, mode], cwd=ROOT, capture_output=True, text=True,
                                env=env, timeout=300)
        seen[mode] = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["kept"]["is_set"] and seen["kept"]["environ"] == _HEAP
    assert seen["default"]["faults"] > 3 * 8 * 512, seen  # glibc's defaults: at least 2 MiB of fresh pages a layer
    assert seen["kept"]["faults"] * 10 < seen["default"]["faults"], seen


class _Libc:
    def __init__(self, answer: int):
        self.answer, self.calls = answer, []

    def mallopt(self, parameter: int, value: int) -> int:
        self.calls.append((parameter, value))
        return self.answer


def test_malloc_thresholds_keep_a_users_choice_and_a_refusal_changes_nothing():
    from process_env import keep_freed_heap

    for user in ({"MALLOC_MMAP_THRESHOLD_": "65536"}, {"MALLOC_ARENA_MAX": "4"},
                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}):
        environ, libc = dict(user), _Libc(1)
        assert keep_freed_heap(environ, libc) is False and environ == user and libc.calls == []
    environ, libc = {}, _Libc(0)  # a C library whose mallopt refuses (musl's returns 0)
    assert keep_freed_heap(environ, libc) is False and environ == {} and len(libc.calls) == 3
    environ, libc = {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=0"}, _Libc(1)
    assert keep_freed_heap(environ, libc) is True and libc.calls == [(-1, 256 << 20), (-3, 32 << 20), (-8, 1)]
    assert environ == {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=0"} | _HEAP


def test_a_users_own_expandable_segments_choice_is_kept_and_other_platforms_are_left_alone():
    from process_env import use_expandable_segments

    environ = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    assert use_expandable_segments(environ, "linux") is None and environ == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}
    environ = {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8"}  # the newer name, read first by torch
    assert use_expandable_segments(environ, "linux") == "PYTORCH_ALLOC_CONF"
    assert environ == {"PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.8,expandable_segments:True"}
    environ = {}
    assert use_expandable_segments(environ, "win32") is None and environ == {}


def test_the_library_loads_a_model_as_the_app_does_by_default():
    # A script calling ``engine.load_model(source)`` gets what ``python launch.py`` serves (issue 33): the same
    # weights mode (GGUF blocks on the CPU, not 7 GB of dense fp32), dtype and device choice.
    import inspect

    from engine import load_model

    defaults = {name: p.default for name, p in inspect.signature(load_model).parameters.items()}
    args = cli.build_parser().parse_args([])
    assert (defaults["source"], defaults["device"], defaults["dtype"], defaults["weights"]) == \
        (args.model, args.device, args.dtype, args.weights)


def test_the_host_kernel_is_built_before_ready_not_beside_the_first_plan(tmp_path, monkeypatch, caplog):
    """A clean cache's kernel build (C compilers, 15-30 s on a busy 2-core machine) ran in the first forward after
    ready, the background measurement's, and its compilers held the first upload's plan 10 s: it is built beside the
    model's loading and finished before ready (the thread is joined), so no compiler runs after ready."""
    import logging

    import engine
    from engine.kv import native
    from engine.read_time.estimator import ReadEstimator

    from archs import build_pair  # the tiny test models' builder (tests/engine/helpers)

    _, model = build_pair("llama-gqa", tmp_path / "tiny")
    events = []

    def load_model(*args, **kwargs):  # (the tiny model has no tokenizer; the session needs none here)
        events.append("loading")
        return model, None

    def slow_build():  # the compilers, here half a second
        events.append("build started")
        time.sleep(0.5)
        events.append("built")

    class Ready(Exception):
        pass

    def measuring_after_ready(self, then=None):
        events.append("ready")
        raise Ready

    monkeypatch.setattr(native, "kernel", slow_build)  # (what engine.build_host_kernel calls)
    monkeypatch.setattr(engine, "load_model", load_model)
    monkeypatch.setattr(ReadEstimator, "measure_read_rate_in_background", measuring_after_ready)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with caplog.at_level(logging.INFO), pytest.raises(Ready):
        launch.main(["--model", str(tmp_path / "tiny"), "--device", "cpu", "--port", str(port), "--no-kv-cache"])
    assert sorted(events[:2]) == ["build started", "loading"]  # beside each other
    assert events[2:] == ["built", "ready"] and "model ready" in caplog.text
