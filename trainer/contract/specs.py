"""The specs: what a model, a plan, a cluster, a dataset and a whole run are.

Each spec is a frozen dataclass that validates itself with messages naming the numbers, converts to and from JSON
with a ``schema_version`` and round-trips exactly. Every rule about a plan (alone, against its model and cluster, what
each engine refuses) is in ``rules``, which ``ParallelPlan`` and ``RunSpec`` call; the pipeline schedules and their
families are in ``schedules``.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from trainer.contract.gpus import GPU_FIGURES, PRESET_INTER_NODE_GBS, gpu_fields
from trainer.contract.rules import add_problem as _add
from trainer.contract.rules import check_plan, plan_alone_problems, within_limits, within_world_limit
from trainer.contract.rules import positive as _positive
from trainer.contract.schedules import MULTI_CHUNK_SCHEDULES, Schedule
from trainer.contract.specjson import SCHEMA_VERSION, SpecError, from_dict, to_dict

Engine = Literal["native", "deepspeed", "megatron"]
Checkpointing = Literal["none", "selective", "full"]
Precision = Literal["fp32", "bf16", "fp16"]
Positions = Literal["learned", "rope"]
Activation = Literal["gelu", "gelu_tanh", "swiglu"]
Norm = Literal["layernorm", "rmsnorm"]
TopKNorm = Literal["auto", "renormalize", "none"]
LRSchedule = Literal["cosine", "linear", "constant"]

__all__ = ["RopeScaling", "ModelSpec", "ParallelPlan", "GPUSpec", "ClusterSpec", "DatasetSpec", "OptimizerSpec",
           "ProfileSpec", "InitFrom", "RunSpec", "check_run"]


@functools.cache
def _float_fields(cls: type) -> tuple[str, ...]:
    """Names of a spec's float fields, looked up once per class: the tuner builds specs by the hundred thousand."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.type in ("float", float))


