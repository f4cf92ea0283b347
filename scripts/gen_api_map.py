#!/usr/bin/env python
"""Generate compat_table/api_to_aten.yaml: Python API -> aten ops it dispatches to.

    python scripts/gen_api_map.py [--out compat_table/api_to_aten.yaml]

Each API is called on small CPU inputs under a TorchDispatchMode that records every aten overload reaching
the dispatcher below autograd (CompositeImplicitAutograd ops are already decomposed there, so `torch.linalg.qr`
records `aten::linalg_qr` and `F.gelu` records `aten::gelu`). For plain functions a list of argument patterns is
tried in order and the first call that succeeds is recorded; shape-specific APIs (convolutions, pooling, losses,
attention, nn modules) have hand-written calls. Forward ops only. oneDNN is disabled while recording so that
composite modules (LSTM/GRU) decompose as on a non-CPU backend instead of calling CPU-only mkldnn kernels.

Names are recorded as overloads ("aten::add.Tensor"; the default overload is written as the bare packet
"aten::atan2"). Device-dependent dispatch (SDPA picks a CPU kernel here) is rewritten through DEVICE_SUBSTITUTIONS,
listed in the file header.

Needs torch; the neuron_migrate loader that reads the output never imports torch.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import sys
import warnings
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from device_substitutions import DeviceSubstitutes  # noqa: E402  (F.dropout -> native_dropout, SDPA choice)

# CPU-only dispatch decisions replaced by what the Neuron backend selects (with the reason, written to the header).
DEVICE_SUBSTITUTIONS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": (
        "aten::_scaled_dot_product_fused_attention_overrideable",
        "On CPU, SDPA picks the CPU flash kernel; on Neuron the PrivateUse1 _fused_sdp_choice stub selects the "
        "'overrideable' fused attention for 4-D query/key/value (pre-release source csrc/aten/SdpBackendSelection.cpp).",
    ),
}

# Python-level substitutions applied while recording (scripts/device_substitutions.py), listed in the header.
API_SUBSTITUTIONS = {
    "torch.nn.functional.dropout (training)": {
        "replaced_by": "aten::native_dropout",
        "why": "A CPU tensor takes empty_like + bernoulli_ + div_ + mul; PyTorch's is_fused_kernel_acceptable "
               "(aten/src/ATen/native/Dropout.cpp) accepts PrivateUse1 tensors, so the neuron device gets native_dropout.",
    },
    "torch.nn.functional.scaled_dot_product_attention (4-D, dropout_p > 0)": {
        "replaced_by": "aten::_scaled_dot_product_fused_attention_overrideable",
        "why": "On CPU dropout forces the math path (bernoulli_); the PrivateUse1 _fused_sdp_choice stub picks the "
               "overrideable fused kernel, which applies dropout itself.",
    },
}

# Never call these (global state, I/O, process control, or meaningless here).
SKIP = {
    "set_default_dtype", "set_default_device", "set_default_tensor_type", "set_printoptions", "set_num_threads",
    "set_num_interop_threads", "set_grad_enabled", "set_anomaly_enabled", "set_autocast_enabled", "set_rng_state",
    "set_flush_denormal", "set_deterministic_debug_mode", "set_float32_matmul_precision", "set_warn_always",
    "use_deterministic_algorithms", "manual_seed", "seed", "initial_seed", "get_rng_state", "save", "load",
    "compile", "export", "jit", "vmap", "cond", "while_loop", "from_file", "from_numpy", "frombuffer", "asarray",
    "autocast", "no_grad", "enable_grad", "inference_mode", "typename", "compiled_with_cxx11_abi",
    "register_tensor", "empty_strided", "Generator", "Size", "dtype", "device", "Stream", "Event", "storage",
    "backward", "register_hook", "register_post_accumulate_grad_hook", "numpy", "tolist", "cuda", "cpu", "to",
    "pin_memory", "share_memory_", "record_stream", "apply_", "map_", "map2_", "untyped_storage", "data_ptr",
    "is_pinned", "is_shared", "_make_subclass", "retain_grad", "requires_grad_", "type", "type_as", "xpu", "mtia",
    "ipu", "hpu", "mps", "neuron", "dim_order", "module_load", "untyped_storage", "resize_", "resize_as_",
    "set_", "storage_offset", "element_size", "nbytes", "itemsize", "new", "__reduce_ex__", "detach_",
    "align_to", "align_as", "refine_names", "rename", "rename_", "unflatten", "dequantize", "q_scale",
    "int_repr", "to_mkldnn", "to_dense", "to_padded_tensor", "sparse_mask", "is_coalesced", "coalesce",
    "pinverse", "_stft", "lobpcg", "lu", "unique_consecutive",
}

SKIP_PREFIXES = ("_", "set_", "is_", "get_", "q_", "quantize", "fbgemm", "mkldnn", "miopen", "cudnn",
                 "native_", "sparse", "to_sparse", "indices", "values", "crow_", "col_", "ccol_", "row_",
                 "nested", "fake_quant", "batch_norm_", "sym_", "can_cast", "promote_types", "result_type",
                 "cat_out", "use_", "are_", "autocast", "empty_permuted", "saddmm", "spmm", "smm", "hspmm",
                 "segment_reduce", "fused_moving", "choose_qparams")


_PAUSED = [False]


def R(*shape):
    """An input tensor built inside a recorded call: its creation (aten::rand) is not recorded as the API's op."""
    _PAUSED[0] = True
    try:
        return torch.rand(*shape)
    finally:
        _PAUSED[0] = False


class Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if _PAUSED[0]:
            return func(*args, **(kwargs or {}))
        name = func.name()  # "aten::add.Tensor"; the default overload is "aten::atan2"
        if name.endswith(".default"):
            name = name[: -len(".default")]
        self.ops.append(name)
        return func(*args, **(kwargs or {}))


def record(fn, *args, **kwargs) -> list[str] | None:
    rec = Recorder()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), DeviceSubstitutes(), rec:
            warnings.simplefilter("ignore")
            fn(*args, **kwargs)
    except Exception:
        return None
    seen: list[str] = []
    for op in rec.ops:
        op = DEVICE_SUBSTITUTIONS.get(op, (op,))[0]
        if op not in seen:
            seen.append(op)
    return seen


def inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3, 4, generator=g) + 0.5
    y = torch.rand(3, 4, generator=g) + 0.5
    v = torch.rand(4, generator=g) + 0.5
    a = torch.rand(4, 4, generator=g)
    sq = a @ a.T + 4 * torch.eye(4)  # SPD, well conditioned
    xi = torch.randint(0, 3, (3, 4), generator=g)
    b = torch.rand(3, 4, generator=g) > 0.5
    c = torch.randn(8, generator=g, dtype=torch.cfloat)
    s = torch.tensor(1.5)
    return dict(x=x, y=y, v=v, sq=sq, xi=xi, b=b, c=c, s=s)


def patterns(t):
    x, y, v, sq, xi, b = t["x"], t["y"], t["v"], t["sq"], t["xi"], t["b"]
    # (args, kwargs); inputs are cloned per attempt so in-place calls do not leak
    return [
        ((x,), {}),
        ((x, y), {}),
        ((x, 1), {}),
        ((x,), {"dim": 1}),
        ((sq,), {}),
        ((sq, sq), {}),
        ((v,), {}),
        ((v, v), {}),
        (([x, y],), {}),
        (([x, y], 1), {}),
        ((x, y, y), {}),
        ((x, 0.5), {}),
        ((xi,), {}),
        ((xi, xi), {}),
        ((b,), {}),
        ((b, b), {}),
        ((3, 4), {}),
        (((3, 4),), {}),
        ((4,), {}),
        ((x, 1, 2), {}),
        ((x, 0, 1), {}),
        ((x, [1]), {}),
        ((x, 2, 1), {}),
        ((x, (4, 3)), {}),
        ((x, xi % 4), {}),
        ((x, 1, xi % 4), {}),
        ((x, 1, xi % 4, y), {}),
        ((x, b, 0.0), {}),
        ((b, x, y), {}),
        ((sq, v), {}),
        ((v, sq), {}),
        ((t["c"],), {}),
        ((t["s"],), {}),
    ]


def _clone(a):
    if isinstance(a, torch.Tensor):
        return a.clone()
    if isinstance(a, list):
        return [_clone(i) for i in a]
    return a


def try_patterns(fn, t, method: str | None = None) -> list[str] | None:
    for args, kwargs in patterns(t):
        args = [_clone(a) for a in args]
        if method is not None:
            if not args or not isinstance(args[0], torch.Tensor):
                continue
            self_, rest = args[0], args[1:]
            bound = getattr(self_, method, None)
            if bound is None:
                return None
            ops = record(bound, *rest, **kwargs)
        else:
            ops = record(fn, *args, **kwargs)
        if ops:
            return ops
    return None


