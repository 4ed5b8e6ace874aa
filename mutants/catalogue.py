"""The catalogue of planted-bug kernels.

A :class:`Mutant` is a source edit of one reference kernel: the target file, an exact snippet of
it and the snippet that replaces it. :func:`build` reads the target source, checks the snippet
occurs exactly once (so a change to the kernel fails loudly instead of planting nothing),
replaces it and executes the result as a fresh module; the mutant kernel is that module's
``attention``, with the capabilities the original declares. A mutant of one of the ``triton``
kernel's modules (:data:`TRITON_MODULES`) executes the modules that import it again on top of
it, so the kernel is the host module's ``attention`` calling the mutant.

Every mutant is an attribute of this module, built on first access, so the suite loads one with
``--kernel mutants.catalogue:NAME``. Each docstring names the bug class and the public report
(or the well-known kernel) whose bug it imitates.
"""

from __future__ import annotations

import functools
import linecache
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCKED = "refimpl/blocked.py"
TRITON_KERNELS = "kernels/triton_attention_kernels.py"
TRITON_LAUNCH = "kernels/triton_attention_launch.py"
TRITON = "kernels/triton_attention.py"
#: The ``triton`` kernel's modules in import order, each importing those before it: a mutant of
#: one is built with the modules after it executed again on top of it (:func:`build`).
TRITON_MODULES = (TRITON_KERNELS, TRITON_LAUNCH, TRITON)
#: The ``triton`` kernel's decode entry point, which the dense module imports at its first call:
#: a mutant of it is the dense kernel with the mutated ``kvcache`` (:func:`build`).
TRITON_DECODE = "kernels/triton_decode.py"


class MutantDrift(RuntimeError):
    """A mutant's original snippet no longer occurs exactly once in its target source."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: replace ``original`` (exactly one occurrence) in ``target`` by ``replacement``.

    Attributes:
        name: the attribute name in this module (``mutants.catalogue:NAME``).
        target: the mutated file, relative to the repository root.
        original: the exact snippet of the target source that is replaced.
        replacement: the snippet planted instead.
        bug_class: the class of bug, as the runner's table names it.
        doc: what the mutant does and which real bug it imitates.
        first: property files (``test_x.py``) ``mutants.run`` runs first on it (where its bug
            shows, when the usual first files would spend its budget), and tests
            (``test_x.py::test_name``) that run before all of them; empty: its target's order.
    """

    name: str
    target: str
    original: str
    replacement: str
    bug_class: str
    doc: str
    first: tuple[str, ...] = ()

    @property
    def kernel_family(self) -> str:
        return "blocked" if self.target == BLOCKED else "triton"

    @property
    def modules(self) -> tuple[str, ...]:
        """The files :func:`build` executes, in order: the target, then those built on it."""
        if self.target in TRITON_MODULES:
            return TRITON_MODULES[TRITON_MODULES.index(self.target):]
        return (self.target,)


