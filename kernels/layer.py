"""``FlashAttention``: a drop-in multi-head attention layer on any flashprop kernel.

Math (batch-first; ``x`` (B, Nq, d_model), ``kv`` (B, Nk, d_model), ``kv = x`` for self-attention;
Hq = ``n_heads``, Hkv = ``n_kv_heads``, D = d_model / Hq)::

    q = x W_q^T + b_q      (B, Nq, Hq, D)       W_q (Hq * D, d_model)
    k = kv W_k^T + b_k     (B, Nk, Hkv, D)      W_k (Hkv * D, d_model)
    v = kv W_v^T + b_v     (B, Nk, Hkv, D)      W_v (Hkv * D, d_model)
    o_h = softmax(scale * q_h k_g^T + M) v_g    g = h // (Hq // Hkv)   (GQA / MQA)
    y = [o_1 ... o_Hq] W_o^T + b_o              (B, Nq, d_model)

with ``scale = 1/sqrt(D)`` unless given and M the kernel's mask (-inf where a key is not
visible; ``causal`` follows the kernel's declared alignment, bottom-right for flashprop's own
kernels, top-left for SDPA's: the same thing for self-attention, where Nq == Nk). ``bias``
switches all four biases on or off. The variants of ``docs/variants.md`` are constructor
options, passed to the kernel only when set (``window_size``, ``softcap``, an ``alibi_slopes``
buffer of shape (Hq,), a learnable per-head ``sinks`` logit); a kernel that does not declare a
requested variant (``kernel.capabilities``) is refused with a ``ValueError`` at construction.

The kernel is called as ``fn(q, k, v, causal=..., **variants)`` on (B, H, N, D) views of the
projections (the flashprop contract); it returns o or (o, lse) and only o is used.

Execution. In eager mode the kernel is called directly and its own autograd (if it has one) runs
the backward. Under ``torch.compile`` the call goes through the custom op ``flashprop::attention``
(fake implementation for tracing, no graph break), whose backward is the custom op
``flashprop::attention_backward``: a generic backward for any flashprop kernel with autograd,
which re-runs the kernel's forward with autograd on detached inputs and ``torch.autograd.grad``s
it. Its cost is one extra kernel forward per backward (the forward op cannot hand its autograd
graph to the backward across the op boundary). Double backward is not supported.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch
from flashprop.contract.registry import Kernel, load_kernel
from torch import Tensor, nn

#: Loaded kernels by the key the custom ops name them with (a custom op takes no callables).
_KERNELS: dict[str, Kernel] = {}


def best_kernel() -> str:
    """The best kernel available here: the fused Triton kernel on a CUDA machine, else the
    blocked FlashAttention-2 reference in plain PyTorch."""
    return "triton" if torch.cuda.is_available() else "ref-blocked"


def _register(kernel: Kernel) -> str:
    """The key of ``kernel`` in :data:`_KERNELS` (its name, suffixed if another kernel has it)."""
    key, n = kernel.name, 0
    while _KERNELS.setdefault(key, kernel) != kernel:
        n += 1
        key = f"{kernel.name}#{n}"
    return key


def _variants(
    window_size: Sequence[int] | None, softcap: float, alibi_slopes: Tensor | None, sinks: Tensor | None
) -> dict[str, object]:
    """The variant keywords for the kernel: only the ones in use (``docs/variants.md``)."""
    variants: dict[str, object] = {}
    if window_size is not None:
        variants["window_size"] = (int(window_size[0]), int(window_size[1]))
    if softcap:
        variants["softcap"] = softcap
    if alibi_slopes is not None:
        variants["alibi_slopes"] = alibi_slopes
    if sinks is not None:
        variants["sinks"] = sinks
    return variants


def _attend(
    kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float | None, variants: dict
) -> Tensor:
    """o (B, Nq, Hq, Dv) of ``kernel`` on q (B, Nq, Hq, D), k and v (B, Nk, Hkv, D|Dv)."""
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    if not kernel.capabilities.any_strides:
        qt, kt, vt = (t.contiguous() for t in (qt, kt, vt))
    o, _ = kernel(qt, kt, vt, causal=causal, scale=scale, **variants)
    return o.transpose(1, 2)


@contextlib.contextmanager
def _autograd_inside_op() -> Iterator[None]:
    """Autograd recording inside a custom op's implementation, which the dispatcher runs below
    the autograd keys (``_AutoDispatchBelowAutograd``): lift that exclusion, enable grad."""
    keys = torch._C.DispatchKey
    with contextlib.ExitStack() as stack:
        for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor):
            stack.enter_context(torch._C._SetExcludeDispatchKeyGuard(key, False))
        stack.enter_context(torch.enable_grad())
        yield


@torch.library.custom_op("flashprop::attention", mutates_args=())
def attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernel: str,
    causal: bool,
    scale: float | None,
    window_size: Sequence[int] | None,
    softcap: float,
    alibi_slopes: Tensor | None,
    sinks: Tensor | None,
) -> Tensor:
    """Kernel ``kernel`` (a key of :data:`_KERNELS`) on q (B, Nq, Hq, D), k, v (B, Nk, Hkv, D):
    o (B, Nq, Hq, Dv), contiguous."""
    variants = _variants(window_size, softcap, alibi_slopes, sinks)
    return _attend(_KERNELS[kernel], q, k, v, causal, scale, variants).contiguous()


@attention_op.register_fake
def _attention_fake(q, k, v, kernel, causal, scale, window_size, softcap, alibi_slopes, sinks):
    return q.new_empty((*q.shape[:3], v.shape[-1]))


@torch.library.custom_op("flashprop::attention_backward", mutates_args=())
def attention_backward_op(
    do: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    kernel: str,
    causal: bool,
    scale: float | None,
    window_size: Sequence[int] | None,
    softcap: float,
    alibi_slopes: Tensor | None,
    sinks: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Generic backward of :func:`attention_op`: re-runs the kernel's forward with autograd on
    detached inputs and differentiates it. Returns contiguous dq, dk, dv and dsinks (empty
    when there are no sinks)."""
    with _autograd_inside_op():
        qkv = [t.detach().requires_grad_() for t in (q, k, v)]
        sinks_in = None if sinks is None else sinks.detach().requires_grad_()
        variants = _variants(window_size, softcap, alibi_slopes, sinks_in)
        o = _attend(_KERNELS[kernel], *qkv, causal, scale, variants)
        inputs = qkv if sinks_in is None else [*qkv, sinks_in]
        grads = torch.autograd.grad(o, inputs, do, materialize_grads=True)
    dsinks = grads[3] if sinks is not None else q.new_empty(0, dtype=torch.float32)
    return grads[0].contiguous(), grads[1].contiguous(), grads[2].contiguous(), dsinks


