"""The contract's three entry points' signatures, written once (``docs/variants.md``).

An entry point (``Problem.mode``) is its positional parameters (:data:`POSITIONAL`) and the
keywords of the contract it takes: the ones every entry point has (:data:`COMMON`: ``causal``,
``scale``, the tiles) and those of each variant row of ``contract/variants.py`` whose ``entry``
names it (``window_size``, ``softcap``, ..., ``cache_seqlens``, ``block_table``, ``num_splits``,
the FP8 descales and scales), each with its default, which means "off".

To add a keyword: a variant's is one ``_kw(name=default)`` in its row of ``contract/variants.py``;
one that every entry point takes is one pair in :data:`COMMON`. An adapter then takes it by naming
it in its ``keywords``.

How an adapter uses it::

    @entry_point("varlen", keywords=("causal", "scale", "window_size", "alibi_slopes"))
    def varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, kw):
        n_seq = check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        var = check_variants(n_seq, q.shape[1], q.device, **kw.variants)
        ...  # kw.causal, kw.scale

The decorated function has the canonical signature restricted to ``keywords``
(``inspect.signature`` and ``help`` show it, defaults included). A call is bound to it as Python
binds its own: a keyword the adapter does not take (an undeclared variant, a misspelling) raises
``TypeError("varlen() got an unexpected keyword argument 'softcap'")``, naming the entry point
by its ``__qualname__``, which the error contract counts as a clear refusal. The body gets the
positional arguments and then ``kw``, a frozen :class:`Keywords` record of every keyword of the
contract: the call's (defaults applied), the rest at their defaults (off).

The references (``refimpl/golden.py``, ``refimpl/yardstick.py``) take the contract's keywords
the same way, with parameters of their own beside them (``positional=``, ``extra=``: the golden's
``alignment`` and ``chunk``, the backward's ``do``).

This is for flashprop's own adapters and references: the contract asks a kernel for a callable,
and a user's adapter with a plain hand-written signature is as good (``docs/kernels.md``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .validate import check_variants
from .variants import BY_NAME, ENTRY_MODES, REQUIRED, TABLE

#: Per entry point (``Problem.mode``): its positional parameters.
POSITIONAL: dict[str, tuple[str, ...]] = {
    "dense": ("q", "k", "v"),
    "varlen": ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k"),
    "kvcache": ("q", "k_cache", "v_cache"),
}
#: The keywords every entry point has, with their defaults: the causal mask, the softmax scale
#: (``None``: 1/sqrt(D)) and the tiles (``Capabilities.block_m`` / ``block_n``).
COMMON: tuple[tuple[str, object], ...] = (
    ("causal", False), ("scale", None), ("block_m", None), ("block_n", None),
)


def _keywords(mode: str) -> dict[str, object]:
    """The keywords of entry point ``mode`` with their defaults, in the order its signature shows
    them: the rows that are the entry point itself first (``cache_seqlens``, ...), then
    :data:`COMMON`, then the variants' in the table's order."""
    rows = [v for v in TABLE if mode in ENTRY_MODES[v.entry]]
    own = [v for v in rows if v.entry == mode]
    return dict([*(kw for v in own for kw in v.signature), *COMMON,
                 *(kw for v in rows if v not in own for kw in v.signature)])


#: Per entry point: every keyword it has, with its default (:data:`~contract.variants.REQUIRED`:
#: none, the call gives it).
KEYWORDS: dict[str, dict[str, object]] = {mode: _keywords(mode) for mode in POSITIONAL}
#: The names :func:`~contract.validate.check_variants` takes (:attr:`Keywords.variants`).
_VARIANT_NAMES = tuple(name for name, p in inspect.signature(check_variants).parameters.items()
                       if p.kind is p.KEYWORD_ONLY)


def _record_fields() -> list[tuple[str, type, Any]]:
    defaults: dict[str, object] = {}
    for keywords in KEYWORDS.values():
        for name, default in keywords.items():
            defaults.setdefault(name, None if default is REQUIRED else default)
    return [(name, object, dataclasses.field(default=d)) for name, d in defaults.items()]


def _variants(self) -> dict[str, object]:
    """The variant keywords as :func:`~contract.validate.check_variants` takes them."""
    return {name: getattr(self, name) for name in _VARIANT_NAMES}


#: One call's keywords: every keyword of the contract (of all three entry points), the call's as
#: given or defaulted, the others at their defaults (a required one, ``cache_seqlens``, ``None``
#: outside decode). ``kw.variants``: those :func:`~contract.validate.check_variants` takes.
Keywords = dataclasses.make_dataclass("Keywords", _record_fields(), frozen=True,
                                      namespace={"variants": property(_variants), "__module__": __name__})


def keywords_of(*variants: str) -> tuple[str, ...]:
    """The keywords of the variant table's rows named ``variants``, in the order given."""
    return tuple(name for variant in variants for name in BY_NAME[variant].keywords)


