"""Meta-tests of the adapters' own arithmetic: what they build for a backend must not cost the
backend a tolerance it would otherwise meet.

The SDPA adapters express ALiBi as an additive ``attn_mask``. Rounded to fp16, a bias of
8 x 47 = 376 sits on a grid of 0.25, an error of up to 0.125 in a logit: ``sdpa-math`` failed
``varlen-backward`` on such problems (8 of 1,002 examples of a 2,000-example campaign,
docs/findings.md), the adapter's fault, not PyTorch's. The bias is now computed in float32 and
given unrounded to the backends that take a wider mask (``kernels.sdpa._WIDE_BIAS``).
"""

from __future__ import annotations

import math

import pytest
import torch
from flashprop.contract.problem import Problem
from flashprop.contract.registry import load_kernel
from flashprop.harness.check import assert_close_to_golden, references, run_kernel
from flashprop.kernels import sdpa
from torch.nn.attention import SDPBackend

pytestmark = pytest.mark.meta

#: The campaign's failing problem (seed 6393): o was off by 5.3e-2, 7.4 times the yardstick's error.
STEEP_ALIBI_FP16 = Problem(
    b=9, hq=3, hkv=1, nq=37, nk=48, d=32, dv=32, dtype=torch.float16, dist="spikes", seed=6393,
    device="cpu", alibi=("batch-head", 8.0),
    seqlens=((2, 2), (1, 48), (26, 1), (1, 0), (0, 37), (15, 0), (1, 5), (37, 47), (24, 21)),
)


def test_sdpa_math_takes_the_steep_alibi_bias_unrounded():
    """The campaign's problem passes varlen-backward: the bias reaches SDPA math in float32."""
    kernel = load_kernel("sdpa-math")
    out = run_kernel(kernel, STEEP_ALIBI_FP16, "varlen-backward", backward=True)
    assert_close_to_golden(kernel, STEEP_ALIBI_FP16, "varlen-backward", out, ("o", "dq", "dk", "dv"))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_bias_is_rounded_once_and_only_for_backends_that_need_it(dtype):
    """float32 bias for 16-bit queries; kept for a wide-bias backend, rounded to the query dtype
    (once, from float32) for the others; bool masks untouched."""
    q = torch.zeros(1, 1, 3, 4, dtype=dtype)
    rows, cols = torch.arange(3).view(1, 1, 3, 1), torch.arange(5).view(1, 1, 1, 5)
    slopes = torch.tensor([8.3]).view(1, 1, 1, 1)
    bias = sdpa._attn_mask(rows, cols, causal=False, window=None, slopes=slopes, keep=None,
                           dtype=sdpa._bias_dtype(dtype))
    assert bias.dtype == torch.float32
    call = sdpa._Call(q, q, q, bias)
    assert sdpa._for_backend(call, SDPBackend.MATH).attn_mask is bias
    narrow = sdpa._for_backend(call, SDPBackend.CUDNN_ATTENTION).attn_mask
    assert narrow.dtype == dtype and torch.equal(narrow, bias.to(dtype))
    visible = bias > -20
    assert sdpa._for_backend(sdpa._Call(q, q, q, visible), SDPBackend.CUDNN_ATTENTION).attn_mask is visible


#: Session 39's cuDNN finding, shrunk (docs/findings.md): a one-sequence pack, and the dense run of
#: its sequence that varlen-sequence-alone makes (transposed q, k, v and dO: the same strides).
CUDNN_PACK = Problem(b=1, hq=2, hkv=1, nq=15, nk=15, d=8, dv=8, dtype=torch.float16, device="cpu",
                     window=(-1, 0), seqlens=((15, 15),))
CUDNN_ALONE = CUDNN_PACK.replace(seqlens=None, layout="transposed", grad_layout="transposed")


def test_the_cudnn_grad_order_limit_keeps_do_in_the_order_of_o():
    """The limit rules out a dO stored in the other order than q and o, dense or packed, and keeps
    one in o's order: the pack and its dense run stay declared (they hand cuDNN one set of strides),
    and so does a dO with a non-unit innermost stride, which torch copies in o's layout."""
    limit = sdpa.CUDNN_STRIDED_GRAD_OUTPUT
    assert limit.backward and not limit.raises
    for declared in (CUDNN_PACK, CUDNN_ALONE, CUDNN_PACK.replace(grad_layout="strided"),
                     CUDNN_ALONE.replace(grad_layout="strided"), CUDNN_PACK.replace(layout="sliced")):
        assert not limit.applies(declared), declared
    unmasked_mha = CUDNN_ALONE.replace(hq=1, window=None, grad_layout=None)
    for ruled_out in (CUDNN_ALONE.replace(grad_layout=None), CUDNN_PACK.replace(grad_layout="transposed"),
                      CUDNN_PACK.replace(layout="transposed"), unmasked_mha):
        assert limit.applies(ruled_out), ruled_out


