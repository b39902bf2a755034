# dev/bench_torch.py: the PyTorch peer of `./tp -e d6 -b 8 -t 256 -x 12` (README, bf16: "Against PyTorch"), for
# measuring side by side; PyTorch is not a dependency of tp: install it in a virtual environment to run this.
# python3 dev/bench_torch.py fp32|bf16  (bf16: autocast). GPT-2 layout (pre-LN, tied embeddings, tanh GELU,
# scaled_dot_product_attention), tp's d6 (L6 C384 H6) with the embedded corpus's vocab 353, random tokens,
# AdamW 0.9/0.95, clip 1, 2 threads: the median ms and tokens/s of steps 3-12.
import sys, time, math, torch, torch.nn as nn, torch.nn.functional as F
torch.set_num_threads(2)
L, C, H, V, T, B = 6, 384, 6, 353, 256, 8
dtype = sys.argv[1] if len(sys.argv) > 1 else "fp32"
class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1 = nn.LayerNorm(C); s.qkv = nn.Linear(C, 3 * C); s.proj = nn.Linear(C, C)
        s.ln2 = nn.LayerNorm(C); s.fc = nn.Linear(C, 4 * C); s.fcproj = nn.Linear(4 * C, C)
    def forward(s, x):
        q, k, v = s.qkv(s.ln1(x)).split(C, dim=2)
        q, k, v = [t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v)]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + s.proj(y)
        return x + s.fcproj(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(1024, C)
        s.blocks = nn.ModuleList([Block() for _ in range(L)]); s.lnf = nn.LayerNorm(C)
        for n, p in s.named_parameters():
            if p.dim() == 2: nn.init.normal_(p, 0, 0.02 / math.sqrt(2 * L) if n.endswith("proj.weight") else 0.02)
            elif n.endswith("bias") and "ln" not in n: nn.init.zeros_(p)
    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(T))
        for b in s.blocks: x = b(x)
        logits = s.lnf(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V).float(), tgt.view(-1))
torch.manual_seed(0)
m = GPT()
opt = torch.optim.AdamW(m.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.0)
times = []
for step in range(12):
    idx = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T))
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
        loss = m(idx, tgt)
    opt.zero_grad(set_to_none=True); loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step()
    times.append(time.perf_counter() - t0)
med = sorted(times[2:])[len(times[2:]) // 2]
print(f"pytorch {torch.__version__} {dtype}: median {med*1e3:.0f} ms per step, {B*T/med:.0f} tokens/s (steps 3-12), loss {loss.item():.3f}")