def signature(mode: str, keywords: Iterable[str], positional: tuple[str, ...] | None = None,
              extra: Mapping[str, object] | None = None) -> inspect.Signature:
    """The signature of entry point ``mode`` taking the contract's ``keywords`` (in the canonical
    order whatever the order given), after them ``extra``'s keywords with their defaults (a
    reference's own, outside the contract), the positional parameters ``positional`` (default:
    the entry point's). A name that is no keyword of ``mode``, or a required keyword left out, is
    a ``ValueError``: an adapter's mistake, found at import."""
    if mode not in POSITIONAL:
        raise ValueError(f"no entry point {mode!r}: one of {sorted(POSITIONAL)}")
    contract = KEYWORDS[mode]
    taken = set(keywords)
    if unknown := sorted(taken - contract.keys()):
        raise ValueError(f"{', '.join(unknown)}: no keyword of the {mode} entry point "
                         f"({', '.join(contract)})")
    if missing := [name for name, d in contract.items() if d is REQUIRED and name not in taken]:
        raise ValueError(f"the {mode} entry point requires the keyword(s) {', '.join(missing)}")
    if clash := sorted(taken & set(extra or ())):
        raise ValueError(f"{', '.join(clash)}: a keyword of the contract, not an extra one")
    P = inspect.Parameter
    return inspect.Signature([
        *(P(name, P.POSITIONAL_OR_KEYWORD) for name in positional or POSITIONAL[mode]),
        *(P(name, P.KEYWORD_ONLY, default=d) for name, d in contract.items() if name in taken),
        *(P(name, P.KEYWORD_ONLY, default=d) for name, d in (extra or {}).items()),
    ])


def entry_point(mode: str, keywords: Iterable[str], *, positional: tuple[str, ...] | None = None,
                extra: Mapping[str, object] | None = None) -> Callable[[Callable], Callable]:
    """Decorate ``body(*positional, kw, **extra)`` into entry point ``mode`` taking ``keywords``
    (the module docstring). ``positional`` and ``extra`` are for the references, which take
    parameters of their own (the golden backward's ``do``, the golden's ``alignment`` and
    ``chunk``): the body gets ``extra``'s keywords as keywords. The result has ``__signature__``
    (:func:`signature`) and ``keywords``, the frozenset of the contract's keywords it takes;
    ``__wrapped__`` is the body."""
    sig = signature(mode, keywords, positional, extra)
    positional = positional or POSITIONAL[mode]
    own = tuple(extra or ())
    taken = tuple(name for name in sig.parameters if name not in positional and name not in own)

    def decorate(body: Callable) -> Callable:
        @functools.wraps(body)
        def entry(*args: Any, **kwargs: Any) -> Any:
            try:
                bound = sig.bind(*args, **kwargs)
            except TypeError as err:  # Python's own message, naming the entry point
                raise TypeError(f"{entry.__qualname__}() {err}") from None
            bound.apply_defaults()
            values = bound.arguments
            kw = Keywords(**{name: values[name] for name in taken})
            return body(*(values[name] for name in positional), kw, **{name: values[name] for name in own})

        entry.__signature__ = sig.replace(return_annotation=inspect.signature(body).return_annotation)
        entry.keywords = frozenset(taken)
        return entry

    return decorate
