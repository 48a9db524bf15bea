"""Independent PyTorch reference of one MoH attention layer (docs/spec.md sections 1-3, 10).

Written with plain torch ops so that autograd gives every gradient. It is the oracle for the C
engine's `moh layer` command: `tools/ref/gen_layer_fixtures.py` stores fixtures computed with it and
`tools/ref/check_layer.py` compares the C binary against it on random configurations.

Entry points
  moh_layer(cfg, weights, x)           -> {"y", "gates", "lb_loss", ...}  (dtype of x; differentiable)
  reference(cfg, weights, x, dy=None)  -> float64 forward (+ backward of L = sum(y*dy) + beta*lb_loss)
  make_case(cfg, style, B, N, gen)     -> random float32 weights / x / dy for a configuration
  routing_margin(cfg, weights, x)      -> how far every token is from a top-k tie (0 = exact tie)

Configuration (a LAYER.json dict)
  hidden_size C, num_attention_heads h, num_key_value_heads h_kv (default h), head_dim d
  (default C/h), shared_heads h_s, top_k K, router ("learned" | "query_norm" | "none"), causal,
  qkv_bias, proj_bias, rope_theta (absent/null: no RoPE), load_balance_coef beta (default 0).
  For router "none", shared_heads/top_k are ignored (defaults h and 0).

Weights (official module names, no prefix). The style is taken from the weights, not the config:
  fused: qkv.weight [(h + 2 h_kv) d, C] (rows: q heads, k heads, v heads), qkv.bias,
         proj.weight [C, h d], proj.bias
  split: q_proj.weight [h d, C], k_proj.weight [h_kv d, C], v_proj.weight [h_kv d, C],
         o_proj.weight [C, h d], q_proj.bias/k_proj.bias/v_proj.bias, o_proj.bias
  router "learned": wg.weight [E, C] iff K >= 1; wg_0.weight [2, C] iff K >= 1 and h_s >= 1;
                    wg_1.weight [h_s, C] iff h_s >= 2.  (E = h - h_s)
  routers "none", "query_norm": no router weights.
"""

import math

import torch

F32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps, the official clamp (fp32 code)
ROUTERS = ("none", "learned", "query_norm")


# ------------------------------------------------------------------------------------------------
# Configuration and weight layout
# ------------------------------------------------------------------------------------------------
def normalize_config(cfg):
    """Returns a dict with every key filled in (defaults applied) and checks consistency."""
    c = dict(cfg)
    C = int(c["hidden_size"])
    h = int(c["num_attention_heads"])
    h_kv = c.get("num_key_value_heads")
    h_kv = h if h_kv is None else int(h_kv)
    d = c.get("head_dim")
    if d is None:
        if C % h != 0:
            raise ValueError(f"head_dim absent and hidden_size {C} not divisible by heads {h}")
        d = C // h
    d = int(d)
    router = c.get("router", "none")
    if router not in ROUTERS:
        raise ValueError(f"router {router!r} not one of {ROUTERS}")
    if router == "none":  # dense MHA: shared_heads/top_k carry no meaning and are not checked
        h_s = h if c.get("shared_heads") is None else int(c["shared_heads"])
        K = 0 if c.get("top_k") is None else int(c["top_k"])
    else:
        if c.get("shared_heads") is None or c.get("top_k") is None:
            raise ValueError(f"router {router!r} needs shared_heads and top_k")
        h_s = int(c["shared_heads"])
        K = int(c["top_k"])
    theta = c.get("rope_theta")
    theta = None if theta is None else float(theta)
    beta = c.get("load_balance_coef")
    beta = 0.0 if beta is None else float(beta)

    if C < 1 or h < 1 or h_kv < 1 or d < 1:
        raise ValueError("hidden_size, heads, kv heads and head_dim must be >= 1")
    if h % h_kv != 0:
        raise ValueError(f"num_key_value_heads {h_kv} does not divide num_attention_heads {h}")
    if theta is not None and (theta <= 0 or d % 2 != 0):
        raise ValueError(f"RoPE needs rope_theta > 0 and an even head_dim (got {theta}, {d})")
    E = h - h_s
    if router == "learned":
        if not 0 <= h_s <= h:
            raise ValueError(f"shared_heads {h_s} not in [0, {h}]")
        if K == 0 and E != 0:
            raise ValueError("learned router with top_k 0 needs shared_heads == num_attention_heads")
        if K != 0 and not 1 <= K <= E:
            raise ValueError(f"top_k {K} not in [1, E={E}]")
    elif router == "query_norm":
        if not 0 <= h_s <= h - 2:
            raise ValueError(f"query_norm router needs E = h - h_s >= 2 (h={h}, h_s={h_s})")
        if not 1 <= K <= E:
            raise ValueError(f"top_k {K} not in [1, E={E}]")
    return {
        "hidden_size": C, "num_attention_heads": h, "num_key_value_heads": h_kv, "head_dim": d,
        "shared_heads": h_s, "top_k": K, "router": router, "causal": bool(c.get("causal", False)),
        "qkv_bias": bool(c.get("qkv_bias", False)), "proj_bias": bool(c.get("proj_bias", False)),
        "rope_theta": theta, "load_balance_coef": beta,
    }


