"""CPU kernels for float32 models loaded here: linear layers as W·xᵀ (recorded per machine), grouped attention."""
from __future__ import annotations

import functools
import json
import os
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# The attention implementation this package registers with transformers, under its own name (transformers' "sdpa"
# stays as it is) and selected per model (`use_grouped_attention`).
GROUPED_SDPA = "adafuse_grouped_sdpa"
# The output layer is tried as W·xᵀ from this many rows (vocabulary entries) on: below it the layer is cheap anyway.
HEAD_ROWS = 4096


class CpuLinear(torch.nn.Linear):
    """A float32 CPU linear layer computed as W @ xᵀ for the row counts where that measured faster than `F.linear`'s
    x @ Wᵀ. With MKL on the machines this was measured on, x @ Wᵀ for a few rows takes one slow matrix-vector pass per
    row on one thread (a 262k × 640 output layer: 41 ms a row) where W @ xᵀ reads W once for all of them (25 ms for
    one or two rows); inner layers fed 1–32 positions run faster so when the process has two or more threads (whole
    forwards at 1,500 tokens of context: 4 positions about 1.5×, 5–32 positions 5–30 % faster; with one thread,
    slower: there they stay as they are). Other machines measure the opposite (docs/models-and-devices.md, CPU kernels),
    hence a choice recorded per machine (`choose_linears`). The same weights (tied embeddings stay tied); the results
    differ from `F.linear`'s in the last bits (another summation order). With gradients on: `F.linear` itself."""
    one = False        # a single row as W @ xᵀ too (doubled: one column takes MKL's slow path)
    most = 1 << 30     # W @ xᵀ up to this many rows
    threads = 1        # ... when the process runs at least this many torch threads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        rows = x.reshape(-1, x.shape[-1])  # (N, D)
        n = rows.shape[0]
        if x.device != w.device or x.dtype != w.dtype or (torch.is_grad_enabled() and w.requires_grad) or \
                not (2 <= n <= self.most or (n == 1 and self.one)) or torch.get_num_threads() < self.threads:
            return super().forward(x)
        y = torch.mm(w, (rows.repeat(2, 1) if n == 1 else rows).T).T  # (N or 2, V)
        y = y[:n].contiguous()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], w.shape[0])


class CpuHead(CpuLinear):
    one = True


class CpuInner(CpuLinear):
    one, most, threads = True, 32, 2  # past 32 rows F.linear's own path was as fast or faster (64, 120 rows)


@dataclass(frozen=True)
class LinearChoice:
    """Which linear layers of a model run as W·xᵀ, and what the probe measured when the choice was made."""
    output: bool = False       # the output layer as `CpuHead`
    inner_most: int = 0        # inner layers as `CpuInner` for 1..inner_most positions (0: `F.linear`)
    output_measured: str = ""  # "41 → 25 ms for 1 + 3 rows" (F.linear → W·xᵀ)
    inner_measured: str = ""


def use_cpu_kernels(model, record: Path, choice: bool | None = None) -> list[str]:
    """Put the CPU kernels into a float32 model on this machine's CPU: the linear layers `choose_linears` picks, and
    grouped attention where the heads are grouped. `choice` None: the choice recorded for this machine in `record`
    (measured and recorded on first use); True: every candidate layer as W·xᵀ; False: transformers' own layers and
    attention. Returns notes for the model's record saying what runs."""
    if choice is False:
        return []
    return use_linears(model, record, choice) + use_grouped_attention(model)


def _linears(model) -> tuple[torch.nn.Linear | None, list[torch.nn.Linear]]:
    """The output layer when it is a candidate (float32 on CPU, HEAD_ROWS rows or more), and the other candidates."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.device.type == "cpu"
               and m.weight.dtype == torch.float32]
    inner = [m for m in linears if m is not head]
    return (head if head in linears and head.weight.shape[0] >= HEAD_ROWS else None), inner


@functools.cache
def cpu_name() -> str:
    """This machine's CPU model (from /proc/cpuinfo where there is one; the platform's name otherwise)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key(head: torch.nn.Linear | None, inner: list[torch.nn.Linear]) -> str:
    """What a recorded choice holds for: this CPU, this torch, the torch threads, and the layers' shapes."""
    cpu = cpu_name()
    big = max(inner, key=lambda m: m.weight.numel()) if inner else None
    shape = lambda m: "none" if m is None else "×".join(map(str, m.weight.shape))  # noqa: E731
    return f"{cpu} | torch {torch.__version__} | {torch.get_num_threads()} threads | output {shape(head)} | " \
           f"inner {shape(big)}"