def curated(t):
    """Shape-specific calls: name -> zero-arg callable."""
    img = torch.rand(2, 3, 8, 8)
    seq = torch.rand(2, 5, 8)
    q = torch.rand(2, 2, 5, 16)
    logits = torch.rand(4, 5)
    target = torch.tensor([0, 1, 2, 3])
    prob = torch.rand(4, 5)
    sig = torch.rand(2, 3, 16)
    vol = torch.rand(1, 2, 4, 4, 4)
    idx = torch.tensor([[0, 1], [2, 3]])
    c = {
        "F.conv1d": lambda: F.conv1d(sig, R(4, 3, 3)),
        "F.conv2d": lambda: F.conv2d(img, R(4, 3, 3, 3), padding=1),
        "F.conv3d": lambda: F.conv3d(vol, R(3, 2, 3, 3, 3)),
        "F.conv_transpose1d": lambda: F.conv_transpose1d(sig, R(3, 4, 3)),
        "F.conv_transpose2d": lambda: F.conv_transpose2d(img, R(3, 4, 3, 3)),
        "F.conv_transpose3d": lambda: F.conv_transpose3d(vol, R(2, 3, 3, 3, 3)),
        "F.max_pool1d": lambda: F.max_pool1d(sig, 2),
        "F.max_pool2d": lambda: F.max_pool2d(img, 2),
        "F.max_pool3d": lambda: F.max_pool3d(vol, 2),
        "F.avg_pool1d": lambda: F.avg_pool1d(sig, 2),
        "F.avg_pool2d": lambda: F.avg_pool2d(img, 2),
        "F.avg_pool3d": lambda: F.avg_pool3d(vol, 2),
        "F.adaptive_avg_pool1d": lambda: F.adaptive_avg_pool1d(sig, 4),
        "F.adaptive_avg_pool2d": lambda: F.adaptive_avg_pool2d(img, (3, 3)),
        "F.adaptive_avg_pool3d": lambda: F.adaptive_avg_pool3d(vol, 2),
        "F.adaptive_max_pool1d": lambda: F.adaptive_max_pool1d(sig, 4),
        "F.adaptive_max_pool2d": lambda: F.adaptive_max_pool2d(img, (3, 3)),
        "F.lp_pool2d": lambda: F.lp_pool2d(img, 2, 2),
        "F.interpolate": lambda: F.interpolate(img, scale_factor=2, mode="nearest"),
        "F.interpolate:bilinear": lambda: F.interpolate(img, scale_factor=2, mode="bilinear"),
        "F.interpolate:bicubic": lambda: F.interpolate(img, scale_factor=2, mode="bicubic"),
        "F.interpolate:nearest-exact": lambda: F.interpolate(img, scale_factor=2, mode="nearest-exact"),
        "F.upsample": lambda: F.upsample(img, scale_factor=2),
        "F.grid_sample": lambda: F.grid_sample(img, R(2, 4, 4, 2) * 2 - 1, align_corners=False),
        "F.affine_grid": lambda: F.affine_grid(R(2, 2, 3), [2, 3, 8, 8], align_corners=False),
        "F.pixel_shuffle": lambda: F.pixel_shuffle(R(1, 4, 3, 3), 2),
        "F.pixel_unshuffle": lambda: F.pixel_unshuffle(R(1, 1, 4, 4), 2),
        "F.unfold": lambda: F.unfold(img, 2),
        "F.fold": lambda: F.fold(R(1, 12, 16), (5, 5), 2),
        "F.embedding": lambda: F.embedding(idx, R(5, 3)),
        "F.embedding_bag": lambda: F.embedding_bag(idx, R(5, 3)),
        "F.one_hot": lambda: F.one_hot(target, 5),
        "F.linear": lambda: F.linear(seq, R(4, 8), R(4)),
        "F.bilinear": lambda: F.bilinear(logits, logits, R(3, 5, 5)),
        "F.layer_norm": lambda: F.layer_norm(seq, (8,)),
        "F.rms_norm": lambda: F.rms_norm(seq, (8,)),
        "F.group_norm": lambda: F.group_norm(img, 3),
        "F.instance_norm": lambda: F.instance_norm(img),
        "F.batch_norm": lambda: F.batch_norm(img, torch.zeros(3), torch.ones(3), training=True),
        "F.local_response_norm": lambda: F.local_response_norm(img, 2),
        "F.normalize": lambda: F.normalize(logits),
        "F.dropout": lambda: F.dropout(logits, 0.5, training=True),
        "F.dropout1d": lambda: F.dropout1d(sig, 0.5, training=True),
        "F.dropout2d": lambda: F.dropout2d(img, 0.5, training=True),
        "F.dropout3d": lambda: F.dropout3d(vol, 0.5, training=True),
        "F.alpha_dropout": lambda: F.alpha_dropout(logits, 0.5, training=True),
        "F.feature_alpha_dropout": lambda: F.feature_alpha_dropout(img, 0.5, training=True),
        "F.cross_entropy": lambda: F.cross_entropy(logits, target),
        "F.cross_entropy:label_smoothing": lambda: F.cross_entropy(logits, target, label_smoothing=0.1),
        "F.nll_loss": lambda: F.nll_loss(F.log_softmax(logits, 1), target),
        "F.mse_loss": lambda: F.mse_loss(logits, prob),
        "F.l1_loss": lambda: F.l1_loss(logits, prob),
        "F.smooth_l1_loss": lambda: F.smooth_l1_loss(logits, prob),
        "F.huber_loss": lambda: F.huber_loss(logits, prob),
        "F.binary_cross_entropy": lambda: F.binary_cross_entropy(prob, prob.round()),
        "F.binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits(logits, prob),
        "F.kl_div": lambda: F.kl_div(F.log_softmax(logits, 1), prob, reduction="batchmean"),
        "F.poisson_nll_loss": lambda: F.poisson_nll_loss(logits, prob),
        "F.gaussian_nll_loss": lambda: F.gaussian_nll_loss(logits, prob, torch.ones(4, 5)),
        "F.cosine_embedding_loss": lambda: F.cosine_embedding_loss(logits, prob, torch.ones(4)),
        "F.margin_ranking_loss": lambda: F.margin_ranking_loss(logits[:, 0], prob[:, 0], torch.ones(4)),
        "F.hinge_embedding_loss": lambda: F.hinge_embedding_loss(logits, torch.ones(4, 5)),
        "F.multi_margin_loss": lambda: F.multi_margin_loss(logits, target),
        "F.multilabel_margin_loss": lambda: F.multilabel_margin_loss(logits, torch.zeros(4, 5, dtype=torch.long)),
        "F.multilabel_soft_margin_loss": lambda: F.multilabel_soft_margin_loss(logits, prob.round()),
        "F.soft_margin_loss": lambda: F.soft_margin_loss(logits, torch.ones(4, 5)),
        "F.triplet_margin_loss": lambda: F.triplet_margin_loss(logits, prob, prob),
        "F.ctc_loss": lambda: F.ctc_loss(R(6, 2, 4).log_softmax(2), torch.tensor([[1, 2], [1, 3]]),
                                         torch.tensor([6, 6]), torch.tensor([2, 2])),
        "F.cosine_similarity": lambda: F.cosine_similarity(logits, prob),
        "F.pairwise_distance": lambda: F.pairwise_distance(logits, prob),
        "F.pdist": lambda: F.pdist(logits),
        "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, q, q),
        "F.scaled_dot_product_attention:is_causal": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
        "F.multi_head_attention_forward": (lambda m: lambda: m(seq, seq, seq))(nn.MultiheadAttention(8, 2, batch_first=True)),
        "F.gumbel_softmax": lambda: F.gumbel_softmax(logits),
        "F.glu": lambda: F.glu(logits[:, :4]),
        "F.pad": lambda: F.pad(img, (1, 1, 1, 1)),
        "F.pad:reflect": lambda: F.pad(img, (1, 1, 1, 1), mode="reflect"),
        "F.pad:replicate": lambda: F.pad(img, (1, 1, 1, 1), mode="replicate"),
        "F.pad:circular": lambda: F.pad(img, (1, 1, 1, 1), mode="circular"),
        "torch.stft": lambda: torch.stft(R(64), 16, return_complex=True, window=torch.hann_window(16)),
        "torch.istft": lambda: torch.istft(torch.stft(R(64), 16, return_complex=True, window=torch.hann_window(16)),
                                           16, window=torch.hann_window(16)),
        "torch.einsum": lambda: torch.einsum("ij,jk->ik", t["x"], t["sq"]),
        "torch.matmul": lambda: torch.matmul(seq, R(8, 3)),
        "torch.bmm": lambda: torch.bmm(seq, R(2, 8, 3)),
        "torch.baddbmm": lambda: torch.baddbmm(R(2, 5, 3), seq, R(2, 8, 3)),
        "torch.addbmm": lambda: torch.addbmm(R(5, 3), seq, R(2, 8, 3)),
        "torch.addmm": lambda: torch.addmm(R(3, 3), t["x"], R(4, 3)),
        "torch.addmv": lambda: torch.addmv(R(3), t["x"], t["v"]),
        "torch.addr": lambda: torch.addr(t["sq"], t["v"], t["v"]),
        "torch.chain_matmul": lambda: torch.chain_matmul(t["sq"], t["sq"], t["sq"]),
        "torch.tensordot": lambda: torch.tensordot(t["x"], t["sq"], dims=1),
        "torch.cdist": lambda: torch.cdist(t["x"], t["y"]),
        "torch.gather": lambda: torch.gather(t["x"], 1, t["xi"]),
        "torch.scatter": lambda: torch.scatter(t["x"], 1, t["xi"], t["y"]),
        "torch.scatter_add": lambda: torch.scatter_add(t["x"], 1, t["xi"], t["y"]),
        "torch.scatter_reduce": lambda: torch.scatter_reduce(t["x"], 1, t["xi"], t["y"], "amax"),
        "torch.index_select": lambda: torch.index_select(t["x"], 1, torch.tensor([0, 2])),
        "torch.index_add": lambda: torch.index_add(t["x"], 1, torch.tensor([0, 2]), t["x"][:, :2]),
        "torch.index_copy": lambda: torch.index_copy(t["x"], 1, torch.tensor([0, 2]), t["x"][:, :2]),
        "torch.index_fill": lambda: torch.index_fill(t["x"], 1, torch.tensor([0, 2]), 0.0),
        "torch.index_put": lambda: torch.index_put(t["x"], (torch.tensor([0, 1]),), torch.tensor(1.0)),
        "torch.masked_select": lambda: torch.masked_select(t["x"], t["b"]),
        "torch.masked_fill": lambda: torch.masked_fill(t["x"], t["b"], 0.0),
        "torch.masked_scatter": lambda: torch.masked_scatter(t["x"], t["b"], t["y"]),
        "torch.take_along_dim": lambda: torch.take_along_dim(t["x"], t["xi"], 1),
        "torch.topk": lambda: torch.topk(t["x"], 2),
        "torch.kthvalue": lambda: torch.kthvalue(t["x"], 2),
        "torch.multinomial": lambda: torch.multinomial(R(4), 2),
        "torch.bernoulli": lambda: torch.bernoulli(R(4)),
        "torch.normal": lambda: torch.normal(torch.zeros(4), torch.ones(4)),
        "torch.poisson": lambda: torch.poisson(R(4)),
        "torch.rand": lambda: torch.rand(3, 4),
        "torch.randn": lambda: torch.randn(3, 4),
        "torch.randint": lambda: torch.randint(0, 5, (3, 4)),
        "torch.randperm": lambda: torch.randperm(5),
        "torch.rand_like": lambda: torch.rand_like(t["x"]),
        "torch.randn_like": lambda: torch.randn_like(t["x"]),
        "torch.randint_like": lambda: torch.randint_like(t["x"], 5),
        "torch.full": lambda: torch.full((3, 4), 2.0),
        "torch.full_like": lambda: torch.full_like(t["x"], 2.0),
        "torch.arange": lambda: torch.arange(10),
        "torch.linspace": lambda: torch.linspace(0, 1, 5),
        "torch.logspace": lambda: torch.logspace(0, 1, 5),
        "torch.eye": lambda: torch.eye(4),
        "torch.tensor": lambda: torch.tensor([1.0, 2.0]),
        "torch.as_tensor": lambda: torch.as_tensor([1.0, 2.0]),
        "torch.where": lambda: torch.where(t["b"], t["x"], t["y"]),
        "torch.where:condition_only": lambda: torch.where(t["b"]),
        "torch.clamp": lambda: torch.clamp(t["x"], 0.6, 0.9),
        "torch.lerp": lambda: torch.lerp(t["x"], t["y"], 0.5),
        "torch.addcmul": lambda: torch.addcmul(t["x"], t["x"], t["y"]),
        "torch.addcdiv": lambda: torch.addcdiv(t["x"], t["x"], t["y"]),
        "torch.histc": lambda: torch.histc(t["x"]),
        "torch.bincount": lambda: torch.bincount(torch.tensor([0, 1, 1, 3])),
        "torch.bucketize": lambda: torch.bucketize(t["x"], torch.tensor([0.6, 0.9])),
        "torch.searchsorted": lambda: torch.searchsorted(torch.tensor([0.6, 0.9]), t["x"]),
        "torch.unique": lambda: torch.unique(t["xi"]),
        "torch.unique_consecutive": lambda: torch.unique_consecutive(t["xi"]),
        "torch.cumsum": lambda: torch.cumsum(t["x"], 1),
        "torch.cumprod": lambda: torch.cumprod(t["x"], 1),
        "torch.cummax": lambda: torch.cummax(t["x"], 1),
        "torch.cummin": lambda: torch.cummin(t["x"], 1),
        "torch.logcumsumexp": lambda: torch.logcumsumexp(t["x"], 1),
        "torch.softmax": lambda: torch.softmax(t["x"], 1),
        "torch.log_softmax": lambda: torch.log_softmax(t["x"], 1),
        "torch.nn.init.normal_": lambda: nn.init.normal_(t["x"].clone()),
        "torch.nn.init.uniform_": lambda: nn.init.uniform_(t["x"].clone()),
        "torch.nn.init.xavier_uniform_": lambda: nn.init.xavier_uniform_(t["x"].clone()),
        "torch.nn.init.kaiming_normal_": lambda: nn.init.kaiming_normal_(t["x"].clone()),
        "torch.nn.init.trunc_normal_": lambda: nn.init.trunc_normal_(t["x"].clone()),
        "torch.nn.init.zeros_": lambda: nn.init.zeros_(t["x"].clone()),
        "torch.nn.init.ones_": lambda: nn.init.ones_(t["x"].clone()),
        "torch.nn.init.orthogonal_": lambda: nn.init.orthogonal_(t["x"].clone()),
        "torch.nn.utils.clip_grad_norm_": lambda: _clip(),
    }
    return c