def weight_style(weights):
    fused = "qkv.weight" in weights
    split = "q_proj.weight" in weights
    if fused == split:
        raise ValueError("weights must hold exactly one of qkv.weight (fused) or q_proj.weight (split)")
    return "fused" if fused else "split"


def weight_shapes(cfg, style):
    """Ordered {name: shape} of every tensor the layer needs (and nothing else)."""
    c = normalize_config(cfg)
    C, h, h_kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    h_s, K = c["shared_heads"], c["top_k"]
    E = h - h_s
    s = {}
    if style == "fused":
        s["qkv.weight"] = (h * d + 2 * h_kv * d, C)
        if c["qkv_bias"]:
            s["qkv.bias"] = (h * d + 2 * h_kv * d,)
        s["proj.weight"] = (C, h * d)
        if c["proj_bias"]:
            s["proj.bias"] = (C,)
    elif style == "split":
        s["q_proj.weight"] = (h * d, C)
        s["k_proj.weight"] = (h_kv * d, C)
        s["v_proj.weight"] = (h_kv * d, C)
        if c["qkv_bias"]:
            s["q_proj.bias"] = (h * d,)
            s["k_proj.bias"] = (h_kv * d,)
            s["v_proj.bias"] = (h_kv * d,)
        s["o_proj.weight"] = (C, h * d)
        if c["proj_bias"]:
            s["o_proj.bias"] = (C,)
    else:
        raise ValueError(f"style {style!r}")
    if c["router"] == "learned":
        if K >= 1:
            s["wg.weight"] = (E, C)
            if h_s >= 1:
                s["wg_0.weight"] = (2, C)
        if h_s >= 2:
            s["wg_1.weight"] = (h_s, C)
    return s


def check_weights(cfg, weights):
    style = weight_style(weights)
    want = weight_shapes(cfg, style)
    missing = [n for n in want if n not in weights]
    extra = [n for n in weights if n not in want]
    if missing or extra:
        raise ValueError(f"weights: missing {missing}, unexpected {extra}")
    for n, shp in want.items():
        if tuple(weights[n].shape) != tuple(shp):
            raise ValueError(f"weight {n}: shape {tuple(weights[n].shape)}, expected {tuple(shp)}")
    return style


# ------------------------------------------------------------------------------------------------
# Building blocks
# ------------------------------------------------------------------------------------------------
def linear(inp, w, b=None):
    out = torch.matmul(inp, w.transpose(0, 1))
    return out if b is None else out + b