class _Spec:
    """JSON in and out, shared by every spec. Subclasses add ``problems()``."""

    def __post_init__(self):
        # Store 80 given for a float field as 80.0, so that equal specs always write the same JSON text.
        for name in _float_fields(type(self)):
            value = getattr(self, name)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))

    def problems(self) -> dict[str, list[str]]:
        return {}

    def validate(self):
        problems = {k: v for k, v in self.problems().items() if v}
        if problems:
            raise SpecError(problems)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, **to_dict(self)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, data: Any, validate: bool = True):
        spec = from_dict(cls, data)
        return spec.validate() if validate else spec

    @classmethod
    def from_json(cls, text: str, validate: bool = True):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError.single("", f"not valid JSON: {exc}") from None
        return cls.from_dict(data, validate=validate)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class RopeScaling(_Spec):
    """Llama 3.1's scaling of rotary frequencies for long contexts (``rope_type: llama3``): wavelengths longer than
    original_max_positions / low_freq_factor are divided by ``factor``, those shorter than original_max_positions /
    high_freq_factor are kept, and those between are blended smoothly."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_positions: int = 8192

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        if self.factor < 1.0:
            _add(p, "factor", f"factor={self.factor} must be at least 1 (it stretches wavelengths)")
        if not 0 < self.low_freq_factor < self.high_freq_factor:
            _add(p, "low_freq_factor", f"low_freq_factor={self.low_freq_factor} must be positive and below "
                                       f"high_freq_factor={self.high_freq_factor}")
        if not 0 < self.original_max_positions <= 1_048_576:
            _add(p, "original_max_positions", f"original_max_positions={self.original_max_positions} must be "
                                              f"between 1 and 1,048,576")
        return p


def default_ffn(d_model: int, gated: bool) -> int:
    """The MLP width when the spec gives none: 4·d_model, or for SwiGLU's three matrices 8/3·d_model rounded up to
    a multiple of 256 (as Llama does), about the same parameters and FLOPs."""
    return -(-(8 * d_model) // (3 * 256)) * 256 if gated else 4 * d_model


@dataclass(frozen=True)
class ModelSpec(_Spec):
    """A decoder-only transformer: GPT-2-style (LayerNorm, GELU MLP, learned positions) or Llama-style (RMSNorm,
    SwiGLU MLP, rotary positions), dense or with mixture-of-experts MLPs (Mixtral, Qwen2-MoE).

    ``n_kv_heads`` < ``n_heads`` gives grouped-query attention; 0 means "same as n_heads".
    ``norm``: pre-normalisation of each block and of the output, LayerNorm (with a bias when ``bias``) or RMSNorm
    (no bias), both with ``norm_eps``.
    ``activation``: the MLP. "gelu" is the exact x·Φ(x) and "gelu_tanh" the approximation GPT-2 was trained with,
    each x → GELU(x W_up) W_down; "swiglu" is (SiLU(x W_gate) ⊙ x W_up) W_down, three matrices.
    ``ffn_hidden``: the MLP's (gated) width; 0 means 4 × d_model for GELU and Llama's 8/3 × d_model rounded up to a
    multiple of 256 for SwiGLU.
    ``rope_base`` θ of the rotary frequencies θ^(−2i/D); ``rope_scaling`` Llama 3.1's long-context scaling.
    Biases: ``bias`` is every bias's default (LayerNorm, attention, MLP); ``attention_bias`` (q, k, v and the
    output projection), ``qkv_bias`` (q, k, v only: Qwen2) and ``mlp_bias`` override it where given.
    Mixture of experts: ``n_experts`` ≤ 1 is a dense model; otherwise every ``moe_every``-th block (counting from 1)
    after the first ``first_dense_layers`` routes each token to ``top_k`` of ``n_experts`` MLPs of width
    ``moe_ffn_hidden`` (0: ffn). ``capacity_factor`` caps each expert at capacity_factor × tokens × top_k / n_experts
    tokens; 0 drops no token (as Hugging Face's models compute). ``topk_norm``: the chosen experts' weights are
    their router probabilities renormalised to sum to 1 ("renormalize": Mixtral, GShard) or as they are ("none":
    Qwen2-MoE, Switch); "auto" renormalises when top_k > 1. ``shared_expert_ffn`` > 0 adds one MLP of that width
    that every token passes through beside the routed experts, scaled by sigmoid(x·w) when ``shared_expert_gate``
    (Qwen2-MoE; DeepSeek's shared experts have no gate).
    """

    n_layers: int
    d_model: int
    n_heads: int
    seq_len: int
    vocab_size: int
    name: str = ""
    n_kv_heads: int = 0
    ffn_hidden: int = 0
    positions: Positions = "learned"
    activation: Activation = "gelu"
    tied_embeddings: bool = True
    bias: bool = True
    dropout: float = 0.0
    n_experts: int = 0
    top_k: int = 2
    capacity_factor: float = 1.25
    moe_every: int = 1
    aux_loss_coef: float = 0.01
    norm: Norm = "layernorm"
    norm_eps: float = 1e-5
    rope_base: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    attention_bias: Optional[bool] = None
    qkv_bias: Optional[bool] = None
    mlp_bias: Optional[bool] = None
    moe_ffn_hidden: int = 0
    first_dense_layers: int = 0
    topk_norm: TopKNorm = "auto"
    shared_expert_ffn: int = 0
    shared_expert_gate: bool = False

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def is_gated(self) -> bool:
        """The MLP has three matrices (gate, up, down) rather than two."""
        return self.activation == "swiglu"

    @property
    def ffn(self) -> int:
        return self.ffn_hidden or default_ffn(self.d_model, self.is_gated)

    @property
    def moe_ffn(self) -> int:
        """One routed expert's width."""
        return self.moe_ffn_hidden or self.ffn

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def has_qkv_bias(self) -> bool:
        return self.qkv_bias if self.qkv_bias is not None else self.has_attention_out_bias

    @property
    def has_attention_out_bias(self) -> bool:
        return self.attention_bias if self.attention_bias is not None else self.bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.mlp_bias if self.mlp_bias is not None else self.bias

    @property
    def has_norm_bias(self) -> bool:
        return self.norm == "layernorm" and self.bias

    @property
    def renormalizes_topk(self) -> bool:
        return self.topk_norm == "renormalize" or (self.topk_norm == "auto" and self.top_k > 1)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def family(self) -> str:
        """The published family this shape belongs to, by its blocks: "gpt" (LayerNorm, GELU), "llama" (RMSNorm,
        SwiGLU), "qwen2" (Llama's blocks with q/k/v biases only), "mixtral" (Llama's blocks with routed experts),
        "qwen2-moe" (with a shared expert too)."""
        if not self.is_gated and self.norm == "layernorm":
            return "gpt"
        if self.is_moe:
            return "qwen2-moe" if self.shared_expert_ffn else "mixtral"
        return "qwen2" if self.has_qkv_bias and not self.has_attention_out_bias else "llama"

    def is_moe_layer(self, index: int) -> bool:
        """Layer ``index`` (0-based) has experts: past the first ``first_dense_layers``, every moe_every-th layer
        counting from 1 (layers moe_every-1, 2·moe_every-1, …)."""
        return self.is_moe and index >= self.first_dense_layers and (index + 1) % self.moe_every == 0

    def moe_layers_among(self, k: int) -> int:
        """How many of the first ``k`` layers have experts."""
        if not self.is_moe:
            return 0
        return k // self.moe_every - min(k, self.first_dense_layers) // self.moe_every

    def moe_layers_between(self, start: int, stop: int) -> int:
        """How many of layers start … stop−1 have experts (a pipeline stage's)."""
        return self.moe_layers_among(stop) - self.moe_layers_among(start)

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.n_layers) if self.is_moe_layer(i))

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        _positive(p, self, "n_layers", "d_model", "n_heads", "seq_len", "vocab_size")
        if self.n_heads > 0 and self.d_model % self.n_heads:
            _add(p, "n_heads", f"n_heads={self.n_heads} does not divide d_model={self.d_model}")
        if self.n_kv_heads < 0:
            _add(p, "n_kv_heads", f"n_kv_heads={self.n_kv_heads} must be 0 (same as n_heads) or positive")
        elif self.n_kv_heads and self.n_heads > 0 and self.n_heads % self.n_kv_heads:
            _add(p, "n_kv_heads", f"n_kv_heads={self.n_kv_heads} does not divide n_heads={self.n_heads}")
        if self.ffn_hidden < 0:
            _add(p, "ffn_hidden", f"ffn_hidden={self.ffn_hidden} must be 0 (the activation's default) or positive")
        if self.positions == "rope" and self.n_heads > 0 and self.d_model % self.n_heads == 0 and self.head_dim % 2:
            _add(p, "positions", f"rotary positions need an even head_dim, got {self.head_dim}")
        if not 0.0 <= self.dropout < 1.0:
            _add(p, "dropout", f"dropout={self.dropout} must be in [0, 1)")
        if not 0.0 < self.norm_eps < 1.0:
            _add(p, "norm_eps", f"norm_eps={self.norm_eps} must be in (0, 1); models use 1e-5 or 1e-6")
        if self.rope_base <= 1.0:
            _add(p, "rope_base", f"rope_base={self.rope_base} must be above 1 (Llama 3 uses 500,000)")
        if self.rope_scaling is not None:
            if self.positions != "rope":
                _add(p, "rope_scaling", "rope_scaling needs positions='rope'")
            for key, messages in self.rope_scaling.problems().items():
                p[f"rope_scaling.{key}"] = messages
        if self.n_experts < 0:
            _add(p, "n_experts", f"n_experts={self.n_experts} must be 0 or more")
        if self.is_moe:
            self._moe_problems(p)
        return p

    def _moe_problems(self, p: dict[str, list[str]]) -> None:
        if not 1 <= self.top_k <= self.n_experts:
            _add(p, "top_k", f"top_k={self.top_k} must be between 1 and n_experts={self.n_experts}")
        if self.capacity_factor < 0:
            _add(p, "capacity_factor", f"capacity_factor={self.capacity_factor} must be positive, or 0 to drop "
                                       f"no token")
        if not 1 <= self.moe_every <= max(self.n_layers, 1):
            _add(p, "moe_every", f"moe_every={self.moe_every} must be between 1 and n_layers={self.n_layers}")
        if self.aux_loss_coef < 0:
            _add(p, "aux_loss_coef", f"aux_loss_coef={self.aux_loss_coef} must not be negative")
        for name in ("moe_ffn_hidden", "shared_expert_ffn", "first_dense_layers"):
            if getattr(self, name) < 0:
                _add(p, name, f"{name}={getattr(self, name)} must not be negative")
        if self.shared_expert_gate and not self.shared_expert_ffn:
            _add(p, "shared_expert_gate", "a shared expert's gate needs a shared expert: set shared_expert_ffn")
        if self.n_layers > 0 and 1 <= self.moe_every and not self.moe_layers:
            _add(p, "first_dense_layers", f"first_dense_layers={self.first_dense_layers} and moe_every="
                                          f"{self.moe_every} leave none of the {self.n_layers} layers with experts")