def _clip():
    p = nn.Parameter(R(3, 4))
    p.grad = R(3, 4)
    nn.utils.clip_grad_norm_([p], 1.0)


def modules():
    """name -> (module factory, input factory)."""
    img = lambda: torch.rand(2, 3, 8, 8)  # noqa: E731
    seq = lambda: torch.rand(2, 5, 8)  # noqa: E731
    sig = lambda: torch.rand(2, 3, 16)  # noqa: E731
    flat = lambda: torch.rand(4, 8)  # noqa: E731
    return {
        "Linear": (lambda: nn.Linear(8, 4), flat),
        "Bilinear": (lambda: nn.Bilinear(8, 8, 4), None),
        "Conv1d": (lambda: nn.Conv1d(3, 4, 3), sig),
        "Conv2d": (lambda: nn.Conv2d(3, 4, 3, padding=1), img),
        "Conv3d": (lambda: nn.Conv3d(2, 3, 3), lambda: torch.rand(1, 2, 4, 4, 4)),
        "ConvTranspose1d": (lambda: nn.ConvTranspose1d(3, 4, 3), sig),
        "ConvTranspose2d": (lambda: nn.ConvTranspose2d(3, 4, 3), img),
        "BatchNorm1d": (lambda: nn.BatchNorm1d(8), flat),
        "BatchNorm2d": (lambda: nn.BatchNorm2d(3), img),
        "SyncBatchNorm": (lambda: nn.SyncBatchNorm(3), None),
        "LayerNorm": (lambda: nn.LayerNorm(8), seq),
        "RMSNorm": (lambda: nn.RMSNorm(8), seq),
        "GroupNorm": (lambda: nn.GroupNorm(3, 3), img),
        "InstanceNorm2d": (lambda: nn.InstanceNorm2d(3), img),
        "LocalResponseNorm": (lambda: nn.LocalResponseNorm(2), img),
        "Embedding": (lambda: nn.Embedding(10, 4), lambda: torch.tensor([[1, 2], [3, 4]])),
        "EmbeddingBag": (lambda: nn.EmbeddingBag(10, 4), lambda: torch.tensor([[1, 2], [3, 4]])),
        "LSTM": (lambda: nn.LSTM(8, 6, batch_first=True), seq),
        "GRU": (lambda: nn.GRU(8, 6, batch_first=True), seq),
        "RNN": (lambda: nn.RNN(8, 6, batch_first=True), seq),
        "LSTMCell": (lambda: nn.LSTMCell(8, 6), flat),
        "GRUCell": (lambda: nn.GRUCell(8, 6), flat),
        "RNNCell": (lambda: nn.RNNCell(8, 6), flat),
        "MultiheadAttention": (lambda: nn.MultiheadAttention(8, 2, batch_first=True), None),
        "TransformerEncoderLayer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.0), seq),
        "TransformerDecoderLayer": (lambda: nn.TransformerDecoderLayer(8, 2, 16, batch_first=True, dropout=0.0), None),
        "Transformer": (lambda: nn.Transformer(8, 2, 1, 1, 16, batch_first=True, dropout=0.0), None),
        "Dropout": (lambda: nn.Dropout(0.5), flat),
        "Dropout2d": (lambda: nn.Dropout2d(0.5), img),
        "MaxPool1d": (lambda: nn.MaxPool1d(2), sig),
        "MaxPool2d": (lambda: nn.MaxPool2d(2), img),
        "AvgPool1d": (lambda: nn.AvgPool1d(2), sig),
        "AvgPool2d": (lambda: nn.AvgPool2d(2), img),
        "AdaptiveAvgPool1d": (lambda: nn.AdaptiveAvgPool1d(4), sig),
        "AdaptiveAvgPool2d": (lambda: nn.AdaptiveAvgPool2d(1), img),
        "AdaptiveMaxPool2d": (lambda: nn.AdaptiveMaxPool2d(1), img),
        "Upsample": (lambda: nn.Upsample(scale_factor=2), img),
        "UpsamplingBilinear2d": (lambda: nn.UpsamplingBilinear2d(scale_factor=2), img),
        "UpsamplingNearest2d": (lambda: nn.UpsamplingNearest2d(scale_factor=2), img),
        "PixelShuffle": (lambda: nn.PixelShuffle(2), lambda: torch.rand(1, 4, 3, 3)),
        "Flatten": (lambda: nn.Flatten(), img),
        "Unflatten": (lambda: nn.Unflatten(1, (2, 4)), flat),
        "Identity": (lambda: nn.Identity(), flat),
        "ZeroPad2d": (lambda: nn.ZeroPad2d(1), img),
        "ReflectionPad2d": (lambda: nn.ReflectionPad2d(1), img),
        "ReplicationPad2d": (lambda: nn.ReplicationPad2d(1), img),
        "ConstantPad2d": (lambda: nn.ConstantPad2d(1, 0.5), img),
        "CosineSimilarity": (lambda: nn.CosineSimilarity(), None),
        "CrossEntropyLoss": (lambda: nn.CrossEntropyLoss(), None),
        "NLLLoss": (lambda: nn.NLLLoss(), None),
        "MSELoss": (lambda: nn.MSELoss(), None),
        "L1Loss": (lambda: nn.L1Loss(), None),
        "SmoothL1Loss": (lambda: nn.SmoothL1Loss(), None),
        "HuberLoss": (lambda: nn.HuberLoss(), None),
        "BCELoss": (lambda: nn.BCELoss(), None),
        "BCEWithLogitsLoss": (lambda: nn.BCEWithLogitsLoss(), None),
        "KLDivLoss": (lambda: nn.KLDivLoss(reduction="batchmean"), None),
        # activations
        **{name: (getattr(nn, name), flat) for name in (
            "ReLU", "ReLU6", "LeakyReLU", "PReLU", "RReLU", "ELU", "SELU", "CELU", "GELU", "SiLU", "Mish", "Sigmoid",
            "Tanh", "Hardtanh", "Hardsigmoid", "Hardswish", "Hardshrink", "Softshrink", "Tanhshrink", "Softplus",
            "Softsign", "LogSigmoid", "Threshold", "Softmax", "LogSoftmax", "Softmin", "GLU",
        ) if hasattr(nn, name)},
    }


