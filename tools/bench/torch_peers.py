"""PyTorch peers of moh's benchmarks (shared by attention_vs_torch.py and train_vs_torch.py).

OfficialMoHAttention re-implements the MoH attention module of the official code
(SkyworkAI/MoH, MoH-DiT/models.py `MoHAttention`, the timm-style module its ViT and DiT use),
operation for operation: router softmax over wg(x), top-k one-hot mask, gates renormalised over the
chosen heads (clamped by eps) times top_k; qkv projection; EVERY head attended (timm's fused path:
F.scaled_dot_product_attention; or the explicit q k^T softmax path with fused=False); the head
outputs scaled by the gates (einsum "bne,bned->bned"), shared heads by 2 softmax(wg_0) and
h_s softmax(wg_1); proj. The load-balance term of training is the official one,
E^2 mean(mean_t p * mean_t mask). Options the official module lacks, for the LM peer only: causal
masking and rotary embeddings given by the caller (LLaMA layout), split q/k/v/o weights.
No code is copied; the structure follows the published module.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


def moh_router_gates(x2, wg, wg_0, wg_1, shared, top_k):
    """Official router on x2 [T, C]: returns gates [T, h_s + E] (shared first) and l_aux."""
    logits = wg(x2)
    gates = F.softmax(logits, dim=1)
    E = gates.shape[1]
    _, idx = torch.topk(gates, k=top_k, dim=1)
    mask = F.one_hot(idx, num_classes=E).sum(dim=1)
    me = gates.mean(dim=0)
    ce = mask.float().mean(dim=0)
    l_aux = torch.mean(me * ce) * E * E
    routed = gates * mask
    denom = torch.clamp(routed.sum(dim=1, keepdim=True), min=torch.finfo(routed.dtype).eps)
    routed = routed / denom * top_k
    if shared == 0:
        return routed, l_aux
    if shared > 1:
        sg = F.softmax(wg_1(x2), dim=1) * shared
    else:
        sg = torch.ones(x2.shape[0], 1, dtype=x2.dtype, device=x2.device)
    w0 = F.softmax(wg_0(x2), dim=1) * 2
    sg = w0[:, 0:1] * sg
    routed = w0[:, 1:2] * routed
    return torch.cat([sg, routed], dim=1), l_aux


class OfficialMoHAttention(nn.Module):
    """MoH attention as the official module computes it: every head, then gated (see the module
    docstring). x [B, N, C] -> y [B, N, C]; the last load-balance term in self.l_aux."""

    def __init__(self, dim, num_heads, shared_head, routed_head, qkv_bias=True, fused=True):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.fused = fused
        self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.shared_head, self.routed_head = shared_head, routed_head
        self.wg = nn.Linear(dim, num_heads - shared_head, bias=False) if routed_head > 0 else None
        self.wg_0 = nn.Linear(dim, 2, bias=False) if routed_head > 0 and shared_head > 0 else None
        self.wg_1 = nn.Linear(dim, shared_head, bias=False) if shared_head > 1 else None
        self.l_aux = None

    def forward(self, x):
        B, N, C = x.shape
        x2 = x.reshape(B * N, C)
        if self.routed_head > 0:
            gates, self.l_aux = moh_router_gates(x2, self.wg, self.wg_0, self.wg_1, self.shared_head,
                                                 self.routed_head)
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if self.fused:
            o = F.scaled_dot_product_attention(q, k, v)
        else:
            att = (q * self.scale) @ k.transpose(-2, -1)
            o = att.softmax(dim=-1) @ v
        o = o.transpose(1, 2)  # [B, N, h, d]
        if self.routed_head > 0:
            o = torch.einsum("bne,bned->bned", gates.reshape(B, N, -1), o)
        return self.proj(o.reshape(B, N, C))


def dense_attention(dim, num_heads, qkv_bias=True):
    """The dense peer: timm-style attention (qkv, F.scaled_dot_product_attention, proj)."""
    return OfficialMoHAttention(dim, num_heads, 0, 0, qkv_bias=qkv_bias, fused=True)


def moh_llama(config, shared, top_k, lb_coef):
    """transformers LlamaForCausalLM whose attention layers are the official MoH module with
    LLaMA's split q/k/v/o projections, RoPE and causal SDPA (as MoH-LLaMA3's
    LlamaSdpaAttention, with the learned router of MoH-DiT/ViT). Returns (model, loss_fn) where
    loss_fn(ce) = ce + lb_coef * mean over layers of l_aux."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama import modeling_llama as ml

    class MoHLlamaAttention(ml.LlamaAttention):
        def __init__(self, cfg, layer_idx):
            super().__init__(cfg, layer_idx)
            C, h = cfg.hidden_size, cfg.num_attention_heads
            self.nh = h
            self.wg = nn.Linear(C, h - shared, bias=False)
            self.wg_0 = nn.Linear(C, 2, bias=False) if shared > 0 else None
            self.wg_1 = nn.Linear(C, shared, bias=False) if shared > 1 else None
            self.l_aux = None

        def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
            B, N, C = hidden_states.shape
            gates, self.l_aux = moh_router_gates(hidden_states.reshape(B * N, C), self.wg, self.wg_0,
                                                 self.wg_1, shared, top_k)
            shp = (B, N, -1, self.head_dim)
            q = self.q_proj(hidden_states).view(shp).transpose(1, 2)
            k = self.k_proj(hidden_states).view(shp).transpose(1, 2)
            v = self.v_proj(hidden_states).view(shp).transpose(1, 2)
            cos, sin = position_embeddings
            q, k = ml.apply_rotary_pos_emb(q, k, cos, sin)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2)  # [B, N, h, d]
            o = torch.einsum("bne,bned->bned", gates.reshape(B, N, -1), o)
            return self.o_proj(o.reshape(B, N, -1)), None

    model = LlamaForCausalLM(config)
    layers = model.model.layers
    for i, layer in enumerate(layers):
        layer.self_attn = MoHLlamaAttention(config, i)
    model.apply(model._init_weights)

    def loss_fn(ce):
        aux = torch.stack([layer.self_attn.l_aux for layer in layers]).mean()
        return ce + lb_coef * aux

    return model, loss_fn
