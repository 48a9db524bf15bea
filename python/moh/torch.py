"""`MoHAttention`: the official MoH attention module (SkyworkAI/MoH, MoH-DiT/models.py, the
timm-style module of MoH-DiT; docs/spec.md sections 1-2) computed by moh's kernels.

Same constructor arguments, same parameters (`qkv`, `proj`, `wg`, `wg_0`, `wg_1`: an official
state_dict loads unchanged), same forward: y [B, N, C] from x [B, N, C], and in training mode the
load-balance term l_aux = E^2 mean_i(P_i f_i) appended to `MoHAttention.LOAD_BALANCING_LOSSES`, as
the official module does (differentiable: it reaches wg through P).

Where it runs (a `torch.autograd.Function` over libmoh.so, no copies of activations):
  - CPU tensors: the head-sparse CPU kernels (include/moh.h moh_attn_layer_*) on float32 buffers:
    float32 tensors in float32; bfloat16 tensors, and float32 ones under
    torch.autocast("cpu", dtype=torch.bfloat16), with bf16 GEMMs and attention tiles (AMX-BF16 or
    AVX512-BF16 where the CPU has them) accumulating in float32, output bfloat16 (x converted to
    float32 at the boundary).
  - CUDA tensors: the CUDA kernels (include/moh_cuda.h) on torch's current stream, bfloat16
    operands with float32 accumulation: bfloat16 inputs, or float32 inputs under
    torch.autocast(device_type="cuda", dtype=torch.bfloat16).
Anything else is refused with a ValueError naming the reason: qk_norm=True, attn_drop > 0 while
training, other dtypes or devices, x not [B, N, dim].

Routing the official module cannot express it computes as the published MoH-ViT module does:
shared_head == 1 with routed heads gives the shared head gate 2 softmax(wg_0)[0] (MoH-DiT's module
would call the missing wg_1); shared_head == routed_head == 0 is dense multi-head attention.
"""
import ctypes
import threading

import torch
import torch.nn as nn

from . import _lib as L

_NAMES = ("qkv.weight", "qkv.bias", "proj.weight", "proj.bias", "wg.weight", "wg_0.weight", "wg_1.weight")
_INT_MAX = 2 ** 31 - 1


def _check_args(dim, num_heads, head_dim, shared_head, routed_head, attn_drop):
    """The official constructor's arguments, checked by their names (ValueError, one line)."""
    for name, v in (("dim", dim), ("num_heads", num_heads), ("shared_head", shared_head),
                    ("routed_head", routed_head)) + ((("head_dim", head_dim),) if head_dim is not None else ()):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"moh MoHAttention: {name}={v!r}, expected an int")
        if not 0 <= v <= _INT_MAX:
            raise ValueError(f"moh MoHAttention: {name}={v}, expected 0..{_INT_MAX}")
    if dim < 1 or num_heads < 1:
        raise ValueError(f"moh MoHAttention: dim={dim} num_heads={num_heads}, both must be >= 1")
    if head_dim is None and dim < num_heads:
        raise ValueError(f"moh MoHAttention: head_dim = dim // num_heads = 0 (dim={dim}, num_heads={num_heads}); "
                         "give head_dim or more dim")
    if head_dim is not None and head_dim < 1:
        raise ValueError(f"moh MoHAttention: head_dim={head_dim}, expected >= 1")
    if shared_head > num_heads:
        raise ValueError(f"moh MoHAttention: shared_head={shared_head}, expected 0..num_heads={num_heads}")
    if routed_head > num_heads - shared_head:
        raise ValueError(f"moh MoHAttention: routed_head={routed_head} (the top-k of the routed heads), expected "
                         f"0..num_heads - shared_head = {num_heads - shared_head}")
    if routed_head == 0 and 0 < shared_head < num_heads:
        raise ValueError(f"moh MoHAttention: routed_head=0 with shared_head={shared_head}: without routing every "
                         f"head is shared, expected shared_head = num_heads = {num_heads} (or 0: dense attention)")
    if not 0.0 <= float(attn_drop) <= 1.0:
        raise ValueError(f"moh MoHAttention: attn_drop={attn_drop}, expected a probability in [0, 1]")