def module_call(name, make, inp):
    torch.manual_seed(0)
    kwargs = {}
    if name == "Threshold":
        m = nn.Threshold(0.5, 0.0)
    elif name in ("Softmax", "LogSoftmax", "Softmin"):
        m = getattr(nn, name)(dim=1)
    else:
        m = make()
    m.train()
    if inp is not None:
        x = inp()
        return lambda: m(x)
    seq = torch.rand(2, 5, 8)
    logits, target, prob = torch.rand(4, 5), torch.tensor([0, 1, 2, 3]), torch.rand(4, 5)
    special = {
        "Bilinear": lambda: m(R(4, 8), R(4, 8)),
        "MultiheadAttention": lambda: m(seq, seq, seq),
        "TransformerDecoderLayer": lambda: m(seq, seq),
        "Transformer": lambda: m(seq, seq),
        "CosineSimilarity": lambda: m(logits, prob),
        "CrossEntropyLoss": lambda: m(logits, target),
        "NLLLoss": lambda: m(logits.log_softmax(1), target),
        "BCELoss": lambda: m(prob, prob.round()),
        "KLDivLoss": lambda: m(logits.log_softmax(1), prob),
        "SyncBatchNorm": None,
    }
    fn = special.get(name, lambda: m(logits, prob))
    return fn