@dataclass(frozen=True)
class ParallelPlan(_Spec):
    """How one step is spread over dp × cp × tp × pp ranks.

    gradient accumulation = global_batch / (micro_batch × dp); with pp > 1 those micro-batches feed the pipeline.
    ``ep`` experts-parallel degree divides dp: experts are spread over the data-parallel ranks.
    ``zero_stage``: deepspeed engine 0–3; native engine 0 (DDP) or 3 (FSDP2, fully sharded); megatron 0, or 1 for
    its distributed optimizer (optimizer states sharded over data parallel).
    ``engine``: "native" or "deepspeed" train here; "megatron" describes a run of Megatron-LM for the planner (its
    memory and its defaults), which the workbench does not launch.
    ``virtual_stages``: model chunks per pipeline rank: v ≥ 2 with the interleaved schedule, any v with
    zb-interleaved, exactly 2 with the V-shaped zbv and dualpipev, 1 otherwise.
    """

    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    global_batch: int = 1
    sequence_parallel: bool = False
    ep: int = 1
    engine: Engine = "native"
    zero_stage: int = 0
    activation_checkpointing: Checkpointing = "none"
    precision: Precision = "fp32"
    pipeline_schedule: Schedule = "1f1b"
    virtual_stages: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    cp: int = 1
    stage_layers: tuple[int, ...] = ()
    first_stage_layers: int = 0
    last_stage_layers: int = 0

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def model_chunks(self) -> int:
        """Model chunks each pipeline rank holds: v under the multi-chunk schedules, one otherwise."""
        return self.virtual_stages if self.pipeline_schedule in MULTI_CHUNK_SCHEDULES else 1

    @property
    def grad_accum(self) -> int:
        """Micro-batches each data-parallel rank runs per step (the pipeline's m when pp > 1)."""
        return self.global_batch // (self.micro_batch * self.dp) if self.micro_batch * self.dp else 0

    def problems(self) -> dict[str, list[str]]:
        return plan_alone_problems(self)


