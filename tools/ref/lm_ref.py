"""Independent PyTorch reference of moh's decoder language model (src/models/lm*.{h,c}).

Plain torch ops, any floating dtype (float64 for fixtures), autograd for every gradient. Tensor
names are those of transformers' LlamaForCausalLM (and of moh checkpoints, src/models/lm.c), so
`state_dict()` of this module is exactly a moh `model.safetensors`.

Model (docs/spec.md sections 1, 2, 10):
  embed [V, C] -> L x [ RMSNorm(input_layernorm) -> MoH attention (causal, RoPE rotate-half,
  q_proj/k_proj/v_proj/o_proj without biases, GQA: query head i uses kv head i // (h / h_kv),
  router "learned" or "none") -> residual -> RMSNorm(post_attention_layernorm) -> SwiGLU MLP
  down(silu(gate(x)) * up(x)) -> residual ] -> RMSNorm(model.norm) -> lm_head (tied to the
  embedding when tie_word_embeddings).
  Learned router (reads the normed attention input x), E = h - h_s routed heads h_s..h-1:
    p = softmax(x wg^T); m = top-K mask of p (ties to the lower index, no gradient);
    r = K p m / max(sum p m, finfo(float32).eps);
    h_s >= 2: s = h_s softmax(x wg_1^T); h_s == 1: s = 1 (no wg_1);
    h_s >= 1: a = 2 softmax(x wg_0^T), gates = [a_0 s, a_1 r]; h_s == 0: gates = r.
  Query-norm router (converted pretrained models): scores ||q_i|| / unbiased std over the routed
    heads (q_proj output before RoPE), p = softmax, m = top-K of the norms; gates [1 x h_s, m],
    with straight_through the routed gates are m + m (p - sg(p)) (value m, derivative m dp).
  Head outputs are scaled by their gates before o_proj. Router "none" = dense LLaMA, gates 1.
  Load balance per layer l = E sum_i P_i f_i over the B*T tokens (P = mean p, differentiable;
  f = mean m, constant). Loss = mean cross-entropy over targets >= 0 + load_balance_coef *
  (mean over layers of l); lb is 0 for router "none".

Entry points
  MohLM(cfg)                         the module (cfg: config.json dict); parameters zero-filled
  load_moh_checkpoint(dir, dtype)    MohLM with config.json + model.safetensors of a moh checkpoint
  MohLM.loss(tokens, targets)        (logits [B, T, V], ce, lb, total)
  MohLM.forward(tokens)              (logits, lb, route_scores: list of [B, T, E] per layer or None)
  tensor_shapes(cfg)                 ordered {name: shape} as src/models/lm.c lm_tensors
"""

import json
import math
import os

import torch
from torch import nn

F32_EPS = 1.1920928955078125e-07  # torch.finfo(torch.float32).eps (the official clamp)


