"""The official MoH attention module, re-implemented operation for operation from its published
source (SkyworkAI/MoH, MoH-DiT/models.py `MoHAttention`): the reference the drop-in module
python/moh/torch.py is checked against (tests/py_torch_module.py) and the peer of its benchmark
(tools/bench/torch_module.py). Same constructor, parameter names and creation order, same forward
(router on x: softmax(wg x), top-k one-hot mask, l_aux = E^2 mean(mean_t p * mean_t mask) appended
to the class list in training, routed gates renormalised (clamped by eps) times k; every head
attended, through F.scaled_dot_product_attention where torch has it (timm's fused path) else
q k^T softmax; shared gates h_s softmax(wg_1 x), both groups scaled by 2 softmax(wg_0 x); proj).
Where MoH-DiT's module would fail (shared_head == 1 with routed heads: wg_1 absent) this follows
MoH-ViT's attention.py (shared gate 1). No code is copied."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class OfficialMoHAttention(nn.Module):
    LOAD_BALANCING_LOSSES = []

    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_norm=False, attn_drop=0., proj_drop=0.,
                 norm_layer=nn.LayerNorm, shared_head=0, routed_head=0, head_dim=None, fused=None):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.scale = self.head_dim ** -0.5
        self.fused = hasattr(F, "scaled_dot_product_attention") if fused is None else fused
        inner = self.head_dim * num_heads
        self.qkv = nn.Linear(dim, 3 * inner, bias=qkv_bias)
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(inner, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        self.shared_head, self.routed_head = shared_head, routed_head
        if routed_head > 0:
            self.wg = nn.Linear(dim, num_heads - shared_head, bias=False)
            if shared_head > 0:
                self.wg_0 = nn.Linear(dim, 2, bias=False)
        if shared_head > 1:
            self.wg_1 = nn.Linear(dim, shared_head, bias=False)

    def _routed_gates(self, x2, B, N):
        p = F.softmax(self.wg(x2), dim=1)
        E = p.shape[1]
        top = torch.topk(p, k=self.routed_head, dim=1).indices
        mask = F.one_hot(top, num_classes=E).sum(dim=1)
        if self.training:
            l_aux = (p.mean(dim=0) * mask.float().mean(dim=0)).mean() * E * E
            type(self).LOAD_BALANCING_LOSSES.append(l_aux)
        g = p * mask
        g = g / torch.clamp(g.sum(dim=1, keepdim=True), min=torch.finfo(g.dtype).eps)
        return g.reshape(B, N, -1) * self.routed_head

    def forward(self, x):
        B, N, C = x.shape
        x2 = x.reshape(B * N, C)
        routed = self._routed_gates(x2, B, N) if self.routed_head > 0 else None
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused:
            o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.)
        else:
            o = self.attn_drop(((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)) @ v
        o = o.transpose(1, 2)  # [B, N, h, d]
        if routed is None and self.shared_head == 0:  # neither: plain multi-head attention
            gates = None
        elif routed is None:
            gates = F.softmax(self.wg_1(x2), dim=1).reshape(B, N, -1) * self.shared_head
        elif self.shared_head == 0:
            gates = routed
        else:
            if self.shared_head > 1:
                sg = F.softmax(self.wg_1(x2), dim=1).reshape(B, N, -1) * self.shared_head
            else:
                sg = torch.ones(B, N, 1, dtype=x.dtype, device=x.device)
            w0 = F.softmax(self.wg_0(x2), dim=1).reshape(B, N, 2) * 2
            gates = torch.cat([w0[:, :, 0:1] * sg, w0[:, :, 1:2] * routed], dim=2)
        if gates is not None:
            o = torch.einsum("bne,bned->bned", gates, o)
        return self.proj_drop(self.proj(o.reshape(B, N, -1)))


class ViTBlock(nn.Module):
    """timm's pre-norm ViT block around any attention module attn of width dim: x + attn(LN x), then
    x + MLP(LN x) with MLP dim -> 4 dim -> dim (GELU), LayerNorm eps 1e-6. The block the swap
    check (vit_swap_train.py) and the benchmark (tools/bench/torch_module.py) put both modules in."""

    def __init__(self, attn, dim):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), attn
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))