@dataclass(frozen=True)
class GPUSpec(_Spec):
    """One accelerator: memory in GB (10^9 bytes), dense bf16 peak in TFLOP/s, memory bandwidth in GB/s."""

    name: str
    memory_gb: float
    peak_tflops: float
    memory_bandwidth_gbs: float

    @staticmethod
    def preset_names() -> tuple[str, ...]:
        """Names a cluster may give instead of a GPU's figures."""
        return tuple(GPU_FIGURES)

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        _positive(p, self, "memory_gb", "peak_tflops", "memory_bandwidth_gbs")
        return p


@dataclass(frozen=True)
class ClusterSpec(_Spec):
    """Nodes of identical GPUs. Bandwidths are per GPU in GB/s: intra-node (NVLink) and inter-node (network)."""

    gpu: GPUSpec
    nodes: int = 1
    gpus_per_node: int = 8
    intra_node_bandwidth_gbs: float = 300.0
    inter_node_bandwidth_gbs: float = 25.0
    gpu_hour_cost: float = 0.0
    name: str = ""

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    @staticmethod
    def expand_json(data: Any, path: str = "") -> Any:
        """``"gpu": "<preset name>"`` stands for that GPU's figures, with its NVLink bandwidth within a node, the
        preset network between nodes and a name saying what the cluster is, unless those are given."""
        if not isinstance(data, dict) or not isinstance(data.get("gpu"), str):
            return data
        name = data["gpu"]
        if name not in GPU_FIGURES:
            raise SpecError.single(f"{path}.gpu" if path else "gpu",
                                   f"unknown GPU {name!r}; presets: {', '.join(GPU_FIGURES)}, or an object of "
                                   f"GPUSpec fields")
        shape = f"{data.get('nodes', 1)}x{data.get('gpus_per_node', ClusterSpec.gpus_per_node)}"
        return {"intra_node_bandwidth_gbs": GPU_FIGURES[name]["nvlink_gbs"],
                "inter_node_bandwidth_gbs": PRESET_INTER_NODE_GBS, "name": f"{shape} {name}",
                **data, "gpu": gpu_fields(name)}

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        _positive(p, self, "nodes", "gpus_per_node", "intra_node_bandwidth_gbs", "inter_node_bandwidth_gbs")
        if not p:
            within_world_limit(p, "nodes", "nodes×gpus_per_node GPUs", self.world_size)
        if self.gpu_hour_cost < 0:
            _add(p, "gpu_hour_cost", f"gpu_hour_cost={self.gpu_hour_cost} must not be negative")
        for key, messages in self.gpu.problems().items():
            p[f"gpu.{key}"] = messages
        return p