def public_functions(mod, names=None):
    out = []
    for n in sorted(names if names is not None else dir(mod)):
        if n in SKIP or n.startswith(SKIP_PREFIXES):
            continue
        obj = getattr(mod, n, None)
        if obj is None or isinstance(obj, type) or not callable(obj):
            continue
        out.append((n, obj))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "compat_table" / "api_to_aten.yaml")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    # oneDNN (mkldnn) kernels are CPU-only choices (e.g. LSTM -> mkldnn_rnn_layer); turn them off so composite
    # modules decompose the way they do on a non-CPU backend.
    torch.backends.mkldnn.enabled = False
    t = inputs()
    apis: dict[str, list[str]] = {}
    failed: list[str] = []

    def add(key, ops):
        if ops:
            apis[key] = ops
        else:
            failed.append(key)

    # torch.* functions (also aliased as Tensor methods below)
    for n, fn in public_functions(torch):
        if n in ("Tensor",):
            continue
        add(f"torch.{n}", try_patterns(fn, t))
    for modname, mod in (("torch.linalg", torch.linalg), ("torch.fft", torch.fft), ("torch.special", torch.special)):
        for n, fn in public_functions(mod):
            add(f"{modname}.{n}", try_patterns(fn, t))
    for n, fn in public_functions(F):
        if n in ("Tensor", "Callable", "Optional", "List", "Tuple", "Union", "handle_torch_function",
                 "has_torch_function", "has_torch_function_unary", "has_torch_function_variadic", "boolean_dispatch",
                 "assert_int_or_pair", "multi_head_attention_forward", "channel_shuffle", "native_channel_shuffle"):
            continue
        add(f"torch.nn.functional.{n}", try_patterns(fn, t))
    # Tensor methods
    for n in sorted(dir(torch.Tensor)):
        if n in SKIP or n.startswith(SKIP_PREFIXES) and not n.startswith("__"):
            continue
        if n.startswith("__") and n not in (
            "__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__matmul__",
            "__neg__", "__abs__", "__and__", "__or__", "__xor__", "__invert__", "__lshift__", "__rshift__",
            "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__getitem__", "__setitem__",
            "__radd__", "__rsub__", "__rmul__", "__rtruediv__", "__rpow__", "__rmatmul__", "__iadd__", "__imul__",
        ):
            continue
        attr = getattr(torch.Tensor, n, None)
        if attr is None or isinstance(attr, property) or not callable(attr):
            continue
        add(f"Tensor.{n}", try_patterns(None, t, method=n))
    # curated shape-specific calls override generic ones
    for key, fn in curated(t).items():
        k = key.replace("F.", "torch.nn.functional.", 1) if key.startswith("F.") else key
        ops = record(fn)
        if ops:
            apis[k] = ops
            if k in failed:
                failed.remove(k)
        else:
            failed.append(k)
    for name, (make, inp) in modules().items():
        fn = module_call(name, make, inp)
        if fn is None:
            continue
        ops = record(fn)
        add(f"torch.nn.{name}", ops)

    failed = sorted(set(failed) - set(apis))
    import yaml

    header = (
        "# Python API -> aten ops (forward, CPU inputs) it dispatches to.\n"
        f"# GENERATED by: python scripts/gen_api_map.py  (torch {torch.__version__}, python "
        f"{sys.version_info.major}.{sys.version_info.minor})\n"
        "# Do not edit by hand: rerun the script. Keys: torch.* / torch.linalg.* / torch.fft.* / torch.special.* /\n"
        "# torch.nn.functional.* functions, Tensor.<method>, torch.nn.<Module> (forward). A ':suffix' key records a\n"
        "# variant call (e.g. torch.nn.functional.interpolate:bilinear). Overloads are recorded; '.default' dropped.\n"
        "# oneDNN disabled while recording; device_substitutions below rewrite CPU-only kernel choices.\n"
    )
    doc = {
        "torch": str(torch.__version__),
        "command": "python scripts/gen_api_map.py",
        "device_substitutions": {**{k: {"replaced_by": v[0], "why": v[1]} for k, v in DEVICE_SUBSTITUTIONS.items()},
                                 **API_SUBSTITUTIONS},
        "count": len(apis),
        "apis": dict(sorted(apis.items())),
    }
    args.out.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120), encoding="utf-8")
    print(f"wrote {len(apis)} APIs to {args.out} ({len(failed)} names could not be called)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