def _sequence_major_at_sdpa(p: Problem, monkeypatch) -> tuple[bool, bool]:
    """Whether q, and the dO SDPA's backward gets, are stored sequence-major where SDPA sees them
    (N outer of a (B, H, N, D) tensor's H and N: its stride over N above the one over H), for ``p``
    run with a backward through ``sdpa-math`` on the CPU. cuDNN lays o out like q (pytorch#138354)."""
    real, seen = torch.nn.functional.scaled_dot_product_attention, []

    def spy(q, *args, **kwargs):
        o = real(q, *args, **kwargs)
        o.register_hook(lambda g: seen.append((q.stride(), g.stride())))
        return o

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    run_kernel(load_kernel("sdpa-math"), p, "varlen-backward", backward=True)
    ((q_strides, do_strides),) = seen
    return q_strides[2] > q_strides[1], do_strides[2] > do_strides[1]


@pytest.mark.parametrize("grad_layout", [None, "transposed"])
def test_a_packed_do_reaches_sdpa_in_the_order_the_cudnn_limit_assumes(grad_layout, monkeypatch):
    """The dO-order limit reads a token-major pack's dO as sequence-major, q's and so o's order,
    unless it is stored transposed: that must be the dO SDPA's backward gets (a view of the
    caller's). Session 41's one-sequence packs failed because it was not: the entry point's
    ``o[0]`` made autograd hand SDPA a fresh head-major dO (select's backward), and the cuDNN graph
    cached for it then served the dense run's sequence-major dO, or the reverse (on an H100, the
    second of the two runs always wrong; docs/findings.md)."""
    p = CUDNN_PACK.replace(grad_layout=grad_layout)
    q_order, do_order = _sequence_major_at_sdpa(p, monkeypatch)
    assert q_order
    assert do_order == (grad_layout is None)
    assert (do_order != q_order) == sdpa.CUDNN_STRIDED_GRAD_OUTPUT.applies(p)


def _assert_rules_out_the_gradients_alone(limit, problems) -> None:
    """``limit`` is a silent limit of the backward that is what sdpa-cudnn's declarations rule out
    for each of ``problems``' gradients, while their forward stays declared."""
    caps = sdpa.sdpa_cudnn.capabilities
    assert limit.backward and not limit.raises
    for p in problems:
        assert caps.backward_limit(p) is limit
        assert caps.unsupported_reason(p.replace(device="cuda"), include_limits=False) is None


#: Session 41's finding on an H100: NaN gradients through a mask with every logit far below -88;
#: session 45's on an H100, the dense backward with no mask: NaN in every element of dq.
CUDNN_UNDERFLOW = (
    Problem(b=2, hq=1, hkv=1, nq=1, nk=127, d=8, dv=8, dtype=torch.float16, device="cpu", dist="underflow",
            alibi=("batch-head", 0.0), seqlens=((1, 1), (0, 127))),
    Problem(b=1, hq=4, hkv=2, nq=256, nk=64, d=240, dv=240, dtype=torch.float16, device="cpu",
            dist="underflow", seqlens=((256, 64),)),
    Problem(b=1, hq=1, hkv=1, nq=64, nk=64, d=8, dv=8, dtype=torch.float16, device="cpu", dist="underflow"),
)


#: Session 47's on an H100: ``negative`` values through a flat ALiBi (dq NaN in the 59 rows whose
#: largest logit is below -12), and ``large`` values whose one visible key under the top-left
#: causal mask lies below -12 (every gradient NaN in the sequence's dense run).
CUDNN_LOW_ROWS = (
    Problem(b=1, hq=1, hkv=1, nq=64, nk=64, d=8, dv=8, dtype=torch.float16, device="cpu", dist="negative",
            alibi=("batch-head", 0.0)),
    Problem(b=1, hq=2, hkv=1, nq=1, nk=64, d=8, dv=8, dtype=torch.float16, device="cpu", causal=True,
            dist="large", seqlens=((1, 64),)),
)


#: Session 42's on the H200: NaN in dq's last 124 rows, normal values pushed down by ALiBi
#: (slopes 0.20 and 0.11) for the rows far past the 63 keys; the same with slope 0 passed.
CUDNN_FAR_ALIBI = Problem(b=2, hq=1, hkv=1, nq=255, nk=63, d=8, dv=32, dtype=torch.float16, device="cpu",
                          alibi=("batch-head", 0.25), seqlens=((255, 63), (0, 1)))