@dataclass(frozen=True)
class DatasetSpec(_Spec):
    """A file or folder of text, JSONL (also .gz, .zst), Parquet or Megatron indexed (.bin + .idx) data; prepared
    into token ids beside ``prepared_dir``.

    ``text_field``: the JSONL key or Parquet column that holds each document's text.
    ``max_bad_fraction``: the share of JSONL or Parquet rows that may be unreadable (skipped and reported) before
    the source is refused.
    ``tokenizer``: an existing tokenizer (a tokenizer.json, or a folder with one or with GPT-2's vocab.json and
    merges.txt) instead of training one; needed for Megatron data, whose documents are token ids already.
    """

    path: str
    prepared_dir: str = ""
    tokenizer_vocab: int = 0
    val_fraction: float = 0.05
    text_field: str = "text"
    max_bad_fraction: float = 0.01
    tokenizer: str = ""

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        if not self.path:
            _add(p, "path", "a dataset needs a path")
        if self.tokenizer_vocab < 0:
            _add(p, "tokenizer_vocab", f"tokenizer_vocab={self.tokenizer_vocab} must be 0 (the model's) or positive")
        if not 0.0 < self.val_fraction < 0.5:
            _add(p, "val_fraction", f"val_fraction={self.val_fraction} must be in (0, 0.5)")
        if not self.text_field:
            _add(p, "text_field", "text_field names the JSONL key or Parquet column of the text; it cannot be empty")
        if not 0.0 <= self.max_bad_fraction < 1.0:
            _add(p, "max_bad_fraction", f"max_bad_fraction={self.max_bad_fraction} must be in [0, 1)")
        return p