def _read_record(record: Path) -> dict:
    """The recorded choices (an unreadable file reads as none, and the next choice rewrites it)."""
    try:
        return json.loads(record.read_text()) if record.exists() else {}
    except (OSError, ValueError):
        return {}


def choose_linears(head: torch.nn.Linear | None, inner: list[torch.nn.Linear], record: Path,
                   choice: bool | None = None) -> tuple[LinearChoice, str]:
    """The layers to compute as W·xᵀ and where that choice comes from. Which is faster depends on the machine, so the
    first load on a machine measures it (`probe_linears`, a few hundred ms) and records it in `record` (JSON, by
    `machine_key`); later loads read it back, so two loads of a model on one machine run the same code. Delete or edit
    the entry to choose again; `choice` True takes every candidate without measuring. `head`, `inner`: the model's
    candidate layers (`_linears`)."""
    if choice:
        return LinearChoice(output=head is not None, inner_most=CpuInner.most if inner else 0), "chosen by the caller"
    key = machine_key(head, inner)
    known = _read_record(record)
    if key in known:
        return LinearChoice(**known[key]), f"recorded for this CPU in {record}"
    chosen = probe_linears(head, inner)
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        known = _read_record(record)
        if key in known:  # another load recorded it meanwhile: one choice per machine
            return LinearChoice(**known[key]), f"recorded for this CPU in {record}"
        tmp = record.with_name(record.name + f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({**known, key: asdict(chosen)}, indent=1, ensure_ascii=False))
        tmp.replace(record)
    except OSError:
        return LinearChoice(), f"measured here but {record} cannot be written, so transformers' own layers (the same " \
                               "code on every load)"
    return chosen, f"measured on this CPU and recorded in {record}"


def use_linears(model, record: Path, choice: bool | None = None) -> list[str]:
    """Swap the chosen layers (`choose_linears`); notes saying what runs and why."""
    head, inner = _linears(model)
    if head is None and not inner:
        return []
    chosen, why = choose_linears(head, inner, record, choice)
    notes = []
    if chosen.output and head is not None:
        head.__class__ = CpuHead
        measured = f": {chosen.output_measured}" if chosen.output_measured else ""
        notes.append(f"output layer as W·xᵀ on this CPU{measured}")
    if chosen.inner_most and inner:
        for m in inner:
            m.__class__ = CpuInner
            if chosen.inner_most != CpuInner.most:
                m.most = chosen.inner_most
        measured = f" ({chosen.inner_measured})" if chosen.inner_measured else ""
        notes.append(f"inner layers as W·xᵀ for 1–{chosen.inner_most} positions with {CpuInner.threads}+ threads"
                     f"{measured}")
    if not notes:
        measured = "; ".join(m for m in (chosen.output_measured, chosen.inner_measured) if m)
        notes.append("linear layers as transformers computes them (W·xᵀ " +
                     (f"measured no faster on this CPU: {measured})" if measured else "not chosen)"))
    return [f"{notes[0]}; {why}"] + notes[1:]


