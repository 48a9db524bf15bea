"""ctypes bindings of libmoh.so's one-layer API (include/moh.h moh_attn_layer_*, include/moh_cuda.h
moh_cuda_layer_*). The library is found at $MOH_LIB, else beside this file (pip install copies it
there), else in the checkout's build/ folder."""
import ctypes
import functools
import os

MOH_ROUTER_NONE, MOH_ROUTER_LEARNED, MOH_ROUTER_QUERY_NORM = 0, 1, 2


class RopeScaling(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("factor", ctypes.c_double), ("low_freq_factor", ctypes.c_double),
                ("high_freq_factor", ctypes.c_double), ("original_max_position_embeddings", ctypes.c_int)]


class AttnConfig(ctypes.Structure):
    """moh_attn_config (include/moh.h), field for field."""
    _fields_ = [("hidden_size", ctypes.c_int), ("n_heads", ctypes.c_int), ("n_kv_heads", ctypes.c_int),
                ("head_dim", ctypes.c_int), ("shared_heads", ctypes.c_int), ("top_k", ctypes.c_int),
                ("router", ctypes.c_int), ("causal", ctypes.c_bool), ("qkv_bias", ctypes.c_bool),
                ("proj_bias", ctypes.c_bool), ("fused_qkv", ctypes.c_bool), ("rope_theta", ctypes.c_double),
                ("rope_scaling", RopeScaling), ("load_balance_coef", ctypes.c_double),
                ("straight_through", ctypes.c_bool)]


class Error(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 1024)]


_P = ctypes.c_void_p
_FP = ctypes.POINTER(ctypes.c_float)


class Weights(ctypes.Structure):
    """moh_attn_weights / moh_attn_grads (same layout: seven pointers)."""
    _fields_ = [(n, _P) for n in ("w_qkv", "b_qkv", "w_o", "b_o", "wg", "wg_0", "wg_1")]


class CudaWeights(ctypes.Structure):
    """moh_cuda_weights / moh_cuda_grads (five pointers)."""
    _fields_ = [(n, _P) for n in ("w_qkv", "b_qkv", "w_o", "b_o", "w_router")]


def _find():
    env = os.environ.get("MOH_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "libmoh.so"), os.path.join(here, "..", "..", "build", "libmoh.so")):
        if os.path.exists(p):
            return os.path.normpath(p)
    raise OSError("moh: libmoh.so not found: set MOH_LIB, pip install ./python, or build the checkout "
                  "(make: build/libmoh.so)")


def _load():
    lib = ctypes.CDLL(_find())
    E = ctypes.POINTER(Error)
    sig = {
        "moh_attn_config_default": (None, [ctypes.POINTER(AttnConfig)]),
        "moh_attn_config_validate": (ctypes.c_int, [ctypes.POINTER(AttnConfig), ctypes.c_char_p, E]),
        "moh_attn_layer_new": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.POINTER(AttnConfig), ctypes.c_int,
                                              ctypes.c_int, E]),
        "moh_attn_layer_free": (None, [_P]),
        "moh_attn_layer_forward": (ctypes.c_int, [_P, ctypes.POINTER(Weights), _P, ctypes.c_int, ctypes.c_int,
                                                  _P, _FP, E]),
        "moh_attn_layer_backward": (ctypes.c_int, [_P, ctypes.POINTER(Weights), ctypes.POINTER(Weights), _P,
                                                   ctypes.c_float, _P, E]),
        "moh_attn_layer_gates": (_FP, [_P]),
        "moh_attn_layer_set_bf16": (ctypes.c_int, [_P, ctypes.c_bool, E]),
        "moh_cuda_available": (ctypes.c_bool, [ctypes.c_char_p, ctypes.c_size_t]),
        "moh_cuda_layer_new": (ctypes.c_int, [ctypes.POINTER(_P), ctypes.POINTER(AttnConfig), ctypes.c_int,
                                              ctypes.c_int, E]),
        "moh_cuda_layer_free": (None, [_P]),
        "moh_cuda_layer_forward": (ctypes.c_int, [_P, ctypes.POINTER(CudaWeights), _P, ctypes.c_int,
                                                  ctypes.c_int, _P, _P, E]),
        "moh_cuda_layer_backward": (ctypes.c_int, [_P, ctypes.POINTER(CudaWeights), ctypes.POINTER(CudaWeights),
                                                   _P, ctypes.c_float, _P, _P, E]),
        "moh_cuda_layer_lb_device": (_P, [_P]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    return lib


@functools.lru_cache(maxsize=None)
def lib():
    """The loaded library (once per process)."""
    return _load()


def check(rc, err):
    """Raises the library's one-line message as the matching Python error when rc != 0."""
    if rc == 0:
        return
    msg = err.msg.decode("utf-8", "replace")
    if rc in (-3, -4, -6):  # MOH_E_CONFIG, MOH_E_SHAPE, MOH_E_ARG
        raise ValueError(msg)
    if rc == -5:
        raise MemoryError(msg)
    raise RuntimeError(msg)