def rope_cos_sin(N, d, theta, dtype):
    """cos, sin [N, d] as HF LlamaRotaryEmbedding builds them: inv_freq and the angles
    position * inv_freq are float32 (as in HF), emb = cat(freqs, freqs); cos/sin of those float32
    angles are then evaluated in `dtype`."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    t = torch.arange(N, dtype=inv_freq.dtype)
    freqs = torch.outer(t, inv_freq)  # float32, one rounding per product, like HF
    emb = torch.cat((freqs, freqs), dim=-1).to(dtype)
    return emb.cos(), emb.sin()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def topk_mask(scores, K):
    """0/1 mask (dtype of scores, no gradient) of the K largest entries along the last dim.
    Ties go to the lower index: entry i is selected iff fewer than K entries j beat it, where j
    beats i when s_j > s_i or (s_j == s_i and j < i)."""
    s = scores.detach()
    E = s.shape[-1]
    si = s.unsqueeze(-1)  # [..., E(i), 1]
    sj = s.unsqueeze(-2)  # [..., 1, E(j)]
    idx = torch.arange(E)
    j_lower = idx.view(1, E) < idx.view(E, 1)  # [i, j]: j < i
    beats = (sj > si) | ((sj == si) & j_lower)
    rank = beats.sum(dim=-1)
    return (rank < K).to(scores.dtype)


def load_balance(p, m):
    """E * sum_i P_i f_i over all tokens; p [..., E] differentiable, m [..., E] constant."""
    E = p.shape[-1]
    P = p.reshape(-1, E).mean(dim=0)
    f = m.detach().reshape(-1, E).mean(dim=0)
    return E * (P * f).sum()


# ------------------------------------------------------------------------------------------------
# The layer
# ------------------------------------------------------------------------------------------------
def route(c, W, x, q):
    """Gates [B, N, h] and the load-balance loss (scalar tensor).
    x [B, N, C] is the router input; q [B, N, h, d] the query projection (with bias, before RoPE).
    Also returns the ranking scores [B, N, E] (None when nothing is chosen) for tie diagnostics."""
    B, N, _ = x.shape
    h, h_s, K = c["num_attention_heads"], c["shared_heads"], c["top_k"]
    E = h - h_s
    dt = x.dtype
    zero = torch.zeros((), dtype=dt)
    if c["router"] == "none":
        return torch.ones(B, N, h, dtype=dt), zero, None

    if c["router"] == "query_norm":
        norms = torch.sqrt((q[:, :, h_s:, :] ** 2).sum(dim=-1))  # [B, N, E]
        logits = norms / norms.std(dim=-1, keepdim=True)  # unbiased std, no eps
        p = torch.softmax(logits, dim=-1)
        m = topk_mask(p, K)
        gates = torch.cat([torch.ones(B, N, h_s, dtype=dt), m], dim=-1).detach()
        return gates, load_balance(p, m), logits

    # learned
    if K == 0:  # every head shared: soft reweighting h * softmax(W_s x)
        if h == 1:
            return torch.ones(B, N, 1, dtype=dt), zero, None
        return h * torch.softmax(linear(x, W["wg_1.weight"]), dim=-1), zero, None
    logits = linear(x, W["wg.weight"])  # [B, N, E]
    p = torch.softmax(logits, dim=-1)
    m = topk_mask(p, K)
    pm = p * m
    r = K * pm / torch.clamp(pm.sum(dim=-1, keepdim=True), min=F32_EPS)
    lb = load_balance(p, m)
    if h_s == 0:
        return r, lb, logits
    s = h_s * torch.softmax(linear(x, W["wg_1.weight"]), dim=-1) if h_s >= 2 else \
        torch.ones(B, N, 1, dtype=dt)
    a = 2 * torch.softmax(linear(x, W["wg_0.weight"]), dim=-1)  # [B, N, 2]
    gates = torch.cat([a[..., 0:1] * s, a[..., 1:2] * r], dim=-1)
    return gates, lb, logits


def moh_layer(cfg, weights, x):
    """One MoH attention layer. cfg: LAYER.json dict; weights: {name: tensor} (official names);
    x [B, N, C]. All tensors must share x's dtype. Returns a dict with
      y [B, N, C], gates [B, N, h] (as applied), lb_loss (0-dim),
      route_scores [B, N, E] or None (the quantity top-k ranks: router logits / normalised norms)."""
    c = normalize_config(cfg)
    style = check_weights(c, weights)
    W = weights
    B, N, C = x.shape
    if C != c["hidden_size"]:
        raise ValueError(f"x has C={C}, config hidden_size {c['hidden_size']}")
    h, h_kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]

    if style == "fused":
        qkv = linear(x, W["qkv.weight"], W.get("qkv.bias"))
        q = qkv[..., : h * d]
        k = qkv[..., h * d: (h + h_kv) * d]
        v = qkv[..., (h + h_kv) * d:]
        w_o, b_o = W["proj.weight"], W.get("proj.bias")
    else:
        q = linear(x, W["q_proj.weight"], W.get("q_proj.bias"))
        k = linear(x, W["k_proj.weight"], W.get("k_proj.bias"))
        v = linear(x, W["v_proj.weight"], W.get("v_proj.bias"))
        w_o, b_o = W["o_proj.weight"], W.get("o_proj.bias")
    q = q.reshape(B, N, h, d)
    k = k.reshape(B, N, h_kv, d)
    v = v.reshape(B, N, h_kv, d)

    gates, lb, scores = route(c, W, x, q)

    q = q.permute(0, 2, 1, 3)  # [B, h, N, d]
    k = k.permute(0, 2, 1, 3)  # [B, h_kv, N, d]
    v = v.permute(0, 2, 1, 3)
    if c["rope_theta"] is not None:
        cos, sin = rope_cos_sin(N, d, c["rope_theta"], x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
    kv_of = torch.arange(h) // (h // h_kv)  # query head i -> KV head i // (h / h_kv)
    k = k[:, kv_of]
    v = v[:, kv_of]
    att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)  # [B, h, N, N]
    if c["causal"]:
        future = torch.ones(N, N, dtype=torch.bool).triu(1)
        att = att.masked_fill(future, float("-inf"))
    att = torch.softmax(att, dim=-1)
    o = torch.matmul(att, v).permute(0, 2, 1, 3)  # [B, N, h, d]
    o = o * gates.unsqueeze(-1)
    y = linear(o.reshape(B, N, h * d), w_o, b_o)
    return {"y": y, "gates": gates, "lb_loss": lb, "route_scores": scores}


# ------------------------------------------------------------------------------------------------
# Float64 forward + backward
# ------------------------------------------------------------------------------------------------
def _as_tensor(a, dtype):
    t = a if isinstance(a, torch.Tensor) else torch.as_tensor(a)
    return t.detach().to(dtype).clone()


def reference(cfg, weights, x, dy=None, dtype=torch.float64, layer_fn=None):
    """Runs the layer in `dtype` (float64 by default) on the given (float32-rounded) inputs.
    Returns {name: tensor} with y, gates, lb_loss [1] and, when dy is given, grad.x and
    grad.<weight name> for every weight: the gradients of L = sum(y*dy) + beta*lb_loss.
    layer_fn: alternative implementation with moh_layer's signature (self-tests)."""
    layer_fn = layer_fn or moh_layer
    c = normalize_config(cfg)
    want_grad = dy is not None
    xt = _as_tensor(x, dtype).requires_grad_(want_grad)
    Wt = {n: _as_tensor(w, dtype).requires_grad_(want_grad) for n, w in weights.items()}
    with torch.enable_grad():
        out = layer_fn(cfg, Wt, xt)
        res = {
            "y": out["y"].detach(),
            "gates": out["gates"].detach(),
            "lb_loss": out["lb_loss"].detach().reshape(1),
        }
        if want_grad:
            dyt = _as_tensor(dy, dtype)
            L = (out["y"] * dyt).sum() + c["load_balance_coef"] * out["lb_loss"]
            names = ["x"] + list(Wt)
            leaves = [xt] + [Wt[n] for n in Wt]
            grads = torch.autograd.grad(L, leaves, allow_unused=True)
            for n, leaf, g in zip(names, leaves, grads):
                res["grad." + n] = torch.zeros_like(leaf) if g is None else g.detach()
    return res


