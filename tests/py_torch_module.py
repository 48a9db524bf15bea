"""moh.torch.MoHAttention against the official module (tools/ref/official_moh.py) on the same
weights and inputs: forward, l_aux and every gradient, official state_dicts loading unchanged, the
training/eval behaviour of LOAD_BALANCING_LOSSES, bf16 on the CPU, two forwards before one backward,
copies of the module, and the refusals. CUDA against the CPU where a GPU is present.
Run by CTest with MOH_LIB (this build's libmoh.so) and PYTHONPATH=python; exit 77 without torch."""
import copy
import io
import os
import pickle
import sys

try:
    import torch
except ImportError:
    print("skipped: this Python has no torch (Debian: python3-torch)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "ref"))
from official_moh import OfficialMoHAttention  # noqa: E402

from moh.torch import MoHAttention  # noqa: E402

failures = 0
checks = 0


def check(ok, what):
    global failures, checks
    checks += 1
    if not ok:
        failures += 1
        print("FAIL:", what)


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def routing_margin(ref, x):
    """Smallest gap, over tokens, between the k-th and (k+1)-th routing score (0: a tie)."""
    if ref.routed_head == 0 or ref.routed_head == ref.num_heads - ref.shared_head:
        return 1.0
    p = torch.softmax(x.reshape(-1, x.shape[-1]).double() @ ref.wg.weight.double().t(), dim=1)
    s = p.sort(dim=1, descending=True).values
    return float((s[:, ref.routed_head - 1] - s[:, ref.routed_head]).min().detach())


def case(name, dim, heads, shared, routed, qkv_bias=True, head_dim=None, B=2, N=37, seed=0):
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = OfficialMoHAttention(dim, heads, qkv_bias=qkv_bias, shared_head=shared, routed_head=routed,
                               head_dim=head_dim)
    with torch.no_grad():  # random, not zero, biases
        for p in ref.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    mine = MoHAttention(dim, heads, qkv_bias=qkv_bias, shared_head=shared, routed_head=routed, head_dim=head_dim)
    check(sorted(ref.state_dict()) == sorted(mine.state_dict()), f"{name}: state_dict keys "
          f"{sorted(ref.state_dict())} vs {sorted(mine.state_dict())}")
    mine.load_state_dict(ref.state_dict())  # strict: the official checkpoint loads unchanged
    x = torch.randn(B, N, dim, generator=gen)
    while routing_margin(ref, x) < 1e-4:
        x = torch.randn(B, N, dim, generator=gen)
    dy = torch.randn(B, N, dim, generator=gen)
    beta = 0.37

    ref64 = copy.deepcopy(ref).double().train()
    x64 = x.double().requires_grad_()
    OfficialMoHAttention.LOAD_BALANCING_LOSSES.clear()
    y64 = ref64(x64)
    lb64 = OfficialMoHAttention.LOAD_BALANCING_LOSSES[0] if routed > 0 else torch.zeros((), dtype=torch.float64)
    ((y64 * dy.double()).sum() + beta * lb64).backward()

    mine.train()
    xs = x.clone().requires_grad_()
    MoHAttention.LOAD_BALANCING_LOSSES.clear()
    y = mine(xs)
    check(len(MoHAttention.LOAD_BALANCING_LOSSES) == (1 if routed > 0 else 0),
          f"{name}: {len(MoHAttention.LOAD_BALANCING_LOSSES)} load-balance terms appended in training")
    lb = MoHAttention.LOAD_BALANCING_LOSSES[0] if routed > 0 else torch.zeros(())
    ((y * dy).sum() + beta * lb).backward()

    tol = 2e-4
    e = rel_err(y, y64)
    check(e < tol, f"{name}: forward rel err {e:.2e}")
    if routed > 0:
        e = abs(float(lb) - float(lb64)) / max(abs(float(lb64)), 1e-12)
        check(e < 1e-5, f"{name}: l_aux {float(lb)} vs {float(lb64)}")
    e = rel_err(xs.grad, x64.grad)
    check(e < tol, f"{name}: dx rel err {e:.2e}")
    ref_params = dict(ref64.named_parameters())
    for pname, p in mine.named_parameters():
        e = rel_err(p.grad, ref_params[pname].grad)
        check(e < tol, f"{name}: d{pname} rel err {e:.2e}")

    if routed > 0 and routed < heads - shared:  # l_aux's own gradient (small beside y's in the sum above)
        OfficialMoHAttention.LOAD_BALANCING_LOSSES.clear()
        ref64(x64)
        g64 = torch.autograd.grad(OfficialMoHAttention.LOAD_BALANCING_LOSSES[0], ref64.wg.weight)[0]
        MoHAttention.LOAD_BALANCING_LOSSES.clear()
        mine(x.clone().requires_grad_())
        g = torch.autograd.grad(MoHAttention.LOAD_BALANCING_LOSSES[0], mine.wg.weight)[0]
        e = rel_err(g, g64)
        check(e < 1e-4 and float(g64.abs().max()) > 1e-3, f"{name}: d l_aux / d wg rel err {e:.2e}")

    # eval: no load-balance term, same output
    mine.eval()
    MoHAttention.LOAD_BALANCING_LOSSES.clear()
    with torch.no_grad():
        ye = mine(x)
    check(not MoHAttention.LOAD_BALANCING_LOSSES, f"{name}: eval appended a load-balance term")
    check(rel_err(ye, y64) < tol, f"{name}: eval forward")
    print(f"{name}: y {rel_err(y, y64):.1e}  dx {rel_err(xs.grad, x64.grad):.1e}  "
          f"grads max {max(rel_err(p.grad, ref_params[n].grad) for n, p in mine.named_parameters()):.1e}")
    return ref, mine, x, dy


# configurations: MoH with wg, wg_0, wg_1; one shared head; no shared head; shared only (top-k 0);
# dense; no qkv bias; a head_dim other than dim / heads
case("moh h8 s2 k3", 64, 8, 2, 3)
case("moh h6 s1 k2", 48, 6, 1, 2, seed=1)
case("moh h4 s0 k2", 32, 4, 0, 2, seed=2, N=50)
case("shared only h4", 32, 4, 4, 0, seed=3)
case("dense", 32, 4, 0, 0, seed=4)
case("no qkv bias", 64, 8, 2, 4, qkv_bias=False, seed=5, B=1, N=65)
ref, mine, x, dy = case("head_dim 12", 64, 4, 1, 2, head_dim=12, seed=6)

# bf16 on the CPU: computed in float32, bf16 in and out
mb = copy.deepcopy(mine).to(torch.bfloat16).eval()
with torch.no_grad():
    yb = mb(x.to(torch.bfloat16))
    yf = mine.eval()(x)
check(yb.dtype == torch.bfloat16, f"bf16 output dtype {yb.dtype}")
check(rel_err(yb, yf) < 3e-2, f"bf16 forward rel err {rel_err(yb, yf):.2e}")

# two forwards before one backward: each keeps its own state
mine.train()
for p in mine.parameters():
    p.grad = None
x1, x2 = x.clone().requires_grad_(), (x * 0.5 + 0.1).requires_grad_()
((mine(x1) * dy).sum() + (mine(x2) * dy).sum()).backward()
g_two = {n: p.grad.clone() for n, p in mine.named_parameters()}
for p in mine.parameters():
    p.grad = None
(mine(x1.detach()) * dy).sum().backward()
(mine(x2.detach()) * dy).sum().backward()
for n, p in mine.named_parameters():
    check(rel_err(g_two[n], p.grad) < 1e-5, f"two forwards: d{n}")

# copies: deepcopy and pickling give working modules with their own kernels' state
mc = copy.deepcopy(mine)
buf = io.BytesIO()
torch.save(mine, buf)
buf.seek(0)
try:
    mp = torch.load(buf, weights_only=False)
except TypeError:  # torch < 2.4 has no weights_only argument
    buf.seek(0)
    mp = torch.load(buf)
mq = pickle.loads(pickle.dumps(mine))
with torch.no_grad():
    y0 = mine.eval()(x)
    for m, what in ((mc, "deepcopy"), (mp, "torch.save/load"), (mq, "pickle")):
        check(rel_err(m.eval()(x), y0) == 0, f"{what}: output differs")

# swap_official: an official module inside a model replaced with the same weights and results
from moh.torch import swap_official  # noqa: E402

torch.manual_seed(11)
net = torch.nn.Sequential(torch.nn.Linear(64, 64),
                          torch.nn.ModuleDict({"attn": OfficialMoHAttention(64, 8, qkv_bias=True, shared_head=2,
                                                                            routed_head=3)}))
net.eval()
xin = torch.randn(2, 9, 64)
with torch.no_grad():
    want = net[1]["attn"](net[0](xin))
    net, n_swapped = swap_official(net)
    got = net[1]["attn"](net[0](xin))
check(n_swapped == 1 and isinstance(net[1]["attn"], MoHAttention), f"swap_official replaced {n_swapped}")
check(rel_err(got, want) < 1e-5, f"swap_official: output rel err {rel_err(got, want):.2e}")
check(not net[1]["attn"].training, "swap_official kept eval mode")
OfficialMoHAttention.LOAD_BALANCING_LOSSES.clear()
MoHAttention.LOAD_BALANCING_LOSSES.clear()
net.train()
net[1]["attn"](net[0](torch.randn(2, 9, 64)))
check(len(OfficialMoHAttention.LOAD_BALANCING_LOSSES) == 1 and not MoHAttention.LOAD_BALANCING_LOSSES,
      "swap_official: l_aux goes to the replaced class's list")
check(len(copy.deepcopy(net)[1]["attn"].__dict__.get("_lb_owner").LOAD_BALANCING_LOSSES) == 1,
      "swap_official: a deepcopy keeps the class list")

# refusals, each naming the reason
def refused(fn, words, what):
    try:
        fn()
    except ValueError as e:
        check(all(w in str(e) for w in words), f"{what}: message {e!r} lacks {words}")
        return
    check(False, f"{what}: not refused")


refused(lambda: MoHAttention(64, 8, qk_norm=True), ["qk_norm"], "qk_norm")
refused(lambda: MoHAttention(64, 8, shared_head=2, routed_head=7), ["routed_head", "top-k"], "top-k above the routed heads")
mt = MoHAttention(64, 4, shared_head=1, routed_head=2, head_dim=12)
refused(lambda: mt(torch.randn(2, 5, 63)), ["shape", "64"], "wrong width")
refused(lambda: mt(torch.randn(5, 64)), ["shape"], "2-d input")
refused(lambda: mt(torch.randn(1, 5, 64, dtype=torch.float64)), ["float64"], "float64")
refused(lambda: MoHAttention(64, 4, attn_drop=0.1, shared_head=1, routed_head=2).train()(torch.randn(1, 3, 64)),
        ["attn_drop"], "attention dropout in training")

refused(lambda: MoHAttention(64, 0), ["num_heads"], "no heads")
refused(lambda: MoHAttention(3, 4), ["head_dim"], "dim below heads")
refused(lambda: MoHAttention(32, 4, routed_head=2 ** 32 + 1), ["routed_head"], "routed_head past int range")
refused(lambda: MoHAttention(32, 4, shared_head=5, routed_head=1), ["shared_head"], "shared_head above heads")
refused(lambda: MoHAttention(32, 4, shared_head=2, routed_head=0), ["routed_head=0", "shared_head"],
        "shared heads without routing")
refused(lambda: MoHAttention(32, 4, attn_drop=1.5), ["attn_drop"], "attn_drop outside [0, 1]")
refused(lambda: mt(torch.randn(0, 5, 64)), ["shape", "B, N >= 1"], "empty batch")


def with_weight(name, make):
    m = MoHAttention(64, 4, qkv_bias=True, shared_head=1, routed_head=2, head_dim=12)
    mod, attr = name.split(".")
    setattr(getattr(m, mod), attr, make())
    return m


refused(lambda: with_weight("qkv.weight", lambda: torch.nn.Parameter(torch.randn(3, 64)))(torch.randn(1, 5, 64)),
        ["qkv.weight", "(3, 64)", "(144, 64)"], "misshapen qkv.weight")
refused(lambda: with_weight("proj.bias", lambda: torch.nn.Parameter(torch.randn(1)))(torch.randn(1, 5, 64)),
        ["proj.bias", "(64,)"], "misshapen proj.bias")
refused(lambda: with_weight("wg.bias", lambda: torch.nn.Parameter(torch.randn(3)))(torch.randn(1, 5, 64)),
        ["wg", "bias"], "a bias on wg")
import warnings  # noqa: E402

from moh.torch import _autocast_other  # noqa: E402

try:  # torch < 2 has CPU autocast to bfloat16 only (it raises at entry for float16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=torch.float16):
            if _autocast_other("cpu"):
                refused(lambda: mt(torch.randn(1, 5, 64)), ["autocast", "bfloat16"], "CPU autocast to float16")
except RuntimeError as e:
    print("CPU autocast to float16: not in this torch:", str(e).splitlines()[0])
try:  # double backward: refused, not silently constant
    xg = torch.randn(1, 5, 64, requires_grad=True)
    gx, = torch.autograd.grad(mt.train()(xg).sum(), xg, create_graph=True)
    check(False, "create_graph: not refused")
except RuntimeError as e:
    check("double backward" in str(e), f"create_graph: message {e!r}")

# CUDA against the CPU (bf16), where a GPU is present
if torch.cuda.is_available():
    from moh import _lib

    why = (b"\0" * 256)
    if _lib.lib().moh_cuda_available(why, 256):
        ref, mine, x, dy = case("cuda reference", 256, 4, 1, 2, seed=7, N=128)
        mg = copy.deepcopy(mine).cuda().to(torch.bfloat16).train()
        xg = x.cuda().to(torch.bfloat16).requires_grad_()
        MoHAttention.LOAD_BALANCING_LOSSES.clear()
        yg = mg(xg)
        (yg.float() * dy.cuda()).sum().backward()
        mine.train()
        xc = x.clone().requires_grad_()
        yc = mine(xc)
        (yc * dy).sum().backward()
        check(rel_err(yg.cpu(), yc) < 3e-2, f"cuda forward rel err {rel_err(yg.cpu(), yc):.2e}")
        check(rel_err(xg.grad.cpu(), xc.grad) < 5e-2, f"cuda dx rel err {rel_err(xg.grad.cpu(), xc.grad):.2e}")
        for (n, p), (_, q) in zip(mg.named_parameters(), mine.named_parameters()):
            check(rel_err(p.grad.cpu(), q.grad) < 5e-2, f"cuda d{n} rel err {rel_err(p.grad.cpu(), q.grad):.2e}")
    else:
        print("cuda: torch sees a GPU, libmoh.so does not:", why.rstrip(b"\0").decode())

print(f"{checks - failures}/{checks} checks passed")
sys.exit(1 if failures else 0)
