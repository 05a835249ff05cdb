"""CUDA-graph decode == eager decode. Needs a CUDA GPU; skipped (with the reason shown by -ra) without one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from llama_ref import assert_same, hf_greedy, make_llama, prompts
from velocity import LLM, SamplingParams
from velocity.engine.graph_shapes import graph_batch_sizes, graph_context_blocks

needs_cuda = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on the device machine)")]


def test_graph_shapes_cover_every_batch_and_context():
    """Runs on CPU: the captured (batch, width) grid covers every batch size and context length."""
    assert graph_batch_sizes(1) == [1] and graph_batch_sizes(12) == [1, 2, 4, 8, 12]
    assert graph_batch_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert graph_context_blocks(256, 16) == [4, 8, 16, 32, 64, 128, 256]
    assert graph_context_blocks(3, 16) == [3]
    assert graph_context_blocks(7, 16) == [4, 7]
    for max_blocks in range(1, 300, 7):
        w = graph_context_blocks(max_blocks, 16)
        assert w == sorted(set(w)) and w[-1] == max_blocks
        # the chosen width is never more than 2x what the batch needs (beyond the smallest)
        for need in range(1, max_blocks + 1):
            chosen = next(x for x in w if x >= need)
            assert chosen <= max(2 * need, w[0])


def greedy(n):
    return SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("gpu_kernels", [True, False])
@needs_cuda[0]
@needs_cuda[1]
def test_cuda_graph_decode_equals_eager(tmp_path, dtype, gpu_kernels):
    """With the GPU kernels (one graph per batch size, decode attention on the blocks in place) and
    without them (graphs per batch size and context width)."""
    make_llama(tmp_path, num_attention_heads=8, num_key_value_heads=2, hidden_size=128)
    ps = prompts([1, 5, 17, 33, 64, 2, 9, 40, 3, 70, 12], seed=4)   # 11: padded up to a larger graph
    outs = {}
    for eager in (True, False):
        llm = LLM(str(tmp_path), device="cuda", dtype=dtype, block_size=16, num_kv_blocks=512,
                  max_num_seqs=16, enforce_eager=eager, gpu_kernels=gpu_kernels)
        runner = llm.engine.worker.runner
        assert bool(runner.graphs) is not eager
        assert runner.by_length is gpu_kernels
        if not eager and gpu_kernels:      # one width: the whole context, read up to each row's length
            assert {w * 16 for _, w in runner.graphs} == {512} and runner.graph_sizes == graph_batch_sizes(16, True)
        elif not eager:  # prompts of 1..70 tokens + 32 new: decoding crosses the 64- and 128-token widths
            assert {w * 16 for _, w in runner.graphs} >= {64, 128}
        outs[eager] = [o.token_ids for o in llm.generate(ps, greedy(32))]
        # batches of every size 1..11 replay graphs as requests finish at different times
        outs[eager, "mixed"] = [o.token_ids for o in llm.generate(ps, [greedy(4 + 3 * i) for i in range(len(ps))])]
    assert_same(outs[False], outs[True], ps, f"CUDA graphs vs eager ({dtype})")
    assert_same(outs[False, "mixed"], outs[True, "mixed"], ps, f"CUDA graphs vs eager, staggered ({dtype})")


@needs_cuda[0]
@needs_cuda[1]
def test_cuda_float32_equals_transformers(tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = make_llama(tmp_path)
    ps = prompts([3, 17, 40, 90], seed=6)
    refs = [hf_greedy(model, p, 24) for p in ps]
    llm = LLM(str(tmp_path), device="cuda", dtype="float32", block_size=16, num_kv_blocks=256, max_num_seqs=8)
    assert_same([o.token_ids for o in llm.generate(ps, greedy(24))], refs, ps, "CUDA graphs fp32 vs transformers")


@needs_cuda[0]
@needs_cuda[1]
def test_chattts_frames_on_cuda_graphs_equal_reference_and_seeds_match_eager(tmp_path):
    """Four-codebook frames and speakers through the captured graphs: fp32 greedy equals the plain
    CPU reference; a seeded sampled request gives the same frames with graphs (the sampler inside
    them) and eager (the eager sampler)."""
    from chattts_ref import RefChatTTS
    from checkpoints import tiny_checkpoint

    torch.backends.cuda.matmul.allow_tf32 = False
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0)
    ref = RefChatTTS(ckpt)
    texts = ["hello", "hello world this is speech", "你好世界", "a", "the world and you and it is to speech"]
    ps = [ref.ids(f"[Stts][spk_emb][speed_5]{t}[Ptts]") for t in texts]
    g = torch.Generator().manual_seed(3)
    spk = [torch.randn(64, generator=g) for _ in texts]
    refs = [ref.greedy_frames(p, 16, s) for p, s in zip(ps, spk)]
    sampled = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, repetition_penalty=1.05, max_new_tokens=16, seed=5)
    seeded = {}
    for eager in (False, True):
        llm = LLM(str(ckpt), device="cuda", dtype="float32", block_size=16, num_kv_blocks=256, max_num_seqs=8,
                  enforce_eager=eager)
        runner = llm.engine.worker.runner
        assert bool(runner.sample_graphs) is not eager
        got = [o.token_ids for o in llm.generate(ps, SamplingParams(temperature=0.0, max_new_tokens=16),
                                                 speakers=spk)]
        for i, (a, r) in enumerate(zip(got, refs)):
            assert a == r, f"eager={eager} prompt {i}:\n velocity:  {a}\n reference: {r}"
        seeded[eager] = [o.token_ids for o in llm.generate(ps, sampled, speakers=spk)]
        assert (runner.graph_sampled > 0) is not eager       # decodes sampled inside the graphs
        assert llm.engine.block_manager.num_used_blocks == 0
    assert seeded[False] == seeded[True]


@needs_cuda[0]
@needs_cuda[1]
def test_audio_decoder_and_pipeline_on_cuda(tmp_path):
    """DVAE + Vocos on CUDA (fp32, TF32 off) match the CPU decode; the whole pipeline streams on CUDA.
    Tolerance: 1e-3 of the signal's peak, for float32 convolutions and FFTs summed in another order."""
    from velocity.model.loading.audio_models import load_dvae, load_vocos
    from checkpoints import tiny_checkpoint
    from velocity.tts.pipeline import TTSPipeline, chattts_params
    from velocity.tts.audio_decoder import AudioDecoder

    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    ckpt = tiny_checkpoint(tmp_path / "tiny", seed=0)
    codes = torch.randint(0, 625, (2, 4, 40), generator=torch.Generator().manual_seed(0))
    audio = {}
    for dev in ("cpu", "cuda"):
        d = torch.device(dev)
        audio[dev] = AudioDecoder(load_dvae(ckpt, d), load_vocos(ckpt, d)).decode(codes).cpu()
    peak = audio["cpu"].abs().max()
    assert (audio["cuda"] - audio["cpu"]).abs().max() <= 1e-3 * peak
    pipe = TTSPipeline(ckpt, device="cuda", num_kv_blocks=256, max_num_seqs=4)
    wav = pipe.synthesize("Hello there. 你好。", params=chattts_params(seed=1, max_new_tokens=20))
    assert wav.dtype == np.float32 and len(wav) > 0 and len(wav) % 512 == 0