def test_the_cudnn_underflow_limit_rules_out_the_gradients_alone():
    """The shrunk problems, masked or not, and the dense run of the ALiBi one's sequence, have their
    gradients ruled out and their forward declared; the same problems with other values, with a
    flat ALiBi, and with a window that keeps every row near its keys keep them."""
    limit = sdpa.CUDNN_UNDERFLOW_GRADIENTS
    alone = CUDNN_FAR_ALIBI.replace(b=1, seqlens=None, layout="transposed", grad_layout="transposed")
    _assert_rules_out_the_gradients_alone(limit, (*CUDNN_UNDERFLOW, *CUDNN_LOW_ROWS, CUDNN_FAR_ALIBI, alone))
    for p in (*CUDNN_UNDERFLOW, *CUDNN_LOW_ROWS):
        for dist in ("normal", "overflow"):
            assert not limit.applies(p.replace(dist=dist))
    for near in (CUDNN_FAR_ALIBI.replace(alibi=("batch-head", 0.0)), CUDNN_FAR_ALIBI.replace(window=(8, 8)),
                 CUDNN_FAR_ALIBI.replace(nk=255, seqlens=((255, 255), (0, 1)))):
        assert not limit.applies(near), near


@pytest.mark.parametrize("p", [
    Problem(b=2, hq=4, hkv=2, nq=40, nk=70, d=16, dv=16, dtype=torch.float16, device="cpu", causal=True,
            dist="large"),
    Problem(b=2, hq=2, hkv=2, nq=70, nk=40, d=8, dv=8, dtype=torch.float16, device="cpu", window=(3, 0),
            alibi=("head", 0.5)),
    Problem(b=3, hq=2, hkv=1, nq=9, nk=30, d=8, dv=8, dtype=torch.float16, device="cpu", causal=True,
            dist="negative", alibi=("batch-head", 0.25), seqlens=((9, 30), (0, 4), (5, 2))),
    *CUDNN_LOW_ROWS,
    CUDNN_FAR_ALIBI,
], ids=repr)
def test_the_cudnn_underflow_limit_reads_the_rows_the_golden_sees(p):
    """The limit's lowest row maximum m (each row's largest visible logit, computed by the adapter
    module) brackets the golden's lowest lse over the rows that see a key: m <= min lse <=
    m + log(Nk), since a row's lse lies between its largest logit and that plus log(its keys)."""
    golden = references(p, sdpa.sdpa_cudnn.capabilities.causal_alignment, tf32=False, backward=False)[0]
    lse = golden.lse[torch.isfinite(golden.lse)]
    lowest = sdpa._lowest_row_maximum(p)
    slack = 1e-5 * abs(lowest) + 1e-5  # float32 products against the golden's float64
    assert lowest - slack <= float(lse.min()) <= lowest + math.log(p.nk) + slack


#: Session 40's findings on an H100, each with its dO sliced: RuntimeError from cuDNN's graph
#: execute, and a misaligned-address fault in varlen-sequence-alone's dense run.
CUDNN_SLICED_DO = (
    Problem(b=2, hq=3, hkv=3, nq=285, nk=13, d=128, dv=72, dtype=torch.bfloat16, device="cpu",
            grad_layout="sliced"),
    Problem(b=1, hq=2, hkv=2, nq=300, nk=192, d=216, dv=120, dtype=torch.bfloat16, device="cpu",
            layout="transposed", alibi=("head", 1.0), grad_layout="sliced"),
)


def test_the_cudnn_sliced_grad_limit_rules_out_the_gradients_alone():
    """Both findings' problems have their gradients ruled out and stay declared for the forward;
    dO in the other layouts is still drawn."""
    caps = sdpa.sdpa_cudnn.capabilities
    limit = sdpa.CUDNN_MISALIGNED_GRAD_OUTPUT
    _assert_rules_out_the_gradients_alone(limit, CUDNN_SLICED_DO)
    for p in CUDNN_SLICED_DO:
        assert not any(lim.applies(p) for lim in caps.limits[:2])  # the forward's own limits
        for other in (None, "transposed", "strided"):
            assert not limit.applies(p.replace(grad_layout=other))


def test_the_truth_of_the_cudnn_finding():
    """What the finding says of the truth, from the same drawn tensors on the CPU: SDPA math gives
    the pack's gradients (dq[3, 1, 1] = -1.1074, dk[0, 0, 3] = 1.4160, dv[1, 0, 5] = 1.6816)
    whatever dO's layout."""
    kernel = load_kernel("sdpa-math")
    for grad_layout in (None, "transposed"):
        p = CUDNN_PACK.replace(grad_layout=grad_layout)
        out = run_kernel(kernel, p, "varlen-sequence-alone", backward=True)
        got = (float(out.dq[3, 1, 1]), float(out.dk[0, 0, 3]), float(out.dv[1, 0, 5]))
        assert got == pytest.approx((-1.1074, 1.4160, 1.6816), abs=1e-3)