@attention_backward_op.register_fake
def _attention_backward_fake(do, q, k, v, kernel, causal, scale, window_size, softcap, alibi_slopes, sinks):
    dsinks = q.new_empty(0, dtype=torch.float32) if sinks is None else torch.empty_like(sinks)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dsinks


def _setup_context(ctx, inputs, output) -> None:
    q, k, v, kernel, causal, scale, window_size, softcap, alibi_slopes, sinks = inputs
    ctx.save_for_backward(q, k, v, alibi_slopes, sinks)
    ctx.config = (kernel, causal, scale, window_size, softcap)


def _backward(ctx, do: Tensor):
    q, k, v, alibi_slopes, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = attention_backward_op(do, q, k, v, *ctx.config, alibi_slopes, sinks)
    return dq, dk, dv, None, None, None, None, None, None, (None if sinks is None else dsinks)


attention_op.register_autograd(_backward, setup_context=_setup_context)


class FlashAttention(nn.Module):
    """Multi-head attention (GQA/MQA, variants) on a flashprop kernel; batch-first (B, N, d_model).

    Args:
        d_model: model width; divisible by ``n_heads`` (head dim D = d_model // n_heads).
        n_heads: query heads Hq.
        n_kv_heads: key/value heads Hkv (default Hq); Hq % Hkv == 0, k and v projections are
            Hkv * D wide.
        causal: causal masking (the kernel's alignment; see the module docstring).
        bias: biases of all four projections on or off.
        kernel: a spec :func:`contract.registry.load_kernel` takes (registered name,
            ``module:attr``, ``file.py:attr``) or a loaded :class:`~contract.registry.Kernel`;
            default :func:`best_kernel`.
        scale: softmax scale (default 1/sqrt(D)).
        window_size: ``(left, right)`` sliding window, -1 for an unbounded side.
        softcap: logit soft-capping (0: off).
        alibi_slopes: ALiBi slopes (Hq,), kept as a float32 buffer.
        sinks: a learnable sink logit per query head (parameter ``sinks``, zeros at init).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        *,
        causal: bool = False,
        bias: bool = True,
        kernel: str | Kernel | None = None,
        scale: float | None = None,
        window_size: tuple[int, int] | None = None,
        softcap: float = 0.0,
        alibi_slopes: Tensor | None = None,
        sinks: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if alibi_slopes is not None and tuple(alibi_slopes.shape) != (n_heads,):
            raise ValueError(f"alibi_slopes must have shape ({n_heads},), got {tuple(alibi_slopes.shape)}")
        self.kernel = kernel if isinstance(kernel, Kernel) else load_kernel(kernel or best_kernel())
        self.d_model, self.n_heads, self.n_kv_heads = d_model, n_heads, n_kv_heads
        self.head_dim = d_model // n_heads
        self.causal, self.scale, self.softcap = causal, scale, softcap
        self.window_size = window_size
        refusal = self._undeclared(alibi_slopes is not None, sinks)
        if refusal is not None:
            raise ValueError(f"kernel {self.kernel.name} does not declare {refusal}")
        self._kernel_key = _register(self.kernel)
        factory = {"device": device, "dtype": dtype}
        kv_width = n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.k_proj = nn.Linear(d_model, kv_width, bias=bias, **factory)
        self.v_proj = nn.Linear(d_model, kv_width, bias=bias, **factory)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        slopes = None if alibi_slopes is None else alibi_slopes.to(device=device, dtype=torch.float32)
        self.register_buffer("alibi_slopes", slopes)
        sink_logits = torch.zeros(n_heads, device=device, dtype=torch.float32)
        self.register_parameter("sinks", nn.Parameter(sink_logits) if sinks else None)

    def _undeclared(self, alibi: bool, sinks: bool) -> str | None:
        """What this configuration asks of the kernel that its capabilities do not declare."""
        caps = self.kernel.capabilities
        asked = [
            (self.head_dim not in caps.head_dims, f"head dim D={self.head_dim}"),
            (self.causal and not caps.causal, "causal=True"),
            (self.n_kv_heads != self.n_heads and not caps.gqa, "GQA/MQA (n_kv_heads != n_heads)"),
            (self.scale is not None and not caps.custom_scale, "an explicit scale"),
            (self.window_size is not None and not caps.window, "window_size (capabilities.window)"),
            (bool(self.softcap) and not caps.softcap, "softcap (capabilities.softcap)"),
            (alibi and "head" not in caps.alibi, "alibi_slopes of shape (Hq,) (capabilities.alibi)"),
            (sinks and not caps.sinks, "sinks (capabilities.sinks)"),
        ]
        missing = [what for undeclared, what in asked if undeclared]
        return ", ".join(missing) if missing else None

    @classmethod
    def from_multihead_attention(
        cls, mha: nn.MultiheadAttention, *, causal: bool = False, kernel: str | Kernel | None = None
    ) -> FlashAttention:
        """The layer with ``mha``'s weights (copied): ``in_proj_weight`` / ``in_proj_bias`` split
        into q, k, v, and ``out_proj``. It computes ``mha(x, x, x, need_weights=False)[0]``
        (with a causal ``attn_mask`` when ``causal``) on batch-first input whether or not
        ``mha.batch_first`` (transpose sequence-first input yourself). Refused (``ValueError``):
        separate ``kdim``/``vdim``, ``add_bias_kv``, ``add_zero_attn`` and dropout."""
        if not mha._qkv_same_embed_dim:
            raise ValueError("MultiheadAttention with kdim/vdim != embed_dim is not supported")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("MultiheadAttention with add_bias_kv or add_zero_attn is not supported")
        if mha.dropout:
            raise ValueError(f"MultiheadAttention with dropout={mha.dropout} is not supported (no dropout)")
        weight = mha.in_proj_weight
        layer = cls(
            mha.embed_dim,
            mha.num_heads,
            causal=causal,
            bias=mha.in_proj_bias is not None,
            kernel=kernel,
            device=weight.device,
            dtype=weight.dtype,
        )
        projections = (layer.q_proj, layer.k_proj, layer.v_proj)
        with torch.no_grad():
            for proj, w in zip(projections, weight.chunk(3), strict=True):
                proj.weight.copy_(w)
            layer.out_proj.weight.copy_(mha.out_proj.weight)
            if mha.in_proj_bias is not None:
                for proj, b in zip(projections, mha.in_proj_bias.chunk(3), strict=True):
                    proj.bias.copy_(b)
                layer.out_proj.bias.copy_(mha.out_proj.bias)
        return layer

    def forward(self, x: Tensor, kv: Tensor | None = None) -> Tensor:
        """Self-attention over ``x`` (B, Nq, d_model), or cross-attention from ``x`` to ``kv``
        (B, Nk, d_model); returns (B, Nq, d_model)."""
        src = x if kv is None else kv
        q = self.q_proj(x).unflatten(-1, (self.n_heads, self.head_dim))
        k = self.k_proj(src).unflatten(-1, (self.n_kv_heads, self.head_dim))
        v = self.v_proj(src).unflatten(-1, (self.n_kv_heads, self.head_dim))
        # The variant tensors are float32 by the kernel contract, whatever the layer's dtype.
        alibi = None if self.alibi_slopes is None else self.alibi_slopes.float()
        sinks = None if self.sinks is None else self.sinks.float()
        if torch.compiler.is_compiling():
            config = (self._kernel_key, self.causal, self.scale, self.window_size, self.softcap)
            o = attention_op(q, k, v, *config, alibi, sinks)
        else:
            variants = _variants(self.window_size, self.softcap, alibi, sinks)
            o = _attend(self.kernel, q, k, v, self.causal, self.scale, variants)
        return self.out_proj(o.flatten(-2))

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, n_kv_heads={self.n_kv_heads}, "
            f"causal={self.causal}, kernel={self.kernel.name!r}"
        )