MUTANTS: tuple[Mutant, ...] = (
    # ----------------------------------------------------------------- blocked (refimpl/blocked.py)
    Mutant(
        "blocked_no_rescale",
        BLOCKED,
        "acc = alpha[..., None] * acc + p.to(q.dtype).to(acc_t) @ vj",
        "acc = acc + p.to(q.dtype).to(acc_t) @ vj",
        "online-softmax rescale omitted",
        "The output accumulator is not rescaled by exp(m_old - m_new) when the running max grows "
        "(l still is). The correction FlashAttention-2's Algorithm 1 is built around; hand-written "
        "kernels that drop it are exact whenever the first key tile holds the row max, so tests "
        "with one tile or sorted logits miss it.",
    ),
    Mutant(
        "blocked_max_init_zero",
        BLOCKED,
        "m = torch.full((b, q1 - q0), NEG_INF, dtype=acc_t, device=q.device)",
        "m = torch.full((b, q1 - q0), 0.0, dtype=acc_t, device=q.device)",
        "running max initialised at a finite sentinel",
        "The running max starts at 0 instead of -inf, so it never drops below 0: rows whose logits "
        "are all very negative underflow exp() to 0 and come out as empty rows (o = 0, lse = -inf). "
        "Imitates finite-sentinel kernels (the -10000 masks of pre-SDPA Hugging Face attention, "
        "m_i = 0 initialisations in hand-written Triton kernels).",
    ),
    Mutant(
        "blocked_tail_scored_zero",
        BLOCKED,
        "                cols = torch.arange(k0, k0 + block_n, device=q.device)\n"
        "                kj = kh[:, k0 : k0 + block_n].to(acc_t)\n"
        "                vj = vh[:, k0 : k0 + block_n].to(acc_t)\n"
        "                s, _ = _scores(qi, kj, scale, rows, cols[: kj.shape[1]], causal, offset, nk, var, "
        "h)\n",
        "                cols = torch.arange(k0, k0 + block_n, device=q.device)\n"
        "                pad = (0, 0, 0, k0 + block_n - min(nk, k0 + block_n))\n"
        "                kj = torch.nn.functional.pad(kh[:, k0 : k0 + block_n], pad).to(acc_t)\n"
        "                vj = torch.nn.functional.pad(vh[:, k0 : k0 + block_n], pad).to(acc_t)\n"
        "                s, _ = _scores(qi, kj, scale, rows, cols, causal, offset, k0 + block_n, var, h)\n",
        "tail tile not masked",
        "The ragged last key tile is zero-padded (as a masked load with other=0 pads it) but not "
        "masked, so each padded key scores 0 and takes softmax weight. Imitates jax-ml/jax#27224 "
        "(Pallas GPU FlashAttention correct only when sequence lengths are multiples of the block) "
        "and the early Triton tutorial kernel, which assumed N % BLOCK == 0.",
    ),
    Mutant(
        "blocked_tail_skipped",
        BLOCKED,
        "for k0 in var.order.visit(range(k_start, k_stop, block_n)):",
        "for k0 in var.order.visit(range(k_start, k_stop // block_n * block_n, block_n)):",
        "tail tile skipped",
        "The forward loop stops at the last whole key tile, so the ragged tail (and a causal "
        "diagonal that ends mid-tile) is never read. Imitates kernels that compute the loop bound "
        "as N // BLOCK_N (amorehead/jvp_flash_attention#13 asserts N % 32 == 0 for this reason).",
    ),
    Mutant(
        "blocked_causal_top_left",
        BLOCKED,
        "from ..contract.masks import causal_offset\n",
        "from ..contract.masks import causal_offset as _aligned_offset\n\n\n"
        "def causal_offset(nq, nk):\n"
        "    return _aligned_offset(nq, nk, 'top-left')\n",
        "causal aligned top-left",
        "causal=True is aligned top-left (query i sees keys j <= i) while the kernel declares "
        "bottom-right (j <= i + Nk - Nq). FlashAttention 2.1 switched to bottom-right "
        "(Dao-AILab/flash-attention#951, #517); PyTorch SDPA is_causal and xformers stayed top-left; "
        "NVIDIA/cutlass#2336 reports the Blackwell FMHA causal mask wrong when qlen != klen.",
    ),
    Mutant(
        "blocked_diagonal_strict",
        BLOCKED,
        "visible = visible & (cols[None, :] <= rows[:, None] + offset)",
        "visible = visible & (cols[None, :] < rows[:, None] + offset)",
        "diagonal masked off by one",
        "The causal mask uses < instead of <=, hiding the diagonal (each query's own key) in "
        "forward and backward; with Nq == Nk the first query row sees no key at all.",
    ),
    Mutant(
        "blocked_empty_rows_nan",
        BLOCKED,
        "m_safe = torch.where(m_new == NEG_INF, 0.0, m_new)",
        "m_safe = m_new",
        "NaN on fully masked rows",
        "A row whose visible keys are all masked keeps m = -inf and computes exp(-inf - (-inf)) = "
        "NaN. Imitates pytorch/pytorch#103963 (scaled_dot_product_attention gives NaN for rows "
        "with no visible key), the long-standing MultiheadAttention fully-masked-row NaN.",
    ),
    Mutant(
        "blocked_bwd_ignores_causal",
        BLOCKED,
        "s, dcap = _scores(qi, kj, scale, rows, cols, causal, offset, nk, var, h)",
        "s, dcap = _scores(qi, kj, scale, rows, cols, False, offset, nk, var, h)",
        "backward ignores the causal flag",
        "The backward recomputes P = exp(S - lse) without the causal mask, so future keys get "
        "gradient. Imitates backward kernels that mask only the forward (the causal-backward "
        "care point raised in Dao-AILab/flash-attention#436).",
    ),
    Mutant(
        "blocked_bwd_skips_key_tail",
        BLOCKED,
        "for k0 in var.order.visit(range(0, nk, block_n)):",
        "for k0 in var.order.visit(range(0, nk - nk % block_n, block_n)):",
        "backward ignores the tail",
        "The backward loops over whole key tiles only: the ragged last tile gets dk = dv = 0 and "
        "contributes nothing to dq. Imitates backward kernels written for N % BLOCK == 0 "
        "(amorehead/jvp_flash_attention#13) with the assert removed.",
    ),
    Mutant(
        "blocked_lse_without_log_l",
        BLOCKED,
        "lse[:, h, q0:q1] = torch.where(empty, NEG_INF, m + torch.log(l_safe))",
        "lse[:, h, q0:q1] = torch.where(empty, NEG_INF, m)",
        "lse wrong (log(l) dropped)",
        "lse is saved as the running max m without + log(l), so it is wrong as an output and the "
        "backward's P = exp(S - lse) is unnormalised. The formula confusion of "
        "Dao-AILab/flash-attention#404 (log sum exp(x) vs log sum exp(x - max)).",
    ),
    Mutant(
        "blocked_delta_dodo",
        BLOCKED,
        "delta = (do.to(acc_t) * o.to(acc_t)).sum(-1)",
        "delta = (do.to(acc_t) * do.to(acc_t)).sum(-1)",
        "D = rowsum(dO * O) wrong",
        "The backward preprocess computes Delta = rowsum(dO * dO) instead of rowsum(dO * O), a "
        "one-token typo in the preprocess kernel every FA2 backward has (the Triton tutorial's "
        "_bwd_preprocess, quoted in triton-lang/triton#1934).",
    ),
    Mutant(
        "blocked_scale_ignored",
        BLOCKED,
        "scale = default_scale(q.shape[-1], scale)",
        "scale = default_scale(q.shape[-1], None)",
        "explicit scale ignored",
        "An explicit softmax scale is dropped on the way to the kernel, which always uses "
        "1/sqrt(D). Imitates Dao-AILab/flash-attention#2651 (FA4 Sm80 backward overwrote "
        "softmax_scale with None) and wrappers that forget to forward softmax_scale.",
    ),
    Mutant(
        "blocked_dk_scale_twice",
        BLOCKED,
        "dk[:, hk, k0:k1] += scale * (ds_lp.transpose(-1, -2) @ qi)",
        "dk[:, hk, k0:k1] += scale * scale * (ds_lp.transpose(-1, -2) @ qi)",
        "scale applied twice in dK",
        "dK is scaled twice. The old Triton tutorial backward folds sm_scale into dS "
        "(ds = p * dp * sm_scale, quoted in triton-lang/triton#919); a port that also scales dK "
        "at write-back applies it twice, invisible at scale 1.",
    ),
    Mutant(
        "blocked_strides_contiguous",
        BLOCKED,
        "    check_dense(q, k, v)\n",
        "    check_dense(q, k, v)\n"
        "    q, k, v = (t.as_strided(t.shape, t.new_empty(t.shape).stride(), t.storage_offset())\n"
        "               for t in (q, k, v))\n",
        "strides assumed contiguous",
        "Inputs are read as if contiguous from their storage offset, ignoring their strides. "
        "Imitates flagos-ai/FlagGems#5896 (flash attention wrong for a transposed V), "
        "NVIDIA/TransformerEngine#1195 (cuDNN fused attention ignoring strides) and "
        "Dao-AILab/flash-attention#2670 (SM100 hd256 forward hard-coded contiguous strides).",
    ),
    Mutant(
        "blocked_gqa_head_modulo",
        BLOCKED,
        "kh, vh = k[:, _kv_head(h, group)], v[:, _kv_head(h, group)]",
        "kh, vh = k[:, h % k.shape[1]], v[:, h % k.shape[1]]",
        "GQA head mapped wrong",
        "The forward maps query head h to kv head h % Hkv (interleaved) instead of h // group. "
        "Imitates XunhaoLai/native-sparse-attention-triton#27 (wrong head-count division in the "
        "GQA head split of a Triton FlashAttention backward).",
    ),
    Mutant(
        "blocked_nondeterministic",
        BLOCKED,
        "            for k0 in var.order.visit(range(k_start, k_stop, block_n)):\n",
        "            starts = list(range(k_start, k_stop, block_n))\n"
        "            for k0 in [starts[i] for i in torch.randperm(len(starts)).tolist()]:\n",
        "non-deterministic results",
        "Key tiles are visited in a random order (as split-KV or atomics reduce in arrival "
        "order): mathematically the same answer, bitwise different on every call. Imitates the "
        "FA2 backward's atomicAdd dQ (Dao-AILab/flash-attention#414: dq differs run to run).",
    ),
    Mutant(
        "blocked_exp_without_max",
        BLOCKED,
        "m_new = torch.maximum(m, s.amax(-1))",
        "m_new = torch.zeros_like(m)",
        "exp without max subtraction",
        "The running max is never taken, so P = exp(S) overflows for logits above ~88 (fp32) and "
        "inf / inf gives NaN. Imitates naive softmax kernels; mlc-ai/mlc-llm#1870 and "
        "apache/tvm#16667 fixed NaN attention from fp16 overflow on large Q/K.",
    ),
    Mutant(
        "blocked_acc_in_input_dtype",
        BLOCKED,
        "                l = alpha * l + p.sum(-1)  # noqa: E741\n"
        "                z = _dropout(var, b, h, rows, cols[: kj.shape[1]], acc_t)\n"
        "                p = p if z is None else p * z  # P * Z weights V; l stays the softmax's\n"
        "                acc = alpha[..., None] * acc + p.to(q.dtype).to(acc_t) @ vj\n",
        "                l = (alpha * l + p.sum(-1)).to(q.dtype).to(acc_t)  # noqa: E741\n"
        "                z = _dropout(var, b, h, rows, cols[: kj.shape[1]], acc_t)\n"
        "                p = p if z is None else p * z\n"
        "                acc = alpha[..., None] * acc + p.to(q.dtype).to(acc_t) @ vj\n"
        "                acc = acc.to(q.dtype).to(acc_t)\n",
        "low-precision accumulation",
        "The running sum l and the output accumulator are kept in the input dtype (fp16) between "
        "key tiles, so rounding errors accumulate over the sequence. Imitates fp16-accumulator "
        "attention (thu-ml/SageAttention#93 pv_accum fp16; Dao-AILab/flash-attention#2250, FP8 "
        "tensor-core accumulation losing accuracy on long contexts).",
    ),
    Mutant(
        "blocked_lse_saved_low_precision",
        BLOCKED,
        "lse = torch.empty((b, hq, nq), dtype=acc_t, device=q.device)",
        "lse = torch.empty((b, hq, nq), dtype=q.dtype, device=q.device)",
        "lse not saved properly",
        "lse is saved in the input dtype (fp16) instead of fp32, so the backward recomputes P from "
        "an lse rounded to ~1e-3 relative and the returned lse breaks the float32 contract. "
        "Imitates kernels that allocate softmax_lse like the output (torch.empty_like(q[..., 0])).",
    ),
    # ------------------------------------------------ blocked variants (refimpl/blocked.py)
    Mutant(
        "blocked_varlen_key_leak",
        BLOCKED,
        "o, lse = _BlockedAttention.apply(_bhnd(q[sq]), _bhnd(k[sk]), _bhnd(v[sk]), sinks, *args)",
        "nxt = slice(sk.start, sk.stop + 1)\n"
        "        o, lse = _BlockedAttention.apply(_bhnd(q[sq]), _bhnd(k[nxt]), _bhnd(v[nxt]), sinks, *args)",
        "varlen sequence boundary leaks",
        "Each packed sequence also attends to the first key of the next sequence (an inclusive end "
        "index on cu_seqlens_k). The class of flash-attention#1042 and vllm PR #51257: keys of "
        "another sequence visible through a boundary computed one token too far.",
    ),
    Mutant(
        "blocked_cu_seqlens_off_by_one",
        BLOCKED,
        "return [(slice(cq[s], cq[s + 1]), slice(ck[s], ck[s + 1])) for s in range(len(cq) - 1)]",
        "return [(slice(cq[s], cq[s + 1]), slice(ck[s] + (s > 0), ck[s + 1])) for s in range(len(cq) - 1)]",
        "cu_seqlens off by one",
        "Every sequence after the first starts one key late (cu_seqlens_k read as if it held "
        "1-based starts), so its first key is never seen: the off-by-one of hand-written varlen "
        "offset arithmetic.",
    ),
    Mutant(
        "blocked_varlen_alibi_first_row",
        BLOCKED,
        "slopes_s = None if slopes is None else slopes[s : s + 1]",
        "slopes_s = None if slopes is None else slopes[:1]",
        "per-sequence parameter read from sequence 0",
        "Per-sequence (B, Hq) ALiBi slopes are read from row 0 for every packed sequence: the "
        "batch index of a varlen kernel taken from the program id of the first sequence.",
    ),
    Mutant(
        "blocked_paged_last_page",
        BLOCKED,
        "page, slot = block_table[i, pos // k_cache.shape[1]].long(), pos % k_cache.shape[1]",
        "last = max(0, length // k_cache.shape[1] - 1)\n"
        "            page = block_table[i, torch.clamp(pos // k_cache.shape[1], max=last)].long()\n"
        "            slot = pos % k_cache.shape[1]",
        "last partial page mapped wrong",
        "The logical page of a sequence's last, partially filled page is clamped to its last full "
        "page, so the tail keys are read from the wrong physical page. Imitates paged-KV block "
        "table indexing bugs (flash-attention PR #2711 fixed an out-of-bounds block table read).",
    ),
    Mutant(
        "blocked_cache_length_ignored",
        BLOCKED,
        "pos = torch.arange(length, device=k_cache.device)  # the positions read: j < L_b, no others",
        "pos = torch.arange(k_cache.shape[1] if block_table is None else block_table.shape[1] * "
        "k_cache.shape[1], device=k_cache.device)",
        "cache length ignored",
        "Decode reads the whole cache capacity instead of the first cache_seqlens[b] positions, so "
        "stale entries past the sequence (NaN in the suite) are attended to: the garbage a real "
        "cache holds after a sequence is evicted and its pages reused.",
    ),
    Mutant(
        "blocked_split_empty_nan",
        BLOCKED,
        "o, lse = (o_i, lse_i) if o is None else merge_partials(o, lse, o_i, lse_i)",
        "if o is None:\n"
        "            o, lse = o_i, lse_i\n"
        "        else:\n"
        "            new = torch.logaddexp(lse, lse_i)\n"
        "            o = o * torch.exp(lse - new)[..., None] + o_i * torch.exp(lse_i - new)[..., None]\n"
        "            lse = new",
        "split-KV combine NaN on empty splits",
        "The split-KV combine rescales each partial by exp(lse_s - lse) without guarding lse = -inf: "
        "a row no split sees (an empty row) gets exp(-inf + inf) = NaN. The combine-kernel bug "
        "class of flash-decoding implementations (splits that see no key).",
    ),
    Mutant(
        "blocked_splits_drop_keys",
        BLOCKED,
        "per_split = -(-tiles // num_splits) * block_n  # keys per run: ceil(tiles / num_splits) tiles",
        "per_split = tiles // num_splits * block_n",
        "split-KV drops keys",
        "Keys per split are floor(tiles / num_splits) tiles, so the remainder (and everything when "
        "num_splits exceeds the key blocks) is never read. Imitates wrong output at num_splits "
        "16/32 in GQA decode (flash-attention#1647).",
    ),
    Mutant(
        "blocked_window_left_off_by_one",
        BLOCKED,
        "visible = visible & (cols[None, :] >= rows[:, None] + offset - left)",
        "visible = visible & (cols[None, :] > rows[:, None] + offset - left)",
        "window off by one",
        "The window's left edge is exclusive: a window of `left` keys sees left - 1 (the "
        "sliding-window regression class of flash-attention#1366).",
    ),
    Mutant(
        "blocked_window_top_left",
        BLOCKED,
        "    if left >= 0:\n"
        "        visible = visible & (cols[None, :] >= rows[:, None] + offset - left)\n"
        "    if right >= 0:\n"
        "        visible = visible & (cols[None, :] <= rows[:, None] + offset + right)\n",
        "    if left >= 0:\n"
        "        visible = visible & (cols[None, :] >= rows[:, None] - left)\n"
        "    if right >= 0:\n"
        "        visible = visible & (cols[None, :] <= rows[:, None] + right)\n",
        "window aligned top-left",
        "The window is centred on query i's own index instead of i + Nk - Nq: right whenever "
        "Nq == Nk, wrong in decode and chunked prefill (the alignment mix-up of causal masks, "
        "for windows).",
    ),
    Mutant(
        "blocked_window_drops_causal",
        BLOCKED,
        "    if causal:\n        visible = visible & (cols[None, :] <= rows[:, None] + offset)\n",
        "    if causal and var.window == (-1, -1):\n"
        "        visible = visible & (cols[None, :] <= rows[:, None] + offset)\n",
        "window replaces the causal mask",
        "With a sliding window the causal mask is not applied, so a window with right > 0 sees "
        "future tokens under causal=True: vllm PR #51257 (window combined with per-sequence causal "
        "masking attends to future tokens).",
    ),
    Mutant(
        "blocked_softcap_before_scale",
        BLOCKED,
        "        t = torch.tanh(s / var.softcap)\n        s, dcap = var.softcap * t, 1 - t * t\n",
        "        t = torch.tanh(s / scale / var.softcap)\n"
        "        s, dcap = scale * var.softcap * t, 1 - t * t\n",
        "softcap applied before scaling",
        "The cap is applied to the raw q.k logits and the scale after it (scale * cap * tanh(qk / "
        "cap)) instead of cap * tanh(scale * qk / cap): Gemma-2-style softcap ported in the wrong "
        "order.",
    ),
    Mutant(
        "blocked_alibi_sign",
        BLOCKED,
        "s = s - var.slopes[:, h, None, None] * (rows[:, None] + offset - cols[None, :]).abs()",
        "s = s + var.slopes[:, h, None, None] * (rows[:, None] + offset - cols[None, :]).abs()",
        "ALiBi sign wrong",
        "The ALiBi bias is added instead of subtracted: distant keys are favoured.",
    ),
    Mutant(
        "blocked_alibi_top_left",
        BLOCKED,
        "s = s - var.slopes[:, h, None, None] * (rows[:, None] + offset - cols[None, :]).abs()",
        "s = s - var.slopes[:, h, None, None] * (rows[:, None] - cols[None, :]).abs()",
        "ALiBi distance aligned top-left",
        "The ALiBi distance is |i - j| instead of |i + Nk - Nq - j|: right when Nq == Nk, wrong "
        "for decode and Nq != Nk.",
    ),
    Mutant(
        "blocked_sink_missing_from_lse",
        BLOCKED,
        "lse[:, h, q0:q1] = torch.where(empty, NEG_INF, m + torch.log(l_safe))",
        "sink = 0.0 if var.sinks is None else torch.exp(var.sinks[h].to(m.dtype) - m)\n"
        "            lse[:, h, q0:q1] = torch.where(empty, NEG_INF, m + torch.log(l_safe - sink))",
        "sink missing from lse",
        "The output is normalised with the sink in the denominator but the returned lse leaves it "
        "out, so a backward or a split-KV combine that trusts the lse is wrong.",
    ),
    Mutant(
        "blocked_dsinks_sign",
        BLOCKED,
        "dsinks = -(torch.exp(z - lse) * delta).sum((0, 2)).to(var.sinks.dtype)",
        "dsinks = (torch.exp(z - lse) * delta).sum((0, 2)).to(var.sinks.dtype)",
        "sink gradient sign wrong",
        "The learnable sinks' gradient has the wrong sign (d lse / d z = +p_sink, but d o / d z = "
        "-p_sink * o): training pushes the sinks the wrong way.",
    ),
    # ----------------------------------------------------------- blocked dropout (refimpl/blocked.py)
    Mutant(
        "blocked_dropout_no_rescale",
        BLOCKED,
        "    return var.dropout.factor(batch, h, rows[None, :, None], cols[None, None, :], dtype)\n",
        "    return var.dropout.keep(batch, h, rows[None, :, None], cols[None, None, :]).to(dtype)\n",
        "dropout without the 1/(1-p) rescale",
        "Dropped probabilities are zeroed but the kept ones are not scaled by 1/(1 - p), in the "
        "forward and the backward alike (so the gradients match the forward): o is biased by a "
        "factor 1 - p. The rescale FlashAttention folds into its final normalisation "
        "(rp_dropout); a kernel that zeroes P in its inner loop and forgets it there.",
    ),
    Mutant(
        "blocked_dropout_backward_fresh_mask",
        BLOCKED,
        "                z = _dropout(var, q.shape[0], h, rows, cols, acc_t)\n",
        "                drop = var.dropout and replace(var.dropout, seed=var.dropout.seed + 1)\n"
        "                z = _dropout(replace(var, dropout=drop), q.shape[0], h, rows, cols, acc_t)\n",
        "dropout mask differs between forward and backward",
        "The backward regenerates its mask from the next random numbers instead of the forward's "
        "(a Philox offset advanced between the two, the RNG state not saved for the backward): "
        "the gradients are those of another mask than the forward applied. FlashAttention saves "
        "rng_state in its autograd context for this reason.",
    ),
    Mutant(
        "blocked_dropout_heads_share_mask",
        BLOCKED,
        "    return var.dropout.factor(batch, h, rows[None, :, None], cols[None, None, :], dtype)\n",
        "    return var.dropout.factor(batch, 0, rows[None, :, None], cols[None, None, :], dtype)\n",
        "dropout RNG offset reused across heads",
        "The mask's counter ignores the head, so every head of a batch element drops the same "
        "entries: each head's o is still an unbiased estimate, but the heads' noise is perfectly "
        "correlated. The per-(batch, head) Philox subsequence computed from the batch index alone.",
    ),
    Mutant(
        "blocked_dropout_batch_share_mask",
        BLOCKED,
        "    batch = torch.arange(b, device=rows.device)[:, None, None]\n",
        "    batch = torch.zeros(b, dtype=torch.int64, device=rows.device)[:, None, None]\n",
        "dropout RNG offset reused across batch elements",
        "The mask's counter ignores the batch element, so every sequence of a batch drops the "
        "same entries. The per-(batch, head) Philox offset computed from the head index alone.",
    ),
    Mutant(
        "blocked_dropout_before_normalisation",
        BLOCKED,
        "                l = alpha * l + p.sum(-1)  # noqa: E741\n"
        "                z = _dropout(var, b, h, rows, cols[: kj.shape[1]], acc_t)\n"
        "                p = p if z is None else p * z  # P * Z weights V; l stays the softmax's\n",
        "                z = _dropout(var, b, h, rows, cols[: kj.shape[1]], acc_t)\n"
        "                p = p if z is None else p * z\n"
        "                l = alpha * l + p.sum(-1)  # noqa: E741\n",
        "dropout applied before the softmax normalisation",
        "The forward drops (and rescales) exp(S - m) before the row sum is taken, so the output is "
        "renormalised over the kept keys and lse is that of the kept logits, not the undropped "
        "softmax's: dropout of the unnormalised scores, as a mask added to the logits.",
    ),
    # -------------------------------------------------------------- blocked FP8 (refimpl/blocked.py)
    Mutant(
        "blocked_fp8_v_descale_twice",
        BLOCKED,
        "                vj = vh[:, k0 : k0 + block_n].to(acc_t)\n",
        "                vj = vh[:, k0 : k0 + block_n].to(acc_t)\n"
        "                if var.descale is not None:  # V dequantised as it is loaded, and in the epilogue\n"
        "                    vj = vj * var.descale[1][:, h, None, None]\n",
        "FP8 descale applied twice",
        "V's tiles are dequantised as they are loaded (v8 * v_descale) and the epilogue multiplies "
        "the output by v_descale as well, so o carries v_descale squared: right only at a descale of "
        "1, which tests that quantise without scaling have. The fold of FlashAttention-3 (v_descale "
        "once, on the normalised output) half-ported onto a kernel that dequantises on load "
        "(ROCm/aiter#2267 moved the descales into the kernel's existing ops for this reason).",
    ),
    Mutant(
        "blocked_fp8_q_descale_ignored",
        BLOCKED,
        "    return None if descales is None else descales.per_query_head(hq)\n",
        "    return None if descales is None else replace(descales, q=None).per_query_head(hq)  # q's: 1\n",
        "FP8 descale not applied",
        "q_descale is checked but never reaches the tile loops, which take FA3's default of 1: the "
        "logits are those of q's FP8 values, off by the factor q_descale. "
        "sgl-project/sglang#20705 (FP8 scales silently falling back to 1.0 on some backends), "
        "NVIDIA/TensorRT-LLM#1921 (q converted to FP8 with a scale of 1.0).",
    ),
    Mutant(
        "blocked_fp8_cache_scales_ignored",
        BLOCKED,
        "    fp8 = _fp8(check_cache_scales(q, k_cache, v_cache, k_scale, v_scale,\n"
        "                                  shapes=attention.capabilities.fp8.cache_scales), hq)\n",
        "    check_cache_scales(q, k_cache, v_cache, k_scale, v_scale,\n"
        "                       shapes=attention.capabilities.fp8.cache_scales)\n"
        "    fp8 = None  # the scales checked, then dropped: the cache read as its FP8 values\n",
        "FP8 descale not applied",
        "Decode checks the FP8 cache's k_scale and v_scale and then reads the cache as its raw FP8 "
        "values, as if both were 1. flashinfer-ai/flashinfer#4979 (BatchPrefillWithRaggedKVCacheWrapper "
        "ignores k_scale / v_scale for an fp8 KV cache), lightseekorg/tokenspeed#759 review (an FA4 "
        "FP8 path passing the unadjusted softmax scale and never applying v_scale).",
    ),
    Mutant(
        "blocked_fp8_descale_per_tensor",
        BLOCKED,
        "    return None if descales is None else descales.per_query_head(hq)\n",
        "    if descales is None:\n"
        "        return None\n"
        "    qk, v = descales.per_query_head(hq)\n"
        "    return tuple(t.reshape(-1)[:1].expand(t.shape) for t in (qk, v))  # the first group's for all\n",
        "FP8 per-tensor descale where per-head is declared",
        "The descales are read through a scalar pointer: every batch element and kv head gets the "
        "first one's, right for per-tensor descales and wrong for the (Hkv,) and (B, Hkv) ones the "
        "kernel declares (dense, varlen and the decode cache alike). sgl-project/sgl-kernel-xpu#252 "
        "review (scale_v read as a single scalar while the API passes per-(batch, kv_head) scales).",
    ),
    Mutant(
        "blocked_fp8_lse_unfolded",
        BLOCKED,
        "lse[:, h, q0:q1] = torch.where(empty, NEG_INF, m + torch.log(l_safe))",
        "lse[:, h, q0:q1] = torch.where(\n"
        "                empty, NEG_INF,\n"
        "                (m if var.descale is None else m / var.descale[0][:, h, None]) + torch.log(l_safe))",
        "softmax scale folded into the descale wrongly",
        "The softmax scale and the q and k descales are folded into one factor for the exponent, "
        "but the lse is written from the running max with the softmax scale alone (m * scale "
        "instead of m * scale * q_descale * k_descale, in the exp2 kernels' raw-score units): o is "
        "right, the lse (and a backward or split-KV combine built on it) is not. The fold of "
        "NVIDIA/cudnn-frontend#520 (scale_softmax_log2 = scale * descale_q * descale_k * log2(e), "
        "with a scale dropped from where it belongs).",
    ),
    Mutant(
        "blocked_fp8_p_cast_at_v_descale",
        BLOCKED,
        "                acc = alpha[..., None] * acc + p.to(q.dtype).to(acc_t) @ vj\n",
        "                vd = 1.0 if var.descale is None else var.descale[1][:, h, None, None]\n"
        "                acc = alpha[..., None] * acc + (p * vd).to(q.dtype).to(acc_t) / vd @ vj\n",
        "P quantised to FP8 with the wrong scale",
        "V's descale is folded into P before P's FP8 cast (to spare the epilogue's multiply), so the "
        "cast rounds P * v_descale: with the descales of values quantised to the format's range "
        "(about max|v| / 448, far below 1) P lands in e4m3's subnormals and keeps a bit or two. "
        "flashinfer-ai/flashinfer#5020 (P cast to e4m3 at a scale where its mass falls into the "
        "subnormals), iree-org/iree-turbine#679 (P's FP8 scaling made a no-op).",
    ),
    Mutant(
        "blocked_fp8_p_prescale_saturates",
        BLOCKED,
        "                acc = alpha[..., None] * acc + p.to(q.dtype).to(acc_t) @ vj\n",
        "                acc = alpha[..., None] * acc + (p * 2.0**9).to(q.dtype).to(acc_t) * 2.0**-9 @ vj\n",
        "FP8 saturation instead of rounding",
        "P is prescaled by 2^9 before its FP8 cast to use the format's range: one more than "
        "floor(log2 448) = 8, so e4m3's saturating cast clamps every P above 448 / 512 = 0.875 (the "
        "row's largest, P = 1, among them) to 448 instead of rounding it; exact in every other dtype. "
        "flashinfer-ai/flashinfer#5020 (P prescaled by 2^floor(log2(448)) before the e4m3 cast), "
        "NVIDIA/cudnn-frontend#520 (P quantised with cvt.rn.satfinite).",
    ),
    Mutant(
        "blocked_fp8_e5m2_read_as_e4m3",
        BLOCKED,
        "    check_dense(q, k, v)\n",
        "    check_dense(q, k, v)\n"
        "    if q.dtype == torch.float8_e5m2:  # an e4m3 kernel handed e5m2 bytes\n"
        "        q, k, v = (t.view(torch.float8_e4m3fn) for t in (q, k, v))\n",
        "e5m2 and e4m3 confused",
        "The dense entry point reads e5m2 inputs' bytes as e4m3 (a launcher that passes data "
        "pointers to a kernel built for one format): every value is another. vllm-project/vllm#54341 "
        "(e4m3 bits in an fp8_e5m2 cache decoded as e5m2), vllm-project/vllm#45720 (e4m3fnuz cache "
        "bytes reinterpreted as e4m3fn).",
    ),
    # ------------------------------------- blocked intermediate precision (refimpl/blocked.py)
    Mutant(
        "blocked_softcap_low_precision",
        BLOCKED,
        "                s, _ = _scores(qi, kj, scale, rows, cols[: kj.shape[1]], causal, offset, nk, "
        "var, h)\n",
        "                s, _ = _scores(qi, kj, scale, rows, cols[: kj.shape[1]], causal, offset, nk, "
        "var, h)\n"
        "                if var.softcap:  # the capped logits kept in the input dtype (-inf stays -inf)\n"
        "                    s = s.to(q.dtype).to(acc_t)\n",
        "softcap in the input dtype",
        "The forward's soft-capped logits cap * tanh(s / cap) are rounded to the input dtype "
        "(fp16/bf16) before the softmax, as a score modifier applied to 16-bit scores does: each "
        "logit moves by about eps * |s|, invisible at fp32 and to a 16-bit yardstick that rounds "
        "the same way. Gemma-2-style softcap ported onto half-precision scores (the fused "
        "kernels cap the float32 accumulator; FlexAttention's score_mod runs on float32 scores).",
    ),
    Mutant(
        "blocked_split_partials_low_precision",
        BLOCKED,
        "        o_i, lse_i = _forward(q, k, v, causal, scale, block_m, block_n, run, keys, "
        "_acc_dtype(q.dtype))\n",
        "        o_i, lse_i = _forward(q, k, v, causal, scale, block_m, block_n, run, keys)  "
        "# o_i: input dtype\n",
        "split-KV partials in the input dtype",
        "Split-KV writes each split's partial output in the input dtype (fp16/bf16) before the "
        "combine instead of float32: partials that cancel in the combine lose their low bits. "
        "FlashAttention keeps the split partials in float32 (out_accum); a combine fed 16-bit "
        "partials is the flash-decoding variant that stores them like the output.",
    ),
    Mutant(
        "blocked_split_lse_low_precision",
        BLOCKED,
        "        o_i, lse_i = _forward(q, k, v, causal, scale, block_m, block_n, run, keys, "
        "_acc_dtype(q.dtype))\n",
        "        o_i, lse_i = _forward(q, k, v, causal, scale, block_m, block_n, run, keys, "
        "_acc_dtype(q.dtype))\n"
        "        lse_i = lse_i.to(q.dtype).to(lse_i.dtype)  # the partial lse stored in the input dtype\n",
        "split-KV partial lse in the input dtype",
        "Each split's partial lse is rounded to the input dtype before the combine, so the "
        "combine's weights exp(lse_s - lse) and the merged lse carry a 16-bit error (about 1e-3 "
        "relative). FlashAttention keeps lse_accum in float32; a combine that stores the partial "
        "lse like the output does not.",
    ),
    Mutant(
        "blocked_decode_lse_low_precision",
        BLOCKED,
        "o[i], lse[i] = o_i[0].transpose(0, 1), lse_i[0]",
        "o[i], lse[i] = o_i[0].transpose(0, 1), lse_i[0].to(q.dtype)  # rounded, stored in float32",
        "decode lse in the input dtype",
        "The decode entry point rounds each sequence's lse to the input dtype on the way into its "
        "float32 output: the dtype is the contract's, the values carry a 16-bit error that a "
        "16-bit yardstick's lse has too. An lse passed through the output's dtype (a cast in a "
        "decode wrapper) before it is returned.",
    ),
    # ------------------------------------------------------- triton (kernels/triton_attention*.py)
    Mutant(
        "triton_tail_unmasked",
        TRITON_KERNELS,
        "            visible = (offs_n < n_k)[None, :]\n"
        "            if CAUSAL:\n"
        "                visible = visible & (offs_n[None, :] <= offs_m[:, None] + (n_k - n_q))\n"
        '            s = tl.where(visible, s, float("-inf"))\n'
        "        m_new = tl.maximum(m_i, tl.max(s, 1))\n",
        "            visible = (offs_n >= 0)[None, :]\n"
        "            if CAUSAL:\n"
        "                visible = visible & (offs_n[None, :] <= offs_m[:, None] + (n_k - n_q))\n"
        '            s = tl.where(visible, s, float("-inf"))\n'
        "        m_new = tl.maximum(m_i, tl.max(s, 1))\n",
        "tail tile not masked",
        "The forward's masked tile drops the keys < n_k test: keys past the end, loaded as 0, "
        "score 0 and take softmax weight. jax-ml/jax#27224 (Pallas Triton-backend FlashAttention "
        "wrong unless N is a multiple of the block).",
    ),
    Mutant(
        "triton_diagonal_strict",
        TRITON_KERNELS,
        "                visible = visible & (offs_n[None, :] <= offs_m[:, None] + (n_k - n_q))\n"
        '            s = tl.where(visible, s, float("-inf"))\n'
        "        m_new = tl.maximum(m_i, tl.max(s, 1))\n",
        "                visible = visible & (offs_n[None, :] < offs_m[:, None] + (n_k - n_q))\n"
        '            s = tl.where(visible, s, float("-inf"))\n'
        "        m_new = tl.maximum(m_i, tl.max(s, 1))\n",
        "diagonal masked off by one",
        "The forward's causal mask uses < instead of <=, hiding each query's diagonal key (only in "
        "the forward: the backward still uses <=).",
    ),
    Mutant(
        "triton_masked_fill_finite",
        TRITON_KERNELS,
        '            s = tl.where(visible, s, float("-inf"))\n'
        "        m_new = tl.maximum(m_i, tl.max(s, 1))\n",
        "            s = tl.where(visible, s, -1.0e30)\n"
        "        m_new = tl.maximum(m_i, tl.max(s, 1))\n",
        "mean(V) on fully masked rows",
        "Masked scores are filled with a finite -1e30 instead of -inf: fine while a row has one "
        "visible key, but a row with none gets a uniform softmax over the tile, i.e. mean(V) "
        "(plus padded zeros) and a finite lse, instead of o = 0 and lse = -inf. The behaviour of "
        "additive finite masks (torch.finfo.min, -10000) for fully masked rows.",
    ),
    Mutant(
        "triton_empty_rows_nan",
        TRITON_KERNELS,
        '            m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)\n',
        "            m_sub = m_new\n",
        "NaN on fully masked rows",
        "The forward drops the guard that subtracts 0 instead of -inf for rows that have seen no "
        "key, so exp2(-inf - (-inf)) = NaN on empty rows (causal, Nq > Nk). "
        "pytorch/pytorch#103963; NVIDIA/Model-Optimizer#1034 review (NaN risk in the LSE "
        "epilogue of a Triton attention kernel).",
    ),
    Mutant(
        "triton_causal_range_top_left",
        TRITON_KERNELS,
        "        offset = n_k - n_q  # bottom-right alignment: row i sees keys j <= i + offset\n",
        "        offset = 0  # top-left alignment\n",
        "causal aligned top-left",
        "The key-tile range of a query tile is computed top-left while the masks stay "
        "bottom-right, so with Nk > Nq visible keys past row + BLOCK_M are skipped and with "
        "Nq > Nk unmasked whole tiles leak future keys. The FA 2.0 -> 2.1 alignment change "
        "(Dao-AILab/flash-attention#951) half-applied; NVIDIA/cutlass#2336.",
    ),
    Mutant(
        "triton_lse_base2",
        TRITON_KERNELS,
        "(m_i + tl.log2(tl.where(empty, 1.0, l_i))) * ln2)",
        "(m_i + tl.log2(tl.where(empty, 1.0, l_i))))",
        "lse in base 2",
        "The exp2-domain lse is stored without converting back to natural log (* ln 2). "
        "lightseekorg/tokenspeed#571 (gluon prefill stored base-2 LSE), flashinfer-ai/flashinfer#2114 "
        "(MLA LSE base 2 vs e), ROCm/torch_migraphx#274 (PyTorch flash LSE base changed).",
    ),
    Mutant(
        "triton_bwd_ignores_causal",
        TRITON_KERNELS,
        "            s_t = tl.where(offs_m[None, :] >= offs_n[:, None] - (n_k - n_q), s_t, "
        'float("-inf"))\n',
        "            s_t = tl.where(offs_m[None, :] < n_q, s_t, float(\"-inf\"))\n",
        "backward ignores the causal flag",
        "The dK/dV kernel's diagonal tiles keep only the query-tail mask and lose the causal one, "
        "so dK and dV collect gradient from queries that never saw the key (dQ stays right).",
    ),
    Mutant(
        "triton_bwd_query_tail_skipped",
        TRITON_KERNELS,
        "            offs_n, full_lo, full_hi, n_q, n_k, scale2, win_left, win_right, cap2, slope2,\n",
        "            offs_n, full_lo, full_hi // BLOCK_M * BLOCK_M, n_q, n_k, scale2, win_left, win_right, "
        "cap2, slope2,\n",
        "backward ignores the tail",
        "The dK/dV kernel's loop over query tiles stops at the last whole tile, dropping the "
        "ragged query tail's contribution to dK and dV. Backward kernels written for "
        "N % BLOCK == 0 (amorehead/jvp_flash_attention#13).",
    ),
    Mutant(
        "triton_delta_omitted",
        TRITON_KERNELS,
        "delta = tl.sum(o.to(ACC_DTYPE) * do.to(ACC_DTYPE), 1) - dlse.to(ACC_DTYPE)",
        "delta = -dlse.to(ACC_DTYPE)",
        "D = rowsum(dO * O) wrong",
        "The preprocess omits rowsum(dO * O) from Delta, so dS = P * dP misses the softmax "
        "Jacobian's subtraction (dV stays right, dQ and dK are wrong).",
    ),
    Mutant(
        "triton_scale_hardcoded_64",
        TRITON,
        "sm_scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)",
        "sm_scale = 1.0 / math.sqrt(64) if scale is None else float(scale)",
        "scale hard-coded to 1/sqrt(64)",
        "The default scale is 1/sqrt(64) whatever D is. The Triton tutorial kernel hard-coded its "
        "head dim to 64 (triton-lang/triton#621).",
    ),
    Mutant(
        "triton_strides_contiguous",
        TRITON,
        "    strides = [t.stride() for t in tensors]\n",
        "    strides = [t.contiguous().stride() for t in tensors]\n",
        "strides assumed contiguous",
        "The forward passes contiguous strides (to its pointer loads and its TMA descriptors) "
        "for whatever q, k, v it is given. "
        "flagos-ai/FlagGems#5896 (Triton flash attention reads a transposed V as contiguous), "
        "Dao-AILab/flash-attention#2670, ROCm/aiter#1631.",
    ),
    Mutant(
        "triton_gqa_dkdv_not_summed",
        TRITON_KERNELS,
        "    for g in range(0, GROUP):\n",
        "    for g in range(0, 1):\n",
        "GQA dK/dV not summed over the group",
        "dK and dV of a kv head take only the first query head of its group. "
        "marin-community/levanter#449 (FA backward did not sum dK/dV over the query heads sharing "
        "a kv head).",
    ),
    Mutant(
        "triton_head_dim_capped_64",
        TRITON_LAUNCH,
        "    block_d, block_dv = padded_head_dim(d), padded_head_dim(dv)\n",
        "    block_d, block_dv = min(64, padded_head_dim(d)), min(64, padded_head_dim(dv))\n",
        "head dims above 64 dropped",
        "Head-dim tiles are capped at 64 columns: dims past 64 are neither read nor written. "
        "triton-lang/triton#621 (the tutorial FlashAttention computed with q[..., :64] when "
        "D = 128); mni-ml/framework#38 (CUDA kernel truncating head dims > 32).",
    ),
    Mutant(
        "triton_acc_fp16",
        TRITON_KERNELS,
        "        pv = _operand(_probabilities_as(p, v.dtype), BLOCK_N)\n"
        "        acc = tl.dot(pv, _operand(v, BLOCK_N), acc * alpha[:, None], input_precision=PRECISION,\n"
        "                     out_dtype=acc.dtype)\n",
        "        pv = _operand(_probabilities_as(p, v.dtype), BLOCK_N)\n"
        "        l_i = l_i.to(pv.dtype).to(l_i.dtype)\n"
        "        acc = tl.dot(pv, _operand(v, BLOCK_N), (acc * alpha[:, None]).to(pv.dtype),\n"
        "                     input_precision=PRECISION, out_dtype=pv.dtype).to(acc.dtype)\n",
        "low-precision accumulation",
        "The forward keeps its running sum l and output accumulator in the input dtype between key "
        "tiles (fp16 registers, fp16 MMA accumulation): fp32 and fp64 runs are unchanged, fp16 "
        "errors grow with the sequence. mlc-ai/mlc-llm#1870 and apache/tvm#16667 (attention "
        "kernels fixed to accumulate in fp32), Dao-AILab/flash-attention#543 (FP16 accumulation "
        "trade-off), thu-ml/SageAttention#93 (pv_accum fp16).",
    ),
    Mutant(
        "triton_no_rescale",
        TRITON_KERNELS,
        "        acc = tl.dot(pv, _operand(v, BLOCK_N), acc * alpha[:, None], input_precision=PRECISION,\n",
        "        acc = tl.dot(pv, _operand(v, BLOCK_N), acc, input_precision=PRECISION,\n",
        "online-softmax rescale omitted",
        "The forward's accumulator is not rescaled by exp2(m_old - m_new) when a later key tile "
        "raises the row max (the running sum l still is): exact whenever the first tile holds "
        "the max, wrong otherwise. The correction of FlashAttention-2's Algorithm 1, whose paper "
        "prints this factor inverted (Dao-AILab/flash-attention#991), so kernels written from it "
        "get it wrong or drop it.",
    ),
    Mutant(
        "triton_gqa_head_modulo",
        TRITON_KERNELS,
        "        off_hkv = off_h // GROUP\n"
        "        q_base, k_base, v_base = Q, K, V\n"
        "    else:\n"
        "        off_b = (off_bh // H_Q).to(tl.int64)\n"
        "        off_h = (off_bh % H_Q).to(tl.int64)\n"
        "        off_hkv = off_h // GROUP\n",
        "        off_hkv = off_h % (H_Q // GROUP)\n"
        "        q_base, k_base, v_base = Q, K, V\n"
        "    else:\n"
        "        off_b = (off_bh // H_Q).to(tl.int64)\n"
        "        off_h = (off_bh % H_Q).to(tl.int64)\n"
        "        off_hkv = off_h % (H_Q // GROUP)\n",
        "GQA head mapped wrong",
        "The forward (TMA and pointer paths) maps query head h to kv head h % Hkv (interleaved "
        "groups) instead of h // group; the backward keeps the right mapping. "
        "XunhaoLai/native-sparse-attention-triton#27 (wrong head-count division in a Triton "
        "kernel's GQA head split).",
    ),
    Mutant(
        "triton_bwd_empty_rows_nan",
        TRITON_KERNELS,
        '    lse2 = tl.where(lse == float("-inf"), float("inf"), lse * log2e)\n',
        "    lse2 = lse * log2e\n",
        "NaN on fully masked rows (backward)",
        "The backward's preprocess drops the guard that turns an empty row's lse = -inf into "
        "+inf, so P = exp2(s - lse) = exp2(-inf + inf) = NaN on rows that see no key (causal, "
        "Nq > Nk) and the NaN spreads into dQ, dK and dV; the forward stays correct. "
        "Dao-AILab/flash-attention#443 (NaN in dQ, causal varlen with seqlen_q > seqlen_k), "
        "#1947 (NaN gradients of the Triton backend's varlen backward).",
    ),
    Mutant(
        "blocked_offsets_int32",
        BLOCKED,
        "    return _BlockedAttention.apply(q, k, v, sinks, causal, scale, block_m, block_n, window, "
        "softcap, slopes,\n                                   order, dropout, fp8)\n",
        "    def int32_addressed(t):  # t as read at element offsets sum(index * stride) held in int32\n"
        "        offsets = torch.zeros((), dtype=torch.int64, device=t.device)\n"
        "        for size, stride in zip(t.shape, t.stride()):\n"
        "            offsets = offsets[..., None] + torch.arange(size, device=t.device) * stride\n"
        "        offsets = (offsets + 2**31) % 2**32 - 2**31  # past 2^31 an int32 wraps negative\n"
        "        span = t.untyped_storage().nbytes() // t.element_size() - t.storage_offset()\n"
        "        read = t.detach().as_strided((span,), (1,))[offsets]  # before the base: the tail\n"
        "        return t + (read - t).detach()  # the values read; the gradient still reaches t\n"
        "\n"
        "    q, k, v = (int32_addressed(t) for t in (q, k, v))\n"
        "    return _BlockedAttention.apply(q, k, v, sinks, causal, scale, block_m, block_n, window, "
        "softcap, slopes,\n                                   order, dropout, fp8)\n",
        "offsets computed in 32 bits",
        "The dense entry point reads q, k and v at element offsets sum(index * stride) computed in "
        "32 bits: past element 2^31 of a tensor (a tensor of more than 2^31 elements, or a view "
        "whose outer stride is that large) the offset wraps negative and the read lands before "
        "the base pointer (here: in the allocation's tail), silently; smaller tensors are "
        "untouched. Dao-AILab/flash-attention#2611 (FA4's varlen backward accumulated "
        "coord * stride in i32: corrupt dQ/dK/dV for a dout with a large outer stride), "
        "pytorch/pytorch#190857 (FlexAttention's backward: K/V offsets past INT32_MAX), "
        "Dao-AILab/flash-attention#1500 (FA2's backward row offsets overflowed at batch 10k).",
    ),
    Mutant(
        "triton_softcap_tanh_cancels",
        TRITON_KERNELS,
        "        t = x * num * _reciprocal_approx(den)\n",
        "        e = tl.exp2(tl.abs(x) * -2.8853900817779268)  # exp(-2|x|)\n"
        "        t = (1.0 - e) / (1.0 + e)\n"
        "        t = tl.where(x < 0, -t, t)\n",
        "tanh through exp(-2|x|): small arguments cancel",
        "The 16-bit softcap's tanh computed as (1 - e) / (1 + e), e = exp(-2|x|), the fast form "
        "of ROCm/triton#910 and #914 (fast_tanhf): 1 - e cancels as |x| shrinks (an absolute "
        "error of an fp32 ulp of 1), so a large cap, whose tanh arguments are small, moves the "
        "capped logits by cap * 1e-7 and a cap of 1e8 zeroes them. root-project/root#19740 (an "
        "exp-based tanh loses all relative accuracy near 0). This kernel's own first fast tanh "
        "(session 34), caught on the H200 by softcap-huge.",
        first=("test_variant_identities.py",),
    ),
    Mutant(
        "triton_varlen_partial_tiles_dropped",
        TRITON_KERNELS,
        "    return n, ((n + bm - 1) // bm).to(tl.int64)\n",
        "    return n, (n // bm).to(tl.int64)\n",
        "varlen grid misses partial tiles",
        "The varlen forward's tile map counts each sequence's query tiles rounding down, so a "
        "sequence whose length is not a multiple of the tile gets no program for its last rows: "
        "their o and lse are never written (whatever the allocation held), and a sequence "
        "shorter than one tile is skipped whole. triton-lang/triton#2020 (the tutorial's "
        "backward preprocess launched a grid sized for another block: rows left uncomputed), "
        "ROCm/triton#409 (sequence lengths rounded down to the block, the irregular last block "
        "handled apart).",
        first=("test_varlen.py",),
    ),
    Mutant(
        "triton_varlen_key_map_from_queries",
        TRITON,
        '    tile_map = _tile_map(pack.cu_q if rows == "q" else pack.cu_k, pack.count, total)\n',
        "    tile_map = _tile_map(pack.cu_q, pack.count, total)\n",
        "varlen key tiles counted from the queries",
        "The varlen backward's dK/dV tile map is built from cu_seqlens_q, not cu_seqlens_k: "
        "right whenever every sequence has as many keys as queries (self-attention packs), "
        "wrong otherwise: a sequence with more keys than queries gets no program for its last "
        "key tiles (their dK, dV never written), the pack's key tiles past a shorter query "
        "count are skipped. vllm-project/vllm-omni#3525 (cross-attention's cu_seqlens_k built "
        "from the query length), Dao-AILab/flash-attention#1455 (the split-KV forward read "
        "the batch's seqlen_k, not the sequence's, under varlen).",
        first=("test_varlen.py",),
    ),
    Mutant(
        "triton_grad_output_strides_of_o",
        TRITON,
        "    strides = (*q.stride(), *k.stride(), *v.stride(), *do.stride())\n",
        "    strides = (*q.stride(), *k.stride(), *v.stride(), *o.stride())\n",
        "dO read with o's strides",
        "The dK/dV and dQ passes address dO with the strides of o (the kernel's own contiguous "
        "output), as if the upstream gradient always had them: right for a contiguous dO, wrong "
        "for a transposed or strided one, which a model storing (B, N, H, D) activations hands "
        "over. PyTorch's cuDNN path assumed dO's strides were o's until cuDNN 9.5.1 "
        "(pytorch/pytorch#141147), and flash-attention's backward was wrong for a non-contiguous "
        "dO (Dao-AILab/flash-attention#355). Before ``Problem.grad_layout`` only spread-batch "
        "(its own strided dO) caught it, after 144 s; now backward does in about 22 s.",
        first=("test_golden.py",),
    ),
    Mutant(
        "triton_window_edge_tile_skipped",
        TRITON_KERNELS,
        "    lo = (lo // BLOCK_N) * BLOCK_N\n",
        "    lo = tl.cdiv(lo, BLOCK_N) * BLOCK_N\n",
        "window's edge tile skipped",
        "The forward's key range under a sliding window starts at the first whole key tile at or "
        "after the window's left edge instead of the tile that holds it: the tiles outside the "
        "window are skipped as they should be, and so is the partial tile at its edge, whose keys "
        "some rows see. Right whenever the edge falls on a tile boundary (windows that are "
        "multiples of the tile, the shapes benchmarks use), wrong otherwise. "
        "Dao-AILab/flash-attention#1133 (window_size (S - 1, 0) not equal to causal: a window edge "
        "handled apart from the mask), huggingface/transformers#39408 and zml/zml#763 (window "
        "bounds off by one).",
        first=("test_variants.py",),
    ),
    Mutant(
        "triton_window_dkdv_edge_tile_skipped",
        TRITON_KERNELS,
        "    lo = (lo // BLOCK_M) * BLOCK_M\n",
        "    lo = tl.cdiv(lo, BLOCK_M) * BLOCK_M\n",
        "window's edge tile skipped in dK/dV",
        "The dK/dV pass's query range under a sliding window starts at the first whole query "
        "tile at or after the first row that sees the key tile, instead of the tile that holds "
        "that row: the forward and dQ are right, dK and dV miss the contributions of the rows at "
        "the window's right edge whenever it falls inside a query tile. The backward twin of "
        "triton_window_edge_tile_skipped: a kernel whose backward walks the band by bounds of "
        "its own (Dao-AILab/flash-attention#1133: window bounds handled apart from the mask).",
        first=("test_variants.py::test_variant_backward_matches_golden", "test_variants.py"),
    ),
    Mutant(
        "triton_alibi_batch_slopes_shared",
        TRITON,
        "        stride_ab, stride_ah = mods.slopes.stride()\n",
        "        stride_ab, stride_ah = 0, mods.slopes.stride(1)\n",
        "per-batch ALiBi slopes read as per-head",
        "ALiBi slopes of shape (B, Hq) are addressed with a batch stride of 0, as slopes of shape "
        "(Hq,) are: every batch element takes batch element 0's slopes. Right whenever the rows "
        "are equal (slopes from the head count alone, the usual case), wrong for per-sequence "
        "slopes. Dao-AILab/flash-attention#1585 ((batch, nheads) slopes refused by one entry "
        "point, taken by another), flashinfer-ai/flashinfer#5101 (slopes indexed from the local "
        "head count: every tensor-parallel rank but the first used the wrong slopes).",
        first=("test_variants.py",),
    ),
    # ------------------------------------------------------- triton decode (kernels/triton_decode.py)
    Mutant(
        "triton_decode_v_with_k_scale",
        TRITON_DECODE,
        "        o = o * tl.load(scales + 1).to(ACC_DTYPE)\n",
        "        o = o * tl.load(scales).to(ACC_DTYPE)\n",
        "FP8 cache scales confused",
        "Decode from an FP8 KV cache dequantises the values with the keys' scale: right whenever "
        "k_scale == v_scale (a calibration that sets both alike, the default 1.0), wrong otherwise. "
        "sgl-project/sglang#26852 (v_descale falling back to k_scale), vllm-project/vllm#55557 "
        "(a test with k != v scales added to catch a k/v swap).",
    ),
    Mutant(
        "triton_paged_offset_power_of_two",
        TRITON_DECODE,
        "        row = (offs_n - slot * page_size).to(tl.int64)\n",
        "        row = (offs_n & (page_size - 1)).to(tl.int64)\n",
        "page offset by bit mask",
        "A key's row within its page is taken as j & (page_size - 1): j % page_size for a page "
        "size that is a power of two, some other row of the page otherwise (48 here; 1 stays "
        "right). vllm-project/tpu-inference#2795 (a page-size mask valid only for powers of "
        "two), ROCm/aiter#2393 (a paged kernel broken by a block size that is not one).",
    ),
    Mutant(
        "triton_decode_heads_interleaved",
        TRITON_DECODE,
        "    head = off_hkv * GROUP + offs_r % GROUP\n",
        "    head = off_hkv + (offs_r % GROUP) * H_KV\n",
        "GQA group packed by head modulo",
        "Decode packs into one program the query heads it takes to share kv head g as g, "
        "g + Hkv, g + 2 Hkv, ... (query head h reads kv head h % Hkv) instead of g * group .. "
        "g * group + group - 1 (h // group, the contract's grouping). Right with one kv head "
        "or no grouping, wrong otherwise. The dense kernels' mutants triton_gqa_head_modulo and "
        "blocked_gqa_head_modulo in the decode path, where the heads of a group are packed as "
        "rows of one tile; XunhaoLai/native-sparse-attention-triton#27.",
    ),
    Mutant(
        "triton_split_combine_empty_nan",
        TRITON_DECODE,
        "        m_sub = tl.where(m_new == float(\"-inf\"), 0.0, m_new)\n"
        "        w = tl.exp2(lse_s - m_sub)\n",
        "        m_sub = m_new\n        w = tl.exp2(lse_s - m_sub)\n",
        "-inf - -inf in the split-KV combine",
        "The combine of split-KV partials subtracts the running max as it is, -inf for a row "
        "whose partials all saw no key (a sequence with cache length 0, or causal rows before "
        "the first cached key): exp2(-inf - -inf) is NaN, and o and lse come out NaN where the "
        "contract has o = 0, lse = -inf. Right for every row that sees a key. "
        "Dao-AILab/flash-attention#2842 (the split-KV early exit for a zero-length KV sequence "
        "wrote its lse to the wrong slot), blocked_split_empty_nan in the Triton combine.",
        first=("test_kvcache.py::test_split_kv_invariance", "test_kvcache.py", "test_variants.py"),
    ),
)