@needs_cuda[0]
@needs_cuda[1]
def test_sampling_inputs_reach_a_busy_gpu_unchanged():
    """The sampler's inputs go to the GPU through pinned memory without waiting for it
    (sampler.to_device). With the GPU held busy while batch after batch is made, each batch's
    tensors on the GPU equal the host's (no pinned buffer reused before its copy ran), and the
    exponential noise likewise."""
    from velocity.engine.sampling_rows import sampling_batch
    from velocity.engine.sampler import exponential_noise, to_device
    from velocity.engine.sequence import Sequence

    rng = np.random.default_rng(0)
    V, K = 626, 4

    def batch_seqs(step: int) -> list:
        out = []
        for i in range(12):
            p = (SamplingParams(temperature=0.0, max_new_tokens=100) if i == 7 else
                 SamplingParams(temperature=0.3 + 0.05 * i, top_p=0.7, top_k=20 if i % 3 else 0,
                                repetition_penalty=1.05 if i % 2 else 1.0, seed=i, max_new_tokens=100,
                                min_new_tokens=step + 2 if i % 5 == 0 else 0, stop_token_ids=[V - 1]))
            s = Sequence(f"r{i}", [1, 2, 3], p)
            for t in rng.integers(0, V - 1, size=(step + i % 3, K)):
                s.append(tuple(int(x) for x in t))
            out.append(s)
        return out

    fields = ("rows", "temperatures", "top_k", "top_p", "stop_mask", "first_stop_mask",
              "penalty_rows", "penalty_ids", "penalty_once", "penalty")
    made = []
    for step in range(1, 11):
        torch.cuda._sleep(2_000_000)                       # the stream stays busy while the host goes on
        seqs = batch_seqs(step)
        for style in ("chattts", "transformers"):
            host = sampling_batch(seqs, K, V, {V - 2}, style, 16, "cpu")
            gpu = sampling_batch(seqs, K, V, {V - 2}, style, 16, "cuda")
            noise = exponential_noise(host.keys, K, 20)
            made.append((host, gpu, noise, to_device(noise, "cuda")))
    torch.cuda.synchronize()
    for n, (host, gpu, noise, noise_gpu) in enumerate(made):
        for f in fields:
            a, b = getattr(host, f), getattr(gpu, f)
            assert (a is None) == (b is None), (n, f)
            if a is not None:
                assert b.is_cuda and torch.equal(a, b.cpu()), (n, f)
        assert torch.equal(noise, noise_gpu.cpu()), n