def _config(dim, num_heads, head_dim, shared_head, routed_head, qkv_bias):
    lib = L.lib()
    c = L.AttnConfig()
    lib.moh_attn_config_default(ctypes.byref(c))
    c.hidden_size, c.n_heads, c.n_kv_heads, c.head_dim = dim, num_heads, num_heads, head_dim
    if routed_head > 0 or shared_head > 0:
        c.router, c.shared_heads, c.top_k = L.MOH_ROUTER_LEARNED, shared_head, routed_head
    else:
        c.router = L.MOH_ROUTER_NONE
    c.qkv_bias, c.proj_bias, c.fused_qkv = bool(qkv_bias), True, True
    err = L.Error()
    L.check(lib.moh_attn_config_validate(ctypes.byref(c), b"MoHAttention", ctypes.byref(err)), err)
    return c


class _Handle:
    """One C layer (CPU or CUDA) with room for max_B x max_N tokens; freed with the object."""

    def __init__(self, cfg, B, N, cuda):
        lib = L.lib()
        self.cuda, self.B, self.N = cuda, B, N
        self.ptr = ctypes.c_void_p()
        err = L.Error()
        new = lib.moh_cuda_layer_new if cuda else lib.moh_attn_layer_new
        L.check(new(ctypes.byref(self.ptr), ctypes.byref(cfg), B, N, ctypes.byref(err)), err)
        self._free = lib.moh_cuda_layer_free if cuda else lib.moh_attn_layer_free
        self.bf16 = cuda  # the CUDA kernels are bf16; the CPU layer starts in float32

    def set_bf16(self, on):
        """CPU: float32 or bf16 compute (moh_attn_layer_set_bf16) from the next forward."""
        if self.cuda or on == self.bf16:
            return
        err = L.Error()
        L.check(L.lib().moh_attn_layer_set_bf16(self.ptr, on, ctypes.byref(err)), err)
        self.bf16 = on

    def __del__(self):
        ptr = getattr(self, "ptr", None)
        if ptr:
            self._free(ptr)
            self.ptr = None


class _Pool:
    """The C layers of one module: a forward takes one with room for its batch, its backward gives
    it back, so that forwards waiting for their backward (activation checkpointing, a module used
    twice) each keep their own. Not copied with the module (deepcopy, pickle): a copy starts empty."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.free = []
        self.lock = threading.Lock()  # threads sharing a module take different handles

    def take(self, B, N, cuda, bf16):
        with self.lock:
            h = next((h for h in self.free if h.cuda == cuda and h.B >= B and h.N >= N), None)
            if h is not None:
                self.free.remove(h)
        if h is None:
            h = _Handle(self.cfg, B, N, cuda)
        h.set_bf16(bf16)
        return h

    def give(self, h):
        with self.lock:
            self.free.append(h)
            del self.free[:-4]  # the most recent few

    def __deepcopy__(self, memo):
        return _Pool(self.cfg)

    def __getstate__(self):
        return {"cfg": bytes(self.cfg)}

    def __setstate__(self, state):
        self.__init__(L.AttnConfig.from_buffer_copy(state["cfg"]))


def _autocast_dtype(device_type):
    """The dtype torch.autocast(device_type) casts to, or None when it is off."""
    try:
        on = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if on else None
    except TypeError:  # torch < 2.4
        if device_type == "cpu":
            return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None


def _autocast_bf16(device_type):
    return _autocast_dtype(device_type) == torch.bfloat16


def _autocast_other(device_type):
    """Autocast on with a dtype other than bfloat16 (float16)."""
    return _autocast_dtype(device_type) not in (None, torch.bfloat16)


def _ptr(t):
    return None if t is None else t.data_ptr()


class _LbView:
    """__cuda_array_interface__ of the C layer's load-balance loss [1] on the device."""

    def __init__(self, ptr):
        self.__cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (ptr, True), "version": 2}


def _cpu_forward(h, ws, x):
    B, N, _ = x.shape
    y = torch.empty_like(x)
    lb = ctypes.c_float()
    w = L.Weights(*[_ptr(t) for t in ws])
    err = L.Error()
    L.check(L.lib().moh_attn_layer_forward(h.ptr, ctypes.byref(w), x.data_ptr(), B, N, y.data_ptr(),
                                           ctypes.byref(lb), ctypes.byref(err)), err)
    return y, torch.tensor(lb.value, dtype=torch.float32)