BY_NAME: dict[str, Mutant] = {m.name: m for m in MUTANTS}


def mutated_source(mutant: Mutant) -> str:
    """The target's source with the mutant planted; :class:`MutantDrift` if the snippet is not
    there exactly once."""
    source = (ROOT / mutant.target).read_text()
    count = source.count(mutant.original)
    if count != 1:
        raise MutantDrift(
            f"mutant {mutant.name}: its snippet occurs {count} times in {mutant.target} (expected 1); "
            "the kernel changed, update the mutant"
        )
    return source.replace(mutant.original, mutant.replacement)


def build(mutant: Mutant) -> Callable:
    """Execute the mutated target as a fresh module, then the modules built on it
    (:attr:`Mutant.modules`), and return the last one's ``attention`` kernel (for the decode
    module, which has none: the ``triton`` kernel with the mutant's ``kvcache``).

    While they execute, each built module stands in ``sys.modules`` under its real name, so the
    next one's ``from flashprop.kernels.<module> import ...`` takes the mutant's names; the real
    entries are put back afterwards. The mutated source is registered with :mod:`linecache` under
    a pseudo file name so that tools that read a function's source (``triton.jit``, tracebacks)
    find the mutated text.
    """
    saved: dict[str, types.ModuleType | None] = {}
    try:
        for path in mutant.modules:
            real = "flashprop." + path.removesuffix(".py").replace("/", ".")
            module = _execute(mutant, path)
            saved.setdefault(real, sys.modules.get(real))
            sys.modules[real] = module
    finally:
        for real, original in saved.items():
            if original is None:
                del sys.modules[real]
            else:
                sys.modules[real] = original
    if mutant.target == TRITON_DECODE:
        return _with_kvcache(module.kvcache)
    return module.attention