def routing_margin(cfg, weights, x, dtype=torch.float64):
    """Smallest distance, over tokens, between the K-th and (K+1)-th ranked routing score,
    relative to max(1, |K-th score|). inf when no top-k choice is made (K == E, no router).
    A small margin means a float32 engine may legitimately pick a different head."""
    c = normalize_config(cfg)
    K = c["top_k"]
    E = c["num_attention_heads"] - c["shared_heads"]
    if c["router"] == "none" or K == 0 or K >= E:
        return math.inf
    with torch.no_grad():
        out = moh_layer(cfg, {n: _as_tensor(w, dtype) for n, w in weights.items()},
                        _as_tensor(x, dtype))
    s = out["route_scores"].reshape(-1, E)
    top = torch.sort(s, dim=-1, descending=True).values
    gap = (top[:, K - 1] - top[:, K]) / torch.clamp(top[:, K - 1].abs(), min=1.0)
    return float(gap.min())


# ------------------------------------------------------------------------------------------------
# Random cases
# ------------------------------------------------------------------------------------------------
def make_case(cfg, style, B, N, gen, router_std=1.5, bias_std=0.5):
    """Random float32 weights, x [B, N, C] and dy [B, N, C] (all N(0, 1) based) from torch.Generator
    gen. Projection weights have std 1/sqrt(fan_in); router weights router_std/sqrt(C) so that the
    router logits have std ~router_std and routing differs across tokens; biases std bias_std."""
    c = normalize_config(cfg)
    C = c["hidden_size"]
    W = {}
    for n, shp in weight_shapes(c, style).items():
        if n.endswith(".bias"):
            std = bias_std
        elif n.startswith("wg"):
            std = router_std / math.sqrt(C)
        else:
            std = 1.0 / math.sqrt(shp[1])
        W[n] = torch.randn(shp, generator=gen, dtype=torch.float32) * std
    x = torch.randn((B, N, C), generator=gen, dtype=torch.float32)
    dy = torch.randn((B, N, C), generator=gen, dtype=torch.float32)
    return W, x, dy