def probe_linears(head: torch.nn.Linear | None, inner: list[torch.nn.Linear]) -> LinearChoice:
    """Time W·xᵀ against `F.linear` on the output layer (1 and 3 rows) and the largest inner layer (1, 2 and 4 rows,
    then 16 and 32 for how far to go; about a second); keep W·xᵀ where it is clearly faster. Inner layers only with
    two or more torch threads (on one they stay as they are)."""
    output, output_measured, most, inner_measured = False, "", 0, ""
    with torch.inference_mode():
        if head is not None:
            plain, faster = _faster(head, CpuHead, (1, 3))
            output = faster < 0.9 * plain
            output_measured = f"{plain * 1000:.0f} → {faster * 1000:.0f} ms for 1 + 3 rows"
        if inner and torch.get_num_threads() >= CpuInner.threads:
            big = max(inner, key=lambda m: m.weight.numel())
            plain, faster = _faster(big, CpuInner, (1, 2, 4))
            inner_measured = f"{plain * 1e6:.0f} → {faster * 1e6:.0f} µs for 1 + 2 + 4 rows on the largest"
            if faster < 0.85 * plain:
                # up to 32 positions where W·xᵀ is not clearly slower there (in whole forwards it measured 5–30 %
                # faster for 5–32 positions on these machines, though a layer alone can time either way: hence the
                # tolerance)
                wide_plain, wide = _faster(big, CpuInner, (16, 32))
                most = CpuInner.most if wide <= 1.1 * wide_plain else 4
                inner_measured += f", {wide_plain * 1e6:.0f} → {wide * 1e6:.0f} µs for 16 + 32"
    return LinearChoice(output, most, output_measured, inner_measured)


def _faster(layer: torch.nn.Linear, kind: type, rows: tuple[int, ...], rounds: int = 5) -> tuple[float, float]:
    """Seconds of `layer` on each of `rows` rows, summed: as it is, and computed as `kind`. Each round times the two
    ways back to back (in turns, first one then the other first); the median round counts, so a busy spell on the
    machine (other processes on its cores) neither slows one way alone nor decides the choice."""
    xs = [torch.randn(n, layer.in_features) for n in rows]
    ways = (torch.nn.Linear, kind)
    sums: dict[type, list[float]] = {cls: [] for cls in ways}
    for r in range(rounds + 1):  # round 0 warms up
        for cls in (ways if r % 2 else ways[::-1]):
            layer.__class__ = cls
            t0 = time.perf_counter()
            for x in xs:
                layer(x)
            if r:
                sums[cls].append(time.perf_counter() - t0)
    layer.__class__ = torch.nn.Linear
    return statistics.median(sums[torch.nn.Linear]), statistics.median(sums[kind])


def grouped_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' SDPA attention, except on CPU with a mask (a batch, several new positions): there each key/value
    head is read in place by the query heads of its group (`enable_gqa`) instead of being copied once per query head
    first. transformers copies because CUDA's kernels fall back to the slow math path for grouped heads with a mask;
    the CPU flash kernel does not, and gives the same numbers bit for bit (tested). With 9 query heads on 3 key/value
    heads at 1,500 tokens of context: 6 rows × 3 positions 224 → 126 ms, one row × 5 positions 49 → 44 ms; 4 query
    heads on 1 unchanged."""
    groups = getattr(module, "num_key_value_groups", 1)
    if query.device.type != "cpu" or attention_mask is None or groups == 1 or kwargs.get("output_attentions"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def use_grouped_attention(model) -> list[str]:
    """Run `grouped_sdpa` as this model's attention when it computes on CPU with transformers' "sdpa" attention and
    its query heads are grouped; a note saying so. The function is registered with transformers under its own name
    (GROUPED_SDPA, with "sdpa"'s masks) and selected for this model only (`set_attn_implementation`): other models,
    and this one moved to a GPU, keep transformers' own function or get the same numbers."""
    cfg = getattr(model, "config", None)
    cfg = cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg
    heads, kv = getattr(cfg, "num_attention_heads", 0), getattr(cfg, "num_key_value_heads", 0) or 0
    if getattr(cfg, "_attn_implementation", None) != "sdpa" or not kv or heads <= kv or \
            next(model.parameters()).device.type != "cpu" or not hasattr(model, "set_attn_implementation"):
        return []
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)  # idempotent: the same function under the same name
    AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)
    model.set_attn_implementation(GROUPED_SDPA)
    if getattr(cfg, "_attn_implementation", None) != GROUPED_SDPA:  # a model class that cannot switch keeps "sdpa"
        return []
    return [f"attention: {heads} query heads read their {kv} key/value head{'s' if kv > 1 else ''} in place on this "
            "CPU (no copy per query head)"]