def _with_kvcache(kvcache: Callable) -> Callable:
    """The ``triton`` kernel, its declaration and entry points, with ``kvcache`` as its decode."""
    from flashprop.kernels.triton_attention import attention as triton_attention

    def attention(*args, **kwargs):
        return triton_attention(*args, **kwargs)

    functools.update_wrapper(attention, triton_attention)  # the declaration and entry points too
    attention.kvcache = kvcache
    return attention


def _execute(mutant: Mutant, path: str) -> types.ModuleType:
    """``path`` as a fresh module named for the mutant: the mutated source for its target, the
    file as it is for a module built on it."""
    if path == mutant.target:
        source, filename = mutated_source(mutant), f"<mutant {mutant.name} of {mutant.target}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    else:
        filename = str(ROOT / path)
        source = Path(filename).read_text()
    name = f"mutants.built.{mutant.name}" + ("" if path == mutant.target else f".{Path(path).stem}")
    module = types.ModuleType(name, mutant.doc)
    module.__file__ = filename
    module.__package__ = "flashprop." + Path(path).parent.name  # its relative imports' home
    sys.modules[module.__name__] = module
    exec(compile(source, filename, "exec"), module.__dict__)
    return module


def __getattr__(name: str) -> Callable:
    """Module attributes are the mutant kernels, built on first access."""
    mutant = BY_NAME.get(name)
    if mutant is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    kernel = build(mutant)
    globals()[name] = kernel
    return kernel