def _cuda_weights(ws):
    """moh_cuda_weights of the bf16 tensors ws (the router's rows stacked: wg, wg_0, wg_1)."""
    router = [t for t in ws[4:] if t is not None]
    w_router = torch.cat(router, 0).contiguous() if router else None
    return L.CudaWeights(_ptr(ws[0]), _ptr(ws[1]), _ptr(ws[2]), _ptr(ws[3]), _ptr(w_router)), w_router


def _cuda_forward(h, ws, x):
    B, N, _ = x.shape
    y = torch.empty_like(x)
    w, keep = _cuda_weights(ws)
    err = L.Error()
    stream = torch.cuda.current_stream(x.device).cuda_stream
    lib = L.lib()
    L.check(lib.moh_cuda_layer_forward(h.ptr, ctypes.byref(w), x.data_ptr(), B, N, y.data_ptr(),
                                       ctypes.c_void_p(stream), ctypes.byref(err)), err)
    p = lib.moh_cuda_layer_lb_device(h.ptr)
    if p:
        lb = torch.as_tensor(_LbView(p), device=x.device).clone().reshape(())
    else:
        lb = torch.zeros((), dtype=torch.float32, device=x.device)
    del keep  # the forward's stream order keeps w_router alive long enough: torch's allocator is stream-ordered
    return y, lb


class _MoHAttentionFn(torch.autograd.Function):
    """y, l_aux = f(x, w_qkv, b_qkv, w_o, b_o, wg, wg_0, wg_1) on moh's kernels (None: absent)."""

    @staticmethod
    def forward(ctx, pool, bf16, x, *ws):
        cuda = x.is_cuda
        B, N, _ = x.shape
        h = pool.take(B, N, cuda, bf16)
        y, lb = (_cuda_forward if cuda else _cpu_forward)(h, ws, x)
        ctx.pool, ctx.h = pool, h
        ctx.present = [t is not None for t in ws]
        ctx.save_for_backward(x, *[t for t in ws if t is not None])
        return y, lb

    @staticmethod
    def backward(ctx, dy, dlb):
        if torch.is_grad_enabled():  # create_graph=True: the gradients would be constants, silently
            raise RuntimeError("moh MoHAttention: double backward (create_graph=True, e.g. a gradient penalty) is "
                               "not supported; use the official module for it")
        h, ctx.h = ctx.h, None
        if h is None:
            raise RuntimeError("moh MoHAttention: a second backward through one forward (retain_graph) is not "
                               "supported")
        saved = list(ctx.saved_tensors)
        x = saved.pop(0)
        ws = [saved.pop(0) if p else None for p in ctx.present]
        lb_scale = 0.0 if dlb is None else float(dlb)
        dy = dy.contiguous()
        err = L.Error()
        lib = L.lib()
        if h.cuda:
            dx = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
            g = [None if t is None else torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in ws]
            w, keep = _cuda_weights(ws)
            g_router = None if keep is None else torch.zeros(keep.shape, dtype=torch.float32, device=x.device)
            gw = L.CudaWeights(_ptr(g[0]), _ptr(g[1]), _ptr(g[2]), _ptr(g[3]), _ptr(g_router))
            stream = torch.cuda.current_stream(x.device).cuda_stream
            L.check(lib.moh_cuda_layer_backward(h.ptr, ctypes.byref(w), ctypes.byref(gw), dy.data_ptr(), lb_scale,
                                                dx.data_ptr(), ctypes.c_void_p(stream), ctypes.byref(err)), err)
            if g_router is not None:
                rows = [t.shape[0] if t is not None else 0 for t in ws[4:]]
                parts = torch.split(g_router, [r for r in rows if r], 0)
                it = iter(parts)
                g[4:] = [next(it) if r else None for r in rows]
            dx = dx.to(x.dtype)
            g = [None if t is None else t.to(ws[i].dtype) for i, t in enumerate(g)]
        else:
            dx = torch.zeros_like(x)
            g = [None if t is None else torch.zeros_like(t) for t in ws]
            w = L.Weights(*[_ptr(t) for t in ws])
            gw = L.Weights(*[_ptr(t) for t in g])
            L.check(lib.moh_attn_layer_backward(h.ptr, ctypes.byref(w), ctypes.byref(gw), dy.data_ptr(), lb_scale,
                                                dx.data_ptr(), ctypes.byref(err)), err)
        ctx.pool.give(h)
        return (None, None, dx, *g)