# ------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------
def normalize_config(cfg):
    """Fills the defaults moh uses (src/models/lm_config.c) and checks the MoH fields."""
    c = dict(cfg)
    C, h = int(c["hidden_size"]), int(c["num_attention_heads"])
    h_kv = c.get("num_key_value_heads") or h
    d = c.get("head_dim") or C // h
    router = c.get("router", "learned")
    if router not in ("learned", "none", "query_norm"):
        raise ValueError(f"router {router!r}: the language model has 'learned', 'query_norm' or 'none'")
    h_s = int(c.get("shared_heads", 0)) if router != "none" else 0
    K = int(c.get("top_k", 0)) if router != "none" else 0
    out = {
        "hidden_size": C, "num_hidden_layers": int(c["num_hidden_layers"]),
        "num_attention_heads": h, "num_key_value_heads": int(h_kv), "head_dim": int(d),
        "intermediate_size": int(c["intermediate_size"]), "vocab_size": int(c["vocab_size"]),
        "rms_norm_eps": float(c.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(c.get("rope_theta", 10000.0)),
        "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
        "router": router, "shared_heads": h_s, "top_k": K,
        "load_balance_coef": float(c.get("load_balance_coef", 0.01)),
        "straight_through": bool(c.get("straight_through", router == "query_norm")),
    }
    if h % out["num_key_value_heads"]:
        raise ValueError("num_key_value_heads must divide num_attention_heads")
    if router != "none" and not (0 <= h_s < h and 1 <= K <= h - h_s):
        raise ValueError(f"{router} router needs 0 <= shared_heads < h and 1 <= top_k <= h - h_s "
                         f"(h={h}, h_s={h_s}, K={K})")
    return out


def tensor_shapes(cfg):
    """Ordered {name: shape}: the order and shapes of src/models/lm.c lm_tensors."""
    c = normalize_config(cfg)
    C, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    h, h_kv, d, h_s = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"], c["shared_heads"]
    s = {"model.embed_tokens.weight": (V, C)}
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (C,)
        s[p + "self_attn.q_proj.weight"] = (h * d, C)
        s[p + "self_attn.k_proj.weight"] = (h_kv * d, C)
        s[p + "self_attn.v_proj.weight"] = (h_kv * d, C)
        s[p + "self_attn.o_proj.weight"] = (C, h * d)
        if c["router"] == "learned":
            s[p + "self_attn.wg.weight"] = (h - h_s, C)
            if h_s >= 1:
                s[p + "self_attn.wg_0.weight"] = (2, C)
            if h_s >= 2:
                s[p + "self_attn.wg_1.weight"] = (h_s, C)
        s[p + "post_attention_layernorm.weight"] = (C,)
        s[p + "mlp.gate_proj.weight"] = (I, C)
        s[p + "mlp.up_proj.weight"] = (I, C)
        s[p + "mlp.down_proj.weight"] = (C, I)
    s["model.norm.weight"] = (C,)
    if not c["tie_word_embeddings"]:
        s["lm_head.weight"] = (V, C)
    return s


# ------------------------------------------------------------------------------------------------
# Building blocks (weights are nn.Parameter of shape [out, in], y = x W^T)
# ------------------------------------------------------------------------------------------------
def _param(*shape):
    return nn.Parameter(torch.zeros(*shape))


class Linear(nn.Module):
    """Bias-free linear whose only tensor is `weight` [out, in] (HF naming)."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = _param(n_out, n_in)

    def forward(self, x):
        return torch.matmul(x, self.weight.transpose(0, 1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = _param(C)
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + self.eps) * self.weight


def rope_cos_sin(T, d, theta, dtype):
    """cos, sin [T, d] of the rotate-half convention (pairs (i, i + d/2)), angles pos * inv_freq
    with inv_freq_i = theta^(-2i/d), computed in float64 then cast to dtype."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((ang, ang), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def topk_mask(p, K):
    """0/1 mask of the K largest entries of the last dim; ties go to the lower index."""
    p = p.detach()
    E = p.shape[-1]
    # stable descending sort keeps lower indices first among equals
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices[..., :K]
    m = torch.zeros_like(p)
    m.scatter_(-1, order, 1.0)
    return m


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        C, h, h_kv, d = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.c = c
        self.q_proj = Linear(C, h * d)
        self.k_proj = Linear(C, h_kv * d)
        self.v_proj = Linear(C, h_kv * d)
        self.o_proj = Linear(h * d, C)
        if c["router"] == "learned":
            h_s = c["shared_heads"]
            self.wg = Linear(C, h - h_s)
            if h_s >= 1:
                self.wg_0 = Linear(C, 2)
            if h_s >= 2:
                self.wg_1 = Linear(C, h_s)

    def gates(self, x, q):
        """gates [B, T, h], load-balance loss (0-dim), router logits [B, T, E] or None.
        q [B, T, h, d]: the query projection before RoPE (the query-norm router reads it)."""
        c = self.c
        B, T, _ = x.shape
        h, h_s, K = c["num_attention_heads"], c["shared_heads"], c["top_k"]
        if c["router"] == "none":
            return x.new_ones(B, T, h), x.new_zeros(()), None
        if c["router"] == "query_norm":
            # spec §3/§10: logits ||q_i|| / unbiased std over the routed heads, softmax, top-K;
            # binary gates; straight-through: g = m + m (p - sg(p)) (value m, derivative m dp).
            norms = torch.sqrt((q[:, :, h_s:, :] ** 2).sum(dim=-1))
            logits = norms / norms.std(dim=-1, keepdim=True)
            p = torch.softmax(logits, dim=-1)
            m = topk_mask(norms, K)
            g = m + m * (p - p.detach()) if c["straight_through"] else m
            E = p.shape[-1]
            lb = E * (p.reshape(-1, E).mean(dim=0) * m.reshape(-1, E).mean(dim=0)).sum()
            return torch.cat([x.new_ones(B, T, h_s), g], dim=-1), lb, logits
        logits = self.wg(x)
        E = logits.shape[-1]
        p = torch.softmax(logits, dim=-1)
        m = topk_mask(p, K)
        pm = p * m
        r = K * pm / torch.clamp(pm.sum(dim=-1, keepdim=True), min=F32_EPS)
        P = p.reshape(-1, E).mean(dim=0)
        f = m.reshape(-1, E).mean(dim=0)
        lb = E * (P * f).sum()
        if h_s == 0:
            return r, lb, logits
        s = h_s * torch.softmax(self.wg_1(x), dim=-1) if h_s >= 2 else x.new_ones(B, T, 1)
        a = 2 * torch.softmax(self.wg_0(x), dim=-1)
        return torch.cat([a[..., 0:1] * s, a[..., 1:2] * r], dim=-1), lb, logits

    def forward(self, x):
        c = self.c
        B, T, _ = x.shape
        h, h_kv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        q = self.q_proj(x).view(B, T, h, d)
        g, lb, scores = self.gates(x, q)
        q = q.transpose(1, 2)  # [B, h, T, d]
        k = self.k_proj(x).view(B, T, h_kv, d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, h_kv, d).transpose(1, 2)
        cos, sin = rope_cos_sin(T, d, c["rope_theta"], x.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        grp = h // h_kv
        k = k.repeat_interleave(grp, dim=1)  # query head i -> kv head i // grp
        v = v.repeat_interleave(grp, dim=1)
        att = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(d)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = torch.softmax(att.masked_fill(future, float("-inf")), dim=-1)
        o = torch.matmul(att, v).transpose(1, 2)  # [B, T, h, d]
        o = o * g.unsqueeze(-1)
        return self.o_proj(o.reshape(B, T, h * d)), lb, scores


class MLP(nn.Module):
    def __init__(self, C, I):
        super().__init__()
        self.gate_proj = Linear(C, I)
        self.up_proj = Linear(C, I)
        self.down_proj = Linear(I, C)

    def forward(self, x):
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = MLP(c["hidden_size"], c["intermediate_size"])

    def forward(self, x):
        a, lb, scores = self.self_attn(self.input_layernorm(x))
        x = x + a
        return x + self.mlp(self.post_attention_layernorm(x)), lb, scores


class Decoder(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Module()
        self.embed_tokens.weight = _param(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([Block(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class MohLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c = normalize_config(cfg)
        self.model = Decoder(self.c)
        if not self.c["tie_word_embeddings"]:
            self.lm_head = Linear(self.c["hidden_size"], self.c["vocab_size"])

    def head_weight(self):
        return self.model.embed_tokens.weight if self.c["tie_word_embeddings"] else self.lm_head.weight

    def named_tensors(self):
        """{name: parameter} in lm_tensors order (a tied head is not listed)."""
        params = dict(self.named_parameters())
        return {n: params[n] for n in tensor_shapes(self.c)}

    def forward(self, tokens):
        """tokens [B, T] (int64) -> logits [B, T, V], lb (mean over layers; 0 for router none),
        route scores per layer (router logits [B, T, E], None for router none)."""
        x = self.model.embed_tokens.weight[tokens]
        lbs, scores = [], []
        for blk in self.model.layers:
            x, lb, sc = blk(x)
            lbs.append(lb)
            scores.append(sc)
        x = self.model.norm(x)
        logits = torch.matmul(x, self.head_weight().transpose(0, 1))
        lb = torch.stack(lbs).mean() if self.c["router"] != "none" else x.new_zeros(())
        return logits, lb, scores

    def loss(self, tokens, targets):
        """(logits [B, T, V], ce, lb, total): ce = mean cross-entropy over targets >= 0 (a target
        < 0 is ignored), lb = mean over layers of the load-balance loss,
        total = ce + load_balance_coef * lb. All differentiable (lb through P only)."""
        tokens = torch.as_tensor(tokens).long()
        targets = torch.as_tensor(targets).long()
        logits, lb, _ = self(tokens)
        V = logits.shape[-1]
        ce = nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), ignore_index=-1,
                                         reduction="mean")
        total = ce + self.c["load_balance_coef"] * lb
        return logits, ce, lb, total


# ------------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------------
def load_state(model, tensors, strict=True):
    """Copies {name: tensor} into model (converted to its dtype). strict: no missing/extra names."""
    want = tensor_shapes(model.c)
    if strict:
        missing = [n for n in want if n not in tensors]
        extra = [n for n in tensors if n not in want]
        if missing or extra:
            raise ValueError(f"checkpoint: missing {missing}, unexpected {extra}")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, shp in want.items():
            t = tensors[n]
            if tuple(t.shape) != tuple(shp):
                raise ValueError(f"tensor {n}: shape {tuple(t.shape)}, expected {tuple(shp)}")
            params[n].copy_(t.to(params[n].dtype))
    return model


def load_moh_checkpoint(path, dtype=torch.float64):
    """MohLM from a moh checkpoint directory (config.json + model.safetensors), in dtype."""
    from safetensors.torch import load_file

    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    model = MohLM(cfg).to(dtype)
    return load_state(model, load_file(os.path.join(path, "model.safetensors")))


def random_init(model, gen, embed_std=0.5, router_std=1.5, norm_jitter=0.1):
    """Random weights from torch.Generator gen: matrices N(0, 1/fan_in) (embedding N(0, embed_std)),
    router matrices N(0, (router_std)^2 / C) so that routing differs across tokens, norm weights
    1 + N(0, norm_jitter^2). Drawn in float32 (what a checkpoint stores), in lm_tensors order."""
    C = model.c["hidden_size"]
    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, shp in tensor_shapes(model.c).items():
            if len(shp) == 1:
                w = 1 + norm_jitter * torch.randn(shp, generator=gen)
            elif n == "model.embed_tokens.weight":
                w = embed_std * torch.randn(shp, generator=gen)
            elif ".wg" in n:
                w = router_std / math.sqrt(C) * torch.randn(shp, generator=gen)
            else:
                w = torch.randn(shp, generator=gen) / math.sqrt(shp[1])
            params[n].copy_(w.to(params[n].dtype))
    return model


def routing_margin(model, tokens):
    """Smallest gap, over layers and tokens, between the K-th and (K+1)-th router logit (the
    order of p), relative to max(1, |K-th|). inf when no choice is made. A tiny margin means a
    float32 engine may legitimately select another head."""
    c = model.c
    E = c["num_attention_heads"] - c["shared_heads"]
    K = c["top_k"]
    if c["router"] == "none" or K >= E:
        return math.inf
    with torch.no_grad():
        _, _, scores = model(torch.as_tensor(tokens).long())
    best = math.inf
    for s in scores:
        top = torch.sort(s.reshape(-1, E), dim=-1, descending=True).values
        gap = (top[:, K - 1] - top[:, K]) / torch.clamp(top[:, K - 1].abs(), min=1.0)
        best = min(best, float(gap.min()))
    return best