@dataclass(frozen=True)
class OptimizerSpec(_Spec):
    """AdamW with linear warmup then the named decay down to min_lr; gradients clipped to grad_clip (0: off)."""

    lr: float = 3e-4
    min_lr: float = 3e-5
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    warmup_steps: int = 0
    schedule: LRSchedule = "cosine"

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        _positive(p, self, "lr", "eps")
        if self.min_lr < 0 or self.min_lr > self.lr:
            _add(p, "min_lr", f"min_lr={self.min_lr} must be between 0 and lr={self.lr}")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                _add(p, name, f"{name}={getattr(self, name)} must be in [0, 1)")
        for name in ("weight_decay", "grad_clip", "warmup_steps"):
            if getattr(self, name) < 0:
                _add(p, name, f"{name}={getattr(self, name)} must not be negative")
        return p


@dataclass(frozen=True)
class ProfileSpec(_Spec):
    """torch.profiler over steps [start_step, start_step + steps) after ``warmup`` unrecorded steps."""

    start_step: int = 5
    steps: int = 3
    warmup: int = 1
    name: str = "default"

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        _positive(p, self, "steps")
        if self.warmup < 0 or self.start_step < 0:
            _add(p, "start_step", "start_step and warmup must not be negative")
        if self.warmup > self.start_step:
            _add(p, "warmup", f"warmup={self.warmup} steps must come before start_step={self.start_step}")
        if not self.name or "/" in self.name or self.name.startswith("."):
            _add(p, "name", f"profile name {self.name!r} must be a plain folder name")
        return p


@dataclass(frozen=True)
class InitFrom(_Spec):
    """Start a run from a checkpoint's weights instead of the seeded initialisation: any checkpoint folder, of any
    plan and engine, trained here or imported (``python -m deploy import-hf``). The run trains with its own plan and
    optimizer from step 0; ``keep_tokenizer`` tokenizes the dataset with the checkpoint's tokenizer."""

    checkpoint: str
    keep_tokenizer: bool = True

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        if not self.checkpoint:
            _add(p, "checkpoint", "give the checkpoint folder to start from")
        return p


@dataclass(frozen=True)
class BlendSource(_Spec):
    """One more dataset a run trains on, beside its own, with its weight: the share of the training sequences drawn
    from it is weight / (the sum of the weights); its validation loss is reported under ``name``."""

    name: str
    dataset: DatasetSpec
    weight: float = 1.0

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        if not self.name or len(self.name) > 64:
            _add(p, "name", f"a blend source needs a name of 1 to 64 characters, got {self.name!r}")
        if not (self.weight > 0 and math.isfinite(self.weight)):
            _add(p, "weight", f"weight={self.weight} must be a positive number")
        for key, messages in self.dataset.problems().items():
            p[f"dataset.{key}"] = messages
        return p


MAIN_SOURCE = "main"  # the name a blend gives the run's own dataset