class MoHAttention(nn.Module):
    """The official MoHAttention (MoH-DiT/models.py) on moh's kernels; see the module docstring.

    dim: C; num_heads: h; head_dim: d (default C / h); shared_head: h_s, always-on heads;
    routed_head: the top-k of the E = h - h_s routed heads each token takes; qkv_bias: bias of qkv.
    qk_norm, attn_drop, proj_drop, norm_layer: as the official module (qk_norm and attn_drop > 0
    refused)."""

    LOAD_BALANCING_LOSSES = []

    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_norm=False, attn_drop=0., proj_drop=0.,
                 norm_layer=nn.LayerNorm, shared_head=0, routed_head=0, head_dim=None):
        super().__init__()
        if qk_norm:
            raise ValueError("moh MoHAttention: qk_norm=True is not supported (moh's kernels have no per-head "
                             "q/k normalisation); use the official module")
        _check_args(dim, num_heads, head_dim, shared_head, routed_head, attn_drop)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.scale = self.head_dim ** -0.5
        self.shared_head, self.routed_head = shared_head, routed_head
        # parameters in the official module's order of creation (the same seed gives the same init)
        self.qkv = nn.Linear(dim, self.head_dim * num_heads * 3, bias=qkv_bias)
        self.q_norm = nn.Identity()
        self.k_norm = nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)  # its p must be 0 while training (checked in forward)
        self.proj = nn.Linear(self.head_dim * num_heads, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        if routed_head > 0:
            self.wg = nn.Linear(dim, num_heads - shared_head, bias=False)
            if shared_head > 0:
                self.wg_0 = nn.Linear(dim, 2, bias=False)
        if shared_head > 1:
            self.wg_1 = nn.Linear(dim, shared_head, bias=False)
        self.dim = dim
        hd, E = self.head_dim * num_heads, num_heads - shared_head
        self._shapes = ((3 * hd, dim), (3 * hd,), (dim, hd), (dim,), (E, dim), (2, dim), (shared_head, dim))
        self._pool = _Pool(_config(dim, num_heads, self.head_dim, shared_head, routed_head, qkv_bias))

    def _weights(self):
        """The seven tensors (None where absent), each checked against its shape; the router's Linear
        layers must have no bias (the official ones have none, moh's kernels add none)."""
        get = lambda name, attr: getattr(getattr(self, name), attr) if hasattr(self, name) else None
        for r in ("wg", "wg_0", "wg_1"):
            if get(r, "bias") is not None:
                raise ValueError(f"moh MoHAttention: {r} has a bias, expected bias=False (as the official module)")
        ws = [self.qkv.weight, self.qkv.bias, self.proj.weight, self.proj.bias, get("wg", "weight"),
              get("wg_0", "weight"), get("wg_1", "weight")]
        for name, t, shape in zip(_NAMES, ws, self._shapes):
            if t is not None and tuple(t.shape) != shape:
                raise ValueError(f"moh MoHAttention: {name} has shape {tuple(t.shape)}, expected {shape}")
        return ws

    def forward(self, x):
        if x.dim() != 3 or x.shape[-1] != self.dim or x.shape[0] < 1 or x.shape[1] < 1:
            raise ValueError(f"moh MoHAttention: x has shape {tuple(x.shape)}, expected [B, N, {self.dim}] with "
                             "B, N >= 1")
        p = self.attn_drop.p
        if self.training and p != 0:
            raise ValueError(f"moh MoHAttention: attn_drop={p} while training is not supported (moh's kernels "
                             "apply no attention dropout); use attn_drop=0")
        ws = self._weights()
        if x.is_cuda:
            if x.dtype == torch.float32 and _autocast_bf16("cuda"):
                dt = torch.bfloat16
            elif x.dtype == torch.bfloat16:
                dt = torch.bfloat16
            else:
                raise ValueError(f"moh MoHAttention: CUDA tensors of dtype {x.dtype}"
                                 f"{' under autocast to another dtype' if _autocast_other('cuda') else ''}: moh's CUDA kernels take "
                                 "bfloat16 (x in bfloat16, or float32 under torch.autocast(dtype=torch.bfloat16))")
            out_dtype = torch.bfloat16 if dt == torch.bfloat16 and x.dtype == torch.float32 else x.dtype
        elif x.device.type == "cpu":
            if x.dtype not in (torch.float32, torch.bfloat16):
                raise ValueError(f"moh MoHAttention: CPU tensors of dtype {x.dtype}: expected float32 or bfloat16")
            # float32 buffers; bf16 compute for bf16 tensors and under CPU autocast to bf16
            if _autocast_other("cpu"):
                raise ValueError("moh MoHAttention: torch.autocast('cpu') to a dtype other than bfloat16: moh's CPU "
                                 "kernels compute float32 or bfloat16")
            autocast = _autocast_bf16("cpu")
            dt = torch.float32
            out_dtype = torch.bfloat16 if autocast else x.dtype
        else:
            raise ValueError(f"moh MoHAttention: device {x.device}: expected cpu or cuda")
        for name, t in zip(_NAMES, ws):
            if t is not None and t.device != x.device:
                raise ValueError(f"moh MoHAttention: weight {name} on {t.device}, x on {x.device}")
        bf16 = dt == torch.bfloat16 or out_dtype == torch.bfloat16
        xs = x.to(dt).contiguous()
        ws = [None if t is None else t.to(dt).contiguous() for t in ws]
        if torch.is_grad_enabled() and (xs.requires_grad or any(t is not None and t.requires_grad for t in ws)):
            y, lb = _MoHAttentionFn.apply(self._pool, bf16, xs, *ws)
        else:  # inference: no state kept for a backward
            h = self._pool.take(xs.shape[0], xs.shape[1], xs.is_cuda, bf16)
            with torch.no_grad():
                y, lb = (_cuda_forward if xs.is_cuda else _cpu_forward)(h, ws, xs)
            self._pool.give(h)
        if self.training and self.routed_head > 0:  # float32, as the official l_aux
            getattr(self, "_lb_owner", MoHAttention).LOAD_BALANCING_LOSSES.append(lb)
        return self.proj_drop(y.to(out_dtype))


def swap_official(model):
    """Replaces, in place, every official MoH attention module inside model (MoH-DiT's
    `MoHAttention`, or any module with its attributes: qkv, proj, num_heads, head_dim,
    shared_head, routed_head) by a moh MoHAttention holding the same weights, on the same device
    and dtype, in the same training mode; in training each appends its l_aux to the class list the
    replaced module used (`type(m).LOAD_BALANCING_LOSSES`), so the training script reads it where it
    did. Returns model and the number of modules replaced (a model
    that is itself such a module is returned replaced). qk_norm modules (q_norm not an Identity) are
    refused with a ValueError, as the constructor refuses them."""

    def official(m):
        return (not isinstance(m, MoHAttention) and all(hasattr(m, a) for a in (
            "qkv", "proj", "num_heads", "head_dim", "shared_head", "routed_head")))

    def convert(m):
        if not isinstance(getattr(m, "q_norm", nn.Identity()), nn.Identity):
            raise ValueError(f"moh swap_official: {type(m).__name__} has qk_norm (q_norm is "
                             f"{type(m.q_norm).__name__}); moh's kernels have no per-head q/k normalisation")
        drop = getattr(m, "attn_drop", None)
        new = MoHAttention(m.qkv.in_features, m.num_heads, qkv_bias=m.qkv.bias is not None,
                           attn_drop=drop.p if isinstance(drop, nn.Dropout) else 0.0,
                           proj_drop=m.proj_drop.p if isinstance(getattr(m, "proj_drop", None), nn.Dropout) else 0.0,
                           shared_head=m.shared_head, routed_head=m.routed_head, head_dim=m.head_dim)
        new.load_state_dict(m.state_dict())
        if isinstance(getattr(type(m), "LOAD_BALANCING_LOSSES", None), list):
            new._lb_owner = type(m)  # l_aux goes where the training script reads it
        w = m.qkv.weight
        return new.to(device=w.device, dtype=w.dtype).train(m.training)

    if official(model):
        return convert(model), 1
    count = 0
    for name, child in list(model.named_children()):
        if official(child):
            setattr(model, name, convert(child))
            count += 1
        else:
            count += swap_official(child)[1]
    return model, count