@dataclass(frozen=True)
class RunSpec(_Spec):
    """Everything one training run needs; written once as spec.json in the run folder before launch.

    ``blend``: other datasets trained on beside ``dataset`` (whose weight is ``dataset_weight`` and whose name in
    the blend is "main"); empty: ``dataset`` alone.
    ``spike_factor``, ``spike_window``: a step whose loss is not finite, or above ``spike_factor`` × the median of
    the ``spike_window`` steps before it, is a loss spike: the run goes back to its newest checkpoint and skips the
    batches from there to the spike (trainer/engine/spikes.py). 0: only a loss that is not finite is one.
    ``straggler_factor``, ``straggler_window``: a rank whose own forward and backward take, as a median over the
    window, that many times the other ranks' is named in a straggler event (trainer/engine/stragglers.py); 0: not
    judged.
    """

    model: ModelSpec
    plan: ParallelPlan
    cluster: ClusterSpec
    dataset: DatasetSpec
    output_dir: str
    steps: int = 100
    optimizer: OptimizerSpec = field(default_factory=OptimizerSpec)
    seed: int = 1234
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    eval_every: int = 0
    eval_batches: int = 4
    log_every: int = 1
    profile: Optional[ProfileSpec] = None
    name: str = ""
    init_from: Optional[InitFrom] = None
    blend: tuple[BlendSource, ...] = ()
    dataset_weight: float = 1.0
    spike_factor: float = 3.0
    spike_window: int = 20
    straggler_factor: float = 1.5
    straggler_window: int = 20

    def problems(self) -> dict[str, list[str]]:
        p: dict[str, list[str]] = {}
        within_limits(p, self)
        _positive(p, self, "steps", "eval_batches", "log_every")
        if not (self.spike_factor == 0 or (self.spike_factor > 1 and math.isfinite(self.spike_factor))):
            _add(p, "spike_factor", f"spike_factor={self.spike_factor} must be above 1 (a loss that many times the "
                                    f"recent median is a spike), or 0 to judge only losses that are not finite")
        if self.spike_window < 2:
            _add(p, "spike_window", f"spike_window={self.spike_window} must be at least 2 steps")
        if not (self.straggler_factor == 0 or (self.straggler_factor > 1 and math.isfinite(self.straggler_factor))):
            _add(p, "straggler_factor", f"straggler_factor={self.straggler_factor} must be above 1 (a rank whose own "
                                        f"work takes that many times the others' is a straggler), or 0: not judged")
        if self.straggler_window < 2:
            _add(p, "straggler_window", f"straggler_window={self.straggler_window} must be at least 2 steps")
        for name in ("checkpoint_every", "eval_every", "seed"):
            if getattr(self, name) < 0:
                _add(p, name, f"{name}={getattr(self, name)} must not be negative")
        if self.keep_checkpoints < 1:
            _add(p, "keep_checkpoints", f"keep_checkpoints={self.keep_checkpoints} must be at least 1")
        if not self.output_dir:
            _add(p, "output_dir", "a run needs an output folder")
        parts = {"model": self.model, "plan": self.plan, "cluster": self.cluster, "dataset": self.dataset,
                 "optimizer": self.optimizer}
        if self.profile is not None:
            parts["profile"] = self.profile
        if self.init_from is not None:
            parts["init_from"] = self.init_from
        for i, source in enumerate(self.blend):
            parts[f"blend[{i}]"] = source
        names = [source.name for source in self.blend]
        if MAIN_SOURCE in names or len(set(names)) < len(names):
            _add(p, "blend", f"blend sources need names of their own, other than {MAIN_SOURCE!r} (the run's own "
                             f"dataset): got {names}")
        if not (self.dataset_weight > 0 and math.isfinite(self.dataset_weight)):
            _add(p, "dataset_weight", f"dataset_weight={self.dataset_weight} must be a positive number")
        for prefix, part in parts.items():
            for key, messages in part.problems().items():
                p[f"{prefix}.{key}" if key else prefix] = messages
        if self.plan.engine == "megatron":
            _add(p, "plan.engine", "engine='megatron' plans a Megatron-LM run for the planner; the workbench trains "
                                   "with engine='native' or 'deepspeed'")
        if not any(p.get(k) for k in p if k.startswith(("model", "plan", "cluster"))):
            for key, messages in check_plan(self.model, self.plan, self.cluster).items():
                p.setdefault(f"plan.{key}" if key else "plan", []).extend(messages)
        return p


def blend_sources(spec: RunSpec) -> list[BlendSource]:
    """Every dataset ``spec`` trains on with its weight: its own first (named "main"), then its blend's."""
    return [BlendSource(MAIN_SOURCE, spec.dataset, spec.dataset_weight), *spec.blend]


def check_run(spec: RunSpec) -> RunSpec:
    """Validate a whole run (each part and the plan against model and cluster); return it or raise SpecError."""
    return spec.validate()
